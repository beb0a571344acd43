"""Exactly one business effect per job, although delivery is at least once."""

import pytest
from django.db import connection, transaction

from django_jobq.idempotency import idempotent
from django_jobq.models import DeadLetter, DedupKey, Job
from django_jobq.worker import Worker
from tests.conftest import run_together
from tests.testapp.jobs import complete_in_transaction, nested_complete, record, record_once
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)


def run_burst():
    return Worker(burst=True, poll_interval=0.05, queues=["idempotency"]).run()


def test_the_same_key_processed_twice_has_one_effect():
    record_once.enqueue(order_id=7)
    record_once.enqueue(order_id=7)  # a second delivery of the same business event
    stats = run_burst()
    assert list(Effect.objects.values_list("label", flat=True)) == ["order 7"]
    assert stats.outcome_counts.succeeded == 2
    assert DedupKey.objects.get().key == "order-7"


def test_a_failure_after_the_effect_rolls_back_effect_and_key_and_the_retry_applies_once():
    record_once.enqueue(order_id=8, fail_after_effect=True)
    run_burst()  # attempt 1 fails inside its transaction; attempt 2 runs at once
    assert list(Effect.objects.values_list("label", flat=True)) == ["order 8"]
    assert DedupKey.objects.count() == 1
    assert not Job.objects.exists()


def test_idempotent_yields_whether_the_key_is_new():
    with transaction.atomic(), idempotent("k", kind="tests") as first:
        assert first is True
    with transaction.atomic(), idempotent("k", kind="tests") as again:
        assert again is False
    with transaction.atomic(), idempotent("k", kind="other namespace") as other:
        assert other is True
    with pytest.raises(RuntimeError), transaction.atomic(), idempotent("rolled", kind="tests"):
        raise RuntimeError
    with transaction.atomic(), idempotent("rolled", kind="tests") as after_rollback:
        assert after_rollback is True


def test_idempotent_outside_a_transaction_is_refused():
    with (
        pytest.raises(RuntimeError, match=r"must run inside transaction\.atomic"),
        idempotent("k", kind="tests"),
    ):
        pass
    assert not DedupKey.objects.exists()


def test_concurrent_holders_of_one_key_get_one_first_time():
    """Five transactions race for one key: the others wait for the first to commit."""

    def hold_key(_):
        with transaction.atomic(), idempotent("race", kind="tests") as first:
            return first

    assert sorted(run_together(5, hold_key)) == [False, False, False, False, True]


def test_complete_in_transaction_commits_effect_and_ack_together():
    complete_in_transaction.enqueue(label="invoice")
    stats = run_burst()
    assert list(Effect.objects.values_list("label", flat=True)) == ["invoice attempt 1"]
    assert not Job.objects.exists()
    assert (stats.outcome_counts.succeeded, stats.outcome_counts.lease_lost) == (1, 0)


def test_ctx_atomic_refuses_to_nest_in_another_transaction():
    nested_complete.enqueue()
    run_burst()
    dead = DeadLetter.objects.get()
    assert "cannot run inside another transaction" in dead.last_error
    assert not Effect.objects.exists()


def test_twenty_concurrent_enqueuers_with_one_key_create_one_job():
    def enqueue_welcome(_):
        with transaction.atomic():
            return record.using(idempotency_key="welcome-42").enqueue("hi").pk

    ids = run_together(20, enqueue_welcome)
    assert len(ids) == 20
    assert len(set(ids)) == 1
    assert Job.objects.count() == 1
    assert connection.is_usable()


def test_idempotent_refuses_keys_postgres_cannot_store():
    for key in ("", "k" * 201, "a\x00b"):
        with pytest.raises(ValueError), transaction.atomic(), idempotent(key, kind="tests"):
            pass
    assert not DedupKey.objects.exists()


def test_no_heartbeat_is_sent_for_a_job_acked_in_its_transaction(caplog):
    """After ctx.atomic() committed, the job row is gone: a heartbeat would be refused and
    the handler told its lease was lost, which is false."""
    complete_in_transaction.using(visibility_timeout=0.3).enqueue(label="x", linger=1.0)
    stats = run_burst()
    assert stats.heartbeats_refused == 0
    assert "lease lost" not in caplog.text
    assert Effect.objects.get().label == "x attempt 1 lease_lost=False"
