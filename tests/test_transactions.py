"""Enqueue joins the caller's transaction: a job exists exactly when the caller's data does."""

import pytest
from django.db import transaction

from django_jobq import claims
from django_jobq.models import Job
from tests.testapp.jobs import record
from tests.testapp.models import Effect


def claim_all(cursor):
    return claims.claim(cursor, worker_id="test", limit=100)


@pytest.mark.django_db(transaction=True)
def test_rolled_back_enqueue_leaves_no_job(queue_cursor):
    with pytest.raises(RuntimeError), transaction.atomic():
        Effect.objects.create(label="order")
        record.enqueue("receipt")
        raise RuntimeError("the view failed after enqueueing")

    assert not Job.objects.exists()
    assert claim_all(queue_cursor) == []


@pytest.mark.django_db(transaction=True)
def test_job_is_invisible_to_workers_until_commit_then_claimable(queue_cursor):
    with transaction.atomic():
        saved = record.enqueue("receipt")
        assert claim_all(queue_cursor) == []  # the worker's connection cannot see it yet
    claimed = claim_all(queue_cursor)
    assert [job.id for job in claimed] == [saved.pk]


@pytest.mark.django_db(transaction=True)
def test_savepoint_rollback_discards_only_the_inner_job(queue_cursor):
    with transaction.atomic():
        kept = record.enqueue("kept")
        with pytest.raises(RuntimeError), transaction.atomic():
            record.enqueue("discarded")
            raise RuntimeError
    assert [job.id for job in claim_all(queue_cursor)] == [kept.pk]


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_caller_in_another_database_defers_the_insert_to_its_commit(queue_cursor):
    with transaction.atomic(using="other"):
        pending = record.enqueue("after other commits")
        assert pending.pk is None
        assert not Job.objects.exists()
    assert pending.pk is not None
    assert [job.id for job in claim_all(queue_cursor)] == [pending.pk]

    with pytest.raises(RuntimeError), transaction.atomic(using="other"):
        record.enqueue("never")
        raise RuntimeError
    assert Job.objects.count() == 1
