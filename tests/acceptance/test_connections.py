"""Hung, refused and terminated connections, with real worker processes and a TCP proxy
(tests/proxy.py) between a worker and PostgreSQL."""

import signal
import time

import pytest
from django.db import connection

from django_jobq.models import DeadLetter, Job
from django_jobq.worker.worker import SHUTDOWN_SLACK
from tests.conftest import through, wait_until
from tests.testapp.jobs import connections_wait_for_file, hold_lock, record
from tests.testapp.models import Effect

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

LOCK = 151


@pytest.fixture
def lock():
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s)", [LOCK])
    yield
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_unlock_all()")


def running(job_id, worker_id):
    return Job.objects.filter(pk=job_id, status="running", worker_id=worker_id).first()


def waiting_for_lock(lock_id):
    """Whether a session of this database waits for advisory lock ``lock_id``."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            " AND objid = %s AND database = (SELECT oid FROM pg_database"
            " WHERE datname = current_database()))",
            [lock_id],
        )
        return cursor.fetchone()[0]


def stop_within(worker, seconds):
    """SIGTERM ``worker``; return its stderr once it exited, within ``seconds``."""
    worker.send_signal(signal.SIGTERM)
    started = time.monotonic()
    _, stderr = worker.communicate(timeout=60)
    elapsed = time.monotonic() - started
    assert elapsed < seconds, f"exited {elapsed:.1f} s after SIGTERM:\n{stderr}"
    return stderr


def test_a_worker_whose_connection_hangs_gives_its_job_up_within_a_lease_and_exits(
    manage, proxy, lock
):
    """Only the main loop's connection hangs (silently: the proxy stops forwarding it); the
    heartbeat connection works. The heartbeater must stop extending the wedged worker's
    lease, another worker runs the job, and SIGTERM ends the wedged worker in time."""
    visibility_timeout, shutdown_timeout = 1.5, 1.0
    job = hold_lock.using(visibility_timeout=visibility_timeout).enqueue(lock_id=LOCK, label="x")
    wedged = manage(
        "jobq_worker", "--queue", "leases", "--worker-id", "wedged", "--no-scheduler",
        "--poll-interval", "0.2", "--shutdown-timeout", str(shutdown_timeout),
        DATABASE_URL=through(proxy),
    )  # fmt: skip
    # The handler waiting for the lock, not only the job's row: a claim whose reply the
    # freeze held back shows the job running, but the worker never learned it holds it.
    wait_until(lambda: running(job.pk, "wedged"), what="the wedged worker to claim the job")
    wait_until(lambda: waiting_for_lock(LOCK), what="the wedged worker's handler to start")
    proxy.freeze(b"jobq worker wedged")
    frozen_at = time.monotonic()
    other = manage("jobq_worker", "--queue", "leases", "--worker-id", "other", "--no-scheduler")
    # The main loop's next claim hangs: within a third of the lease the heartbeater stops
    # extending, the lease lapses a lease later, and the other worker reclaims the job.
    wait_until(
        lambda: running(job.pk, "other"),
        timeout=0.2 + 2 * visibility_timeout + 5,
        what="another worker to take the wedged worker's job",
    )
    assert time.monotonic() - frozen_at < 0.2 + 2 * visibility_timeout + 5
    stderr = stop_within(wedged, shutdown_timeout + SHUTDOWN_SLACK + 1)
    assert wedged.returncode == 1, stderr  # the job was left running (to its lease)
    assert "main loop has made no progress" in stderr
    other.kill()


def test_sigterm_while_connections_are_refused_exits_within_the_shutdown_timeout(
    manage, proxy, tmp_path
):
    """The database refuses connections long enough for the reconnect backoff to grow; a
    SIGTERM then ends the worker within --shutdown-timeout (not the backoff), and the
    repeated failures are logged with back-off (a line at the start, not one per retry).
    A short poll interval makes the main loop (whose only slot is busy) meet the outage even
    if it was waiting, not in a statement, when it began."""
    done = tmp_path / "done"
    job = connections_wait_for_file.enqueue(path=str(done))
    worker = manage(
        "jobq_worker", "--queue", "connections", "--worker-id", "cut-off", "--no-scheduler",
        "--shutdown-timeout", "0.5", "--poll-interval", "0.1",
        DATABASE_URL=through(proxy),
    )  # fmt: skip
    try:
        # The handler's start, not the job's row: a claim whose commit the worker never heard
        # of (the outage cut its reply) shows the job running, but nothing runs it.
        wait_until(lambda: (tmp_path / "done.started").exists(), what="the handler to start")
        assert running(job.pk, "cut-off")
        proxy.refuse()
        # Main loop and listener each retry with doubling delays: 12 refused attempts are
        # about 6 s into the outage, with delays of 3 s and more.
        wait_until(lambda: proxy.refused >= 12, timeout=30, what="the backoff to grow")
        stderr = stop_within(worker, 0.5 + 2)
    finally:
        done.touch()
    assert worker.returncode == 1, stderr
    assert stderr.count("database error, reconnecting") == 1, stderr
    assert stderr.count("listener connection lost") == 1, stderr
    assert stderr.count("heartbeat failed") <= 1, stderr


def test_terminated_idle_handler_connections_never_cost_an_attempt(manage):
    """With CONN_MAX_AGE=60 and no health checks, handler threads keep their Django
    connections between jobs; each is terminated while idle, between rounds of jobs that
    have a single attempt. None may become a dead letter."""
    worker = manage(
        "jobq_worker", "--concurrency", "2", "--no-scheduler", "--poll-interval", "0.1",
        CONN_MAX_AGE="60",
    )  # fmt: skip
    handler_connections = (
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
        "AND pid <> pg_backend_pid() AND application_name NOT LIKE 'jobq %%' "
        "AND backend_type = 'client backend'"
    )
    for round_ in range(4):
        for n in range(4):
            record.using(max_attempts=1).enqueue(f"round {round_} job {n}")
        wait_until(lambda: not Job.objects.exists(), what="the round's jobs")
        with connection.cursor() as cursor:
            cursor.execute(handler_connections)
            pids = [pid for (pid,) in cursor.fetchall()]
            assert pids, "the worker kept no handler connection"
            cursor.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s) AS pid", [pids])

        def terminated(pids=pids):
            with connection.cursor() as cursor:
                cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", [pids])
                return cursor.fetchone()[0] == 0

        wait_until(terminated, what="the handler connections to be gone")
    stderr = stop_within(worker, 30)
    assert list(DeadLetter.objects.values_list("last_error", flat=True)) == []
    assert Effect.objects.count() == 16, stderr
