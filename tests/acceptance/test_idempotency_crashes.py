"""Idempotent handlers against real crashes: worker processes SIGKILLed or stalled with
SIGSTOP at the worst moment, a real PostgreSQL. Exactly one business effect each time."""

import signal

import pytest
from django.db import connection

from django_jobq.models import DedupKey, Job
from tests.conftest import wait_until
from tests.testapp.jobs import complete_in_transaction, record_once
from tests.testapp.models import Effect

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

LOCK = 5150
TIMEOUT = 60


def waiting_for_advisory_lock():
    with connection.cursor() as cursor:
        cursor.execute(  # this test's database only: the server is shared
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        return cursor.fetchone()[0] == 1


def labels():
    return sorted(Effect.objects.values_list("label", flat=True))


def test_a_stale_attempts_transaction_rolls_back_when_another_attempt_holds_the_lease(manage):
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s)", [LOCK])
    complete_in_transaction.enqueue(label="invoice", lock_id=LOCK)
    stalled = manage("jobq_worker", "--queue", "idempotency")
    # Attempt 1 wrote its effect and now waits, inside its transaction, for our lock.
    wait_until(waiting_for_advisory_lock, what="attempt 1 to wait inside its transaction")
    stalled.send_signal(signal.SIGSTOP)  # its heartbeats stop; its lease will lapse
    try:
        rescuer = manage("jobq_worker", "--queue", "idempotency")
        wait_until(lambda: labels() == ["invoice attempt 2"], what="attempt 2 to commit")
        rescuer.send_signal(signal.SIGTERM)
        rescuer.communicate(timeout=TIMEOUT)
    finally:
        stalled.send_signal(signal.SIGCONT)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_unlock_all()")
    stalled.send_signal(signal.SIGTERM)
    _, stderr = stalled.communicate(timeout=TIMEOUT)

    assert labels() == ["invoice attempt 2"]  # attempt 1's effect was rolled back
    assert not Job.objects.exists()
    assert "lease lost" in stderr


def test_sigkill_right_after_the_handlers_transaction_leaves_nothing_to_redo(manage):
    job = complete_in_transaction.enqueue(label="invoice", crash_after_commit=True)
    worker = manage("jobq_worker", "--queue", "idempotency")
    worker.wait(TIMEOUT)
    assert worker.returncode == -signal.SIGKILL
    # The effect and the ack committed together: no job is left to be redelivered.
    assert labels() == ["invoice attempt 1"]
    assert not Job.objects.filter(pk=job.pk).exists()


def test_redelivery_after_a_crash_before_the_ack_is_a_no_op(manage):
    job = record_once.enqueue(order_id=99, crash_after_commit=True)
    worker = manage("jobq_worker", "--queue", "idempotency")
    worker.wait(TIMEOUT)
    assert worker.returncode == -signal.SIGKILL
    assert Job.objects.get(pk=job.pk).status == "running"  # effect committed, never acked

    # After one visibility timeout another worker gets the job again: attempt 2 is a no-op.
    rescuer = manage("jobq_worker", "--queue", "idempotency")
    wait_until(lambda: not Job.objects.filter(pk=job.pk).exists(), what="the redelivery")
    rescuer.send_signal(signal.SIGTERM)
    rescuer.communicate(timeout=TIMEOUT)
    assert labels() == ["order 99"]
    assert DedupKey.objects.get().key == "order-99"
