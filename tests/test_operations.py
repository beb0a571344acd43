"""Operators' statements: cancel, run now, redrive — set-based, and careful with live jobs."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_jobq import operations
from django_jobq.models import DeadLetter, Job
from tests.factories import DeadLetterFactory, JobFactory

pytestmark = pytest.mark.django_db


def running_job():
    return JobFactory(
        status=Job.Status.RUNNING,
        attempts=1,
        worker_id="host:1",
        lease_deadline=timezone.now() + timedelta(seconds=30),
    )


def test_cancel_deletes_a_ready_job():
    job = JobFactory()
    assert operations.cancel(job.pk) is True
    assert not Job.objects.exists()
    assert operations.cancel(job.pk) is False  # already gone


def test_cancel_refuses_a_running_job_and_leaves_it():
    job = running_job()
    assert operations.cancel(job.pk) is False
    assert Job.objects.get().status == Job.Status.RUNNING


def test_cancel_many_counts_only_the_ready_jobs():
    ready = JobFactory.create_batch(3)
    running = running_job()
    assert operations.cancel_many([job.pk for job in [*ready, running]]) == 3
    assert list(Job.objects.all()) == [running]


def test_run_now_makes_scheduled_ready_jobs_due_keeping_attempts():
    later = timezone.now() + timedelta(hours=1)
    scheduled = JobFactory(run_at=later, attempts=2)
    due = JobFactory(run_at=timezone.now() - timedelta(minutes=1))
    running = JobFactory(
        status=Job.Status.RUNNING, attempts=1, run_at=later, lease_deadline=later, worker_id="w"
    )

    assert operations.run_now([scheduled.pk, due.pk, running.pk]) == 1

    scheduled.refresh_from_db()
    assert scheduled.run_at <= timezone.now()
    assert scheduled.attempts == 2
    running.refresh_from_db()
    assert running.run_at == later


def statements(queries):
    """The captured queries, less savepoint bookkeeping (each batch runs in a savepoint)."""
    return [q for q in queries.captured_queries if "SAVEPOINT" not in q["sql"]]


def test_redrive_of_10000_dead_letters_is_one_statement():
    DeadLetter.objects.bulk_create(DeadLetterFactory.build() for _ in range(10_000))
    ids = list(DeadLetter.objects.values_list("id", flat=True))

    with CaptureQueriesContext(connection) as queries:
        assert operations.redrive(ids) == 10_000

    assert len(statements(queries)) == 1
    assert Job.objects.count() == 10_000
    assert not DeadLetter.objects.exists()


def test_redrive_of_a_queryset_reads_the_ids_then_runs_one_statement_per_batch():
    DeadLetterFactory.create_batch(25, kind="shop.jobs.a")
    DeadLetterFactory(kind="shop.jobs.b")

    with CaptureQueriesContext(connection) as queries:
        created = operations.redrive(DeadLetter.objects.filter(kind="shop.jobs.a"), batch_size=10)

    assert created == 25
    assert len(statements(queries)) == 1 + 3  # the ids, then batches of 10, 10 and 5
    assert list(DeadLetter.objects.values_list("kind", flat=True)) == ["shop.jobs.b"]


def test_redrive_round_trips_the_job_as_a_fresh_one():
    dead = DeadLetterFactory(
        kind="shop.jobs.charge",
        queue="payments",
        payload={"order": 7, "lines": [{"sku": "ä", "qty": 2}], "note": None},
        priority=5,
        attempts=3,
        max_attempts=3,
        visibility_timeout=timedelta(minutes=2),
        idempotency_key="charge-7",
    )

    assert operations.redrive([dead.pk]) == 1

    job = Job.objects.get()
    assert (job.kind, job.queue, job.payload, job.priority) == (
        dead.kind,
        dead.queue,
        dead.payload,
        dead.priority,
    )
    assert (job.max_attempts, job.visibility_timeout, job.idempotency_key) == (
        3,
        timedelta(minutes=2),
        "charge-7",
    )
    assert (job.status, job.attempts, job.expires_at, job.worker_id) == ("ready", 0, None, "")
    assert job.run_at <= timezone.now()


def test_redrive_skips_a_dead_letter_whose_key_a_live_job_holds():
    live = JobFactory(kind="shop.jobs.charge", idempotency_key="charge-7")
    held = DeadLetterFactory(kind="shop.jobs.charge", idempotency_key="charge-7")
    other_kind = DeadLetterFactory(kind="shop.jobs.refund", idempotency_key="charge-7")
    unkeyed = DeadLetterFactory(kind="shop.jobs.charge")

    assert operations.redrive([held.pk, other_kind.pk, unkeyed.pk]) == 2

    assert list(DeadLetter.objects.all()) == [held]
    assert Job.objects.exclude(pk=live.pk).count() == 2


def test_redrive_of_dead_letters_sharing_a_key_redrives_only_the_oldest():
    first, second = DeadLetterFactory.create_batch(2, kind="shop.jobs.x", idempotency_key="k")

    assert operations.redrive([first.pk, second.pk]) == 1

    assert list(DeadLetter.objects.all()) == [second]
    assert Job.objects.get().idempotency_key == "k"
