"""Fenced writes: only the attempt that holds a job's lease can ack, retry, fail or release it."""

import pytest

from django_jobq import leases
from django_jobq.models import DeadLetter, Job
from tests.testapp.jobs import record

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def claimed(queue_cursor):
    record.enqueue("x")
    (job,) = leases.claim(queue_cursor, worker_id="w", limit=1)
    return job


def test_ack_deletes_the_job_once(queue_cursor, claimed):
    assert leases.ack(queue_cursor, claimed.id, claimed.attempt) is True
    assert not Job.objects.exists()
    assert leases.ack(queue_cursor, claimed.id, claimed.attempt) is False


@pytest.mark.parametrize(
    "write",
    [
        lambda cursor, job_id, attempt: leases.ack(cursor, job_id, attempt),
        lambda cursor, job_id, attempt: leases.retry(
            cursor, job_id, attempt, delay=0, error="late"
        ),
        lambda cursor, job_id, attempt: leases.dead_letter(
            cursor, job_id, attempt, reason="failed", error="late"
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
    assert leases.ack(queue_cursor, ready.pk, 0) is False
    assert Job.objects.filter(pk=ready.pk).exists()


def test_retry_makes_the_job_ready_later_and_keeps_its_attempt_count(queue_cursor, claimed):
    assert leases.retry(queue_cursor, claimed.id, claimed.attempt, delay=60, error="E: x")
    job = Job.objects.get()
    assert (job.status, job.attempts, job.last_error, job.worker_id) == ("ready", 1, "E: x", "")
    assert job.lease_deadline is None
    assert leases.claim(queue_cursor, worker_id="w", limit=1) == []  # not due for a minute


def test_dead_letter_moves_the_job_with_its_reason_in_one_statement(queue_cursor, claimed):
    assert leases.dead_letter(
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
    (again,) = leases.claim(queue_cursor, worker_id="w2", limit=1)
    assert again.attempt == 1
