"""Fenced writes: only the attempt that holds a job's lease can ack, retry, fail or release it."""

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from django_jobq import claims, leases, outcomes
from django_jobq.models import DeadLetter, Job
from tests.testapp.jobs import record

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def claimed(queue_cursor):
    record.enqueue("x")
    (job,) = claims.claim(queue_cursor, worker_id="w", limit=1)
    return job


def test_ack_deletes_the_job_once(queue_cursor, claimed):
    assert outcomes.ack_in_transaction(queue_cursor, claimed.id, claimed.attempt) is True
    assert not Job.objects.exists()
    assert outcomes.ack_in_transaction(queue_cursor, claimed.id, claimed.attempt) is False


@pytest.mark.parametrize(
    "write",
    [
        lambda cursor, job_id, attempt: outcomes.ack_in_transaction(cursor, job_id, attempt),
        lambda cursor, job_id, attempt: bool(
            outcomes.retry(cursor, job_id, attempt, delay=0, error="late")
        ),
        lambda cursor, job_id, attempt: bool(
            outcomes.dead_letter(cursor, job_id, attempt, reason="failed", error="late")
        ),
        lambda cursor, job_id, attempt: bool(
            leases.release(cursor, [leases.Lease(job_id, attempt)])
        ),
    ],
    ids=["ack", "retry", "dead_letter", "release"],
)
def test_a_stale_attempt_cannot_write(queue_cursor, claimed, write):
    # Attempt 1's lease was lost and attempt 2 holds the job now.
    Job.objects.filter(pk=claimed.id).update(attempts=2, worker_id="second")
    before = Job.objects.values().get(pk=claimed.id)

    assert write(queue_cursor, claimed.id, claimed.attempt) is False

    assert Job.objects.values().get(pk=claimed.id) == before
    assert not DeadLetter.objects.exists()


def test_writes_about_a_job_that_is_not_running_are_refused(queue_cursor):
    ready = record.enqueue("never claimed")
    assert outcomes.ack_in_transaction(queue_cursor, ready.pk, 0) is False
    assert Job.objects.filter(pk=ready.pk).exists()


def test_retry_makes_the_job_ready_later_and_keeps_its_attempt_count(queue_cursor, claimed):
    assert outcomes.retry(queue_cursor, claimed.id, claimed.attempt, delay=60, error="E: x")
    job = Job.objects.get()
    assert (job.status, job.attempts, job.last_error, job.worker_id) == ("ready", 1, "E: x", "")
    assert job.lease_deadline is None
    assert claims.claim(queue_cursor, worker_id="w", limit=1) == []  # not due for a minute


def test_dead_letter_moves_the_job_with_its_reason_in_one_statement(queue_cursor, claimed):
    assert outcomes.dead_letter(
        queue_cursor,
        claimed.id,
        claimed.attempt,
        reason="failed: card declined",
        error="ValueError: declined",
        traceback="Traceback ...",
    )
    assert not Job.objects.exists()
    dead = DeadLetter.objects.get()
    assert (dead.job_id, dead.kind, dead.payload, dead.attempts) == (
        claimed.id,
        claimed.kind,
        {"label": "x"},
        1,
    )
    assert (dead.reason, dead.last_error, dead.traceback) == (
        "failed: card declined",
        "ValueError: declined",
        "Traceback ...",
    )


def test_release_gives_back_the_attempt(queue_cursor, claimed):
    assert leases.release(queue_cursor, [claimed.lease]) == {claimed.id}
    job = Job.objects.get()
    assert (job.status, job.attempts, job.worker_id, job.started_at) == ("ready", 0, "", None)
    (again,) = claims.claim(queue_cursor, worker_id="w2", limit=1)
    assert again.attempt == 1


def expire(job_id):
    """Move a running job's lease deadline into the past, as time passing would."""
    Job.objects.filter(pk=job_id).update(lease_deadline=timezone.now() - timedelta(seconds=1))


def test_heartbeat_extends_to_now_plus_the_visibility_timeout(queue_cursor, claimed):
    Job.objects.filter(pk=claimed.id).update(lease_deadline=timezone.now() + timedelta(seconds=1))
    queue_cursor.execute("SELECT now()")
    (now,) = queue_cursor.fetchone()
    extended = leases.heartbeat(queue_cursor, [claimed.lease])
    assert set(extended) == {claimed.id}
    assert extended[claimed.id] >= now + claimed.visibility_timeout
    assert Job.objects.get().lease_deadline == extended[claimed.id]


def test_heartbeat_is_refused_once_the_deadline_has_passed(queue_cursor, claimed):
    expire(claimed.id)
    assert leases.heartbeat(queue_cursor, [claimed.lease]) == {}


def test_a_lapsed_lease_is_reclaimed_and_consumes_an_attempt(queue_cursor, claimed):
    assert claims.claim(queue_cursor, worker_id="w2", limit=1) == []  # lease still held
    expire(claimed.id)
    (again,) = claims.claim(queue_cursor, worker_id="w2", limit=1)
    assert (again.id, again.attempt) == (claimed.id, 2)
    assert outcomes.ack_in_transaction(queue_cursor, claimed.id, claimed.attempt) is False
    assert outcomes.ack_in_transaction(queue_cursor, again.id, again.attempt) is True


def test_an_ack_after_the_deadline_is_accepted_if_nobody_reclaimed(queue_cursor, claimed):
    expire(claimed.id)
    assert outcomes.ack_in_transaction(queue_cursor, claimed.id, claimed.attempt) is True


def test_reclaims_come_before_ready_jobs_and_share_the_limit(queue_cursor, claimed):
    ready = [record.enqueue(f"r{n}") for n in range(3)]
    expire(claimed.id)
    jobs = claims.claim(queue_cursor, worker_id="w2", limit=2)
    assert {job.id for job in jobs} == {claimed.id, ready[0].pk}


def test_heartbeat_and_reclaim_racing_never_leave_two_live_attempts(connect):
    """Many rounds of a heartbeat and a reclaim fired together at a lease about to lapse.

    Row locks serialise them: if the heartbeat wins, the reclaim finds a live lease and
    skips the row; if the reclaim wins, the heartbeat's fence (attempt) no longer matches.
    Two live attempts would be a successful heartbeat whose new deadline the reclaim
    ignored: a reclaim that started before the heartbeat's deadline.
    """
    heart, thief = connect().cursor(), connect().cursor()
    job = record.using(visibility_timeout=0.05).enqueue("raced")
    outcomes = {"heartbeat won": 0, "reclaim won": 0}
    for _ in range(150):
        (held,) = claims.claim(heart, worker_id="holder", limit=1) or claims.claim(
            thief, worker_id="holder", limit=1
        )
        Job.objects.filter(pk=job.pk).update(worker_id="holder")
        heart.execute("SELECT pg_sleep(0.04)")  # let the deadline draw near
        results: dict[str, Any] = {}
        start = threading.Barrier(2)

        def beat(held=held, results=results, start=start):
            start.wait()
            results["heartbeat"] = leases.heartbeat(heart, [held.lease])

        def steal(results=results, start=start):
            start.wait()
            results["reclaim"] = claims.claim(thief, worker_id="thief", limit=1)

        threads = [threading.Thread(target=beat), threading.Thread(target=steal)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if results["heartbeat"] and results["reclaim"]:
            new_deadline = results["heartbeat"][job.pk]
            started = Job.objects.get(pk=job.pk).started_at
            assert started >= new_deadline, "a reclaim overlapped a live, extended lease"
        outcomes["heartbeat won" if results["heartbeat"] else "reclaim won"] += 1
        # Hand the job back as ready for the next round.
        Job.objects.filter(pk=job.pk).update(status="ready", attempts=0, lease_deadline=None)
    assert sum(outcomes.values()) == 150
