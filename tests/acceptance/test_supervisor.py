"""``jobq_worker --processes N``: N real worker processes under one supervisor."""

import os
import signal

import pytest
from django.db import connection

from django_jobq.models import Job
from tests.conftest import wait_until
from tests.testapp.jobs import record, wait_for_lock
from tests.testapp.models import Effect

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

WORKER_TIMEOUT = 60  # seconds; a generous bound so a hung supervisor fails the test


def worker_pids():
    """Pids of the worker processes connected to the test database (from their
    ``application_name``, ``jobq worker host:pid``)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT application_name FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name LIKE 'jobq worker %%'"
        )
        return {int(name.rsplit(":", 1)[1]) for (name,) in cursor.fetchall()}


def test_a_supervisor_runs_n_processes_restarts_a_killed_one_and_stops_them_on_sigterm(manage):
    lock_id = 6161
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s)", [lock_id])  # the handlers block on it
    blocked = [
        wait_for_lock.using(visibility_timeout=2).enqueue(lock_id=lock_id, label=f"b{n}")
        for n in range(4)
    ]
    supervisor = manage(
        "jobq_worker", "--processes", "2", "--concurrency", "1", "--batch-size", "1"
    )
    # Each process holds at most two jobs (one running, one prefetched): four leased jobs
    # mean two processes.
    running = wait_until(
        lambda: (
            (
                pids := {
                    int(w.rsplit(":", 1)[1])
                    for w in Job.objects.filter(status="running").values_list(
                        "worker_id", flat=True
                    )
                }
            )
            and Job.objects.filter(status="running").count() == 4
            and pids
        ),
        what="two worker processes to lease two blocking jobs each",
    )
    assert len(running) == 2
    victim = min(running)
    os.kill(victim, signal.SIGKILL)
    replacement = wait_until(
        lambda: (worker_pids() - running) or None, what="the supervisor to restart the process"
    )
    assert victim not in worker_pids()
    assert len(worker_pids()) == 2
    # The killed process's jobs are reclaimed once their leases lapse (by the replacement:
    # the other process is full).
    wait_until(
        lambda: Job.objects.filter(attempts=2, status="running").count() == 2,
        what="the killed process's jobs to be reclaimed",
    )
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_unlock(%s)", [lock_id])
    wait_until(lambda: not Job.objects.exists(), what="the blocked jobs to finish")
    record.enqueue("after the restart")  # the replacement works like any worker
    wait_until(lambda: Effect.objects.filter(label="after the restart").exists())

    supervisor.send_signal(signal.SIGTERM)
    _, stderr = supervisor.communicate(timeout=WORKER_TIMEOUT)
    assert supervisor.returncode == 0, stderr
    assert sorted(Effect.objects.values_list("label", flat=True)) == sorted(
        ["b0", "b1", "b2", "b3", "after the restart"]
    )
    assert f"(pid {victim}) exited (signal SIGKILL)" in stderr
    assert replacement
    wait_until(lambda: not worker_pids(), what="every worker process to disconnect")
    assert len(blocked) == 4


def test_ctrl_c_to_the_process_group_stops_every_process_gracefully(manage):
    # Ctrl-C (and systemd) signal the whole group: each child gets SIGINT itself and SIGTERM
    # from the supervisor. That is one stop, not "a second signal: exit now".
    lock_id = 6262
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s)", [lock_id])
    for n in range(4):
        wait_for_lock.enqueue(lock_id=lock_id, label=f"g{n}")
    supervisor = manage(
        "jobq_worker",
        "--processes",
        "2",
        "--concurrency",
        "1",
        "--batch-size",
        "1",
        new_session=True,
    )
    # Each process runs one job and holds one prefetched.
    wait_until(
        lambda: Job.objects.filter(status="running").count() == 4,
        what="the two processes to lease two blocking jobs each",
    )
    os.killpg(supervisor.pid, signal.SIGINT)
    # The prefetched jobs are released; the running ones are still blocked and must finish.
    wait_until(lambda: Job.objects.filter(status="ready").count() == 2, what="the release")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_unlock(%s)", [lock_id])
    _, stderr = supervisor.communicate(timeout=WORKER_TIMEOUT)
    assert supervisor.returncode == 0, stderr
    assert "exiting now" not in stderr
    assert Effect.objects.count() == 2
    assert list(Job.objects.values_list("status", "attempts")) == [("ready", 0)] * 2


def test_burst_processes_drain_the_queue_and_the_supervisor_exits_0(manage):
    for n in range(40):
        record.enqueue(f"j{n}")
    supervisor = manage("jobq_worker", "--processes", "2", "--burst")
    _, stderr = supervisor.communicate(timeout=WORKER_TIMEOUT)
    assert supervisor.returncode == 0, stderr
    assert Effect.objects.count() == 40
    assert not Job.objects.exists()
    assert stderr.count("starting: queues=*") == 2


def test_worker_processes_stop_when_their_supervisor_is_killed(manage):
    supervisor = manage("jobq_worker", "--processes", "2")
    children = wait_until(lambda: len(worker_pids()) == 2 and worker_pids())
    supervisor.kill()
    supervisor.communicate(timeout=WORKER_TIMEOUT)
    # Each child got SIGTERM from the kernel (PR_SET_PDEATHSIG) and stopped gracefully.
    wait_until(lambda: not worker_pids(), what="the orphaned workers to exit")
    wait_until(lambda: not any(map(alive, children)), what="the orphaned workers to end")


def alive(pid):
    """Whether process ``pid`` exists and is not a zombie (an orphan's exit may be reaped
    late, or never, by the container's init)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
