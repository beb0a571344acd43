"""Leases survive crashes: real worker processes, SIGKILL and SIGSTOP, a real PostgreSQL.

Each test holds a PostgreSQL advisory lock that the job's handler waits for, so the job is
"running" exactly as long as the test wants, with no sleeps standing in for it.
"""

import signal
import time

import pytest
from django.db import connection

from django_jobq import claims
from django_jobq.models import DeadLetter, Job
from tests.conftest import wait_until
from tests.testapp.jobs import hold_lock, hold_lock_per_attempt
from tests.testapp.models import Effect

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

LOCK = 77
TIMEOUT = 60


@pytest.fixture
def lock():
    """Hold the advisory lock the handler waits on; ``release()`` lets it finish."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s)", [LOCK])

    class Lock:
        def release(self):
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock_all()")

    yield Lock()
    Lock().release()


def db_now():
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def handler_waiting():
    """A handler (of this test's database: the server is shared) waits for ``LOCK``: the job
    has started, beyond being claimed."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
            "AND objid = %s AND database = (SELECT oid FROM pg_database "
            "WHERE datname = current_database())",
            [LOCK],
        )
        return cursor.fetchone()[0] == 1


def running(job_id, attempt=1):
    return Job.objects.filter(pk=job_id, status="running", attempts=attempt).first()


def claim_leases_queue(cursor):
    return claims.claim(cursor, worker_id="reclaimer", limit=1, queues=["leases"])


def test_killed_workers_job_is_reclaimed_after_exactly_one_visibility_timeout(
    manage, lock, queue_cursor
):
    job = hold_lock.using(visibility_timeout=2).enqueue(lock_id=LOCK, label="crash")
    worker = manage("jobq_worker", "--queue", "leases")
    wait_until(lambda: running(job.pk), what="the worker to start the job")
    worker.send_signal(signal.SIGKILL)
    worker.wait(TIMEOUT)
    deadline = Job.objects.get(pk=job.pk).lease_deadline

    # Just before the deadline: the lease still holds, nothing to claim.
    assert deadline is not None
    assert db_now() < deadline
    assert claim_leases_queue(queue_cursor) == []
    # Just after: the job is claimable again, as attempt 2.
    (reclaimed,) = wait_until(lambda: claim_leases_queue(queue_cursor), what="the reclaim")
    assert (reclaimed.id, reclaimed.attempt) == (job.pk, 2)
    started_at = Job.objects.get(pk=job.pk).started_at
    assert started_at is not None and deadline is not None
    assert started_at >= deadline


def test_long_job_is_heartbeated_and_never_reclaimed(manage, lock, queue_cursor):
    visibility_timeout = 1.0
    job = hold_lock.using(visibility_timeout=visibility_timeout).enqueue(lock_id=LOCK, label="long")
    worker = manage("jobq_worker", "--queue", "leases")
    wait_until(lambda: running(job.pk), what="the worker to start the job")
    first_deadline = Job.objects.get(pk=job.pk).lease_deadline

    # A second claimer polls for three visibility timeouts while the job runs.
    polls = 0
    end = time.monotonic() + 3 * visibility_timeout
    while time.monotonic() < end:
        assert claim_leases_queue(queue_cursor) == []
        polls += 1
    assert polls > 10
    lease_deadline = Job.objects.get(pk=job.pk).lease_deadline
    assert lease_deadline is not None and first_deadline is not None
    assert lease_deadline > first_deadline  # heartbeats moved it

    lock.release()
    wait_until(lambda: not Job.objects.filter(pk=job.pk).exists(), what="the ack")
    worker.send_signal(signal.SIGTERM)
    _, stderr = worker.communicate(timeout=TIMEOUT)
    assert worker.returncode == 0, stderr
    assert list(Effect.objects.values_list("label", flat=True)) == ["long attempt 1"]


def test_a_stalled_worker_loses_its_lease_and_its_late_ack_is_refused(manage, lock, queue_cursor):
    job = hold_lock.using(visibility_timeout=1.5).enqueue(lock_id=LOCK, label="stalled")
    worker = manage("jobq_worker", "--queue", "leases")
    wait_until(lambda: running(job.pk), what="the worker to start the job")
    worker.send_signal(signal.SIGSTOP)  # no heartbeats from here on
    try:
        (reclaimed,) = wait_until(lambda: claim_leases_queue(queue_cursor), what="the reclaim")
    finally:
        worker.send_signal(signal.SIGCONT)
    assert reclaimed.attempt == 2

    lock.release()  # the stalled worker's handler now finishes, and tries to ack attempt 1
    wait_until(lambda: Effect.objects.exists(), what="the stalled handler to finish")
    worker.send_signal(signal.SIGTERM)
    _, stderr = worker.communicate(timeout=TIMEOUT)

    assert worker.returncode == 0, stderr
    assert "lease lost" in stderr
    # Attempt 2 (ours) is untouched by attempt 1's late writes.
    row = Job.objects.get(pk=job.pk)
    assert (row.status, row.attempts, row.worker_id) == ("running", 2, "reclaimer")


def test_a_crash_on_the_final_attempt_ends_as_a_dead_letter(manage, lock):
    job = hold_lock.using(visibility_timeout=1, max_attempts=1).enqueue(lock_id=LOCK, label="final")
    worker = manage("jobq_worker", "--queue", "leases")
    wait_until(lambda: running(job.pk), what="the worker to start the job")
    worker.send_signal(signal.SIGKILL)
    worker.wait(TIMEOUT)
    deadline = Job.objects.get(pk=job.pk).lease_deadline
    wait_until(lambda: db_now() > deadline, what="the lease to lapse")

    sweeper = manage("jobq_worker", "--queue", "leases", "--burst")
    _, stderr = sweeper.communicate(timeout=TIMEOUT)

    assert sweeper.returncode == 0, stderr
    assert not Job.objects.exists()
    dead = DeadLetter.objects.get()
    assert (dead.job_id, dead.reason, dead.attempts) == (
        job.pk,
        "lease expired on final attempt",
        1,
    )
    assert not Effect.objects.exists()  # never run a second time


def test_shutdown_timeout_leaves_the_running_job_to_lapse_and_exits_1(manage, lock):
    job = hold_lock.using(visibility_timeout=1).enqueue(lock_id=LOCK, label="slow")
    worker = manage("jobq_worker", "--queue", "leases", "--shutdown-timeout", "0.5")
    # Claimed is not enough: a SIGTERM before a thread takes the job releases it instead.
    wait_until(handler_waiting, what="the handler to start")
    worker.send_signal(signal.SIGTERM)
    _, stderr = worker.communicate(timeout=TIMEOUT)
    assert worker.returncode == 1, stderr
    assert "shutdown timeout" in stderr
    assert running(job.pk)  # still leased by the gone worker, until its lease lapses


def test_a_worker_that_reclaims_its_own_stalled_job_keeps_the_new_attempts_lease(manage):
    """After a stall past the deadline a worker may reclaim the job whose lapsed attempt it
    still runs. When that old attempt ends, the new one must stay leased (heartbeated)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s), pg_advisory_lock(%s)", [LOCK + 1, LOCK + 2])
    job = hold_lock_per_attempt.using(visibility_timeout=1).enqueue(lock_id=LOCK)
    worker = manage(
        "jobq_worker", "--queue", "leases", "--concurrency", "2", "--poll-interval", "0.1"
    )
    wait_until(lambda: running(job.pk), what="attempt 1 to start")
    worker.send_signal(signal.SIGSTOP)
    deadline = Job.objects.get(pk=job.pk).lease_deadline
    wait_until(lambda: db_now() > deadline, what="attempt 1's lease to lapse")
    worker.send_signal(signal.SIGCONT)
    wait_until(lambda: running(job.pk, attempt=2), what="the worker to reclaim its own job")

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_unlock(%s)", [LOCK + 1])  # attempt 1 ends
    wait_until(lambda: Effect.objects.filter(label="attempt 1").exists(), what="attempt 1")
    # For three visibility timeouts attempt 2 keeps its lease: nobody may reclaim it.
    end = time.monotonic() + 3
    while time.monotonic() < end:
        assert running(job.pk, attempt=2), "attempt 2 lost its lease"
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_unlock(%s)", [LOCK + 2])
    wait_until(lambda: not Job.objects.filter(pk=job.pk).exists(), what="attempt 2's ack")
    worker.send_signal(signal.SIGTERM)
    _, stderr = worker.communicate(timeout=TIMEOUT)
    assert worker.returncode == 0, stderr
    assert not DeadLetter.objects.exists()
