"""Retries, backoff and the ways a job becomes a dead letter.

See docs/retries-and-dead-letters.md.
"""

from datetime import timedelta

import pytest
from django.test.utils import override_settings
from django.utils import timezone

from django_jobq import claims
from django_jobq.exceptions import Retry
from django_jobq.models import DeadLetter, Job
from django_jobq.operations import cancel
from django_jobq.worker import Worker
from tests.testapp.jobs import (
    broken_backoff,
    call_partner,
    charge_card,
    give_up,
    infinite_backoff,
    poison,
    raise_unprintable,
    raise_unstorable_error,
    record,
    retry_later,
    send_reminder,
)
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)


def run_burst(**options):
    return Worker(burst=True, poll_interval=0.05, **options).run()


def test_a_poison_job_runs_exactly_max_attempts_times_then_dies_once_with_its_traceback():
    job = poison.enqueue("poison run")  # max_attempts=3, retried at once (FixedBackoff(0))
    run_burst()
    assert Effect.objects.filter(label="poison run").count() == 3
    assert not Job.objects.exists()
    dead = DeadLetter.objects.get()
    assert (dead.job_id, dead.reason, dead.attempts, dead.max_attempts) == (
        job.pk,
        "max attempts exceeded",
        3,
        3,
    )
    assert dead.last_error == "RuntimeError: poison"
    assert 'raise RuntimeError("poison")' in dead.traceback


def test_healthy_jobs_keep_flowing_while_a_poison_job_backs_off():
    slow_poison = poison.using(max_attempts=5).enqueue("poison")
    Job.objects.filter(pk=slow_poison.pk).update(priority=10)  # claimed first, every time due
    for n in range(50):
        record.enqueue(f"healthy {n}")
    # One worker, one thread; the poison job is retried in an hour.
    with_hour_backoff = {"RETRY_BACKOFF_BASE": 3600, "RETRY_BACKOFF_CAP": 3600}

    with override_settings(JOBQ=with_hour_backoff):
        Job.objects.filter(pk=slow_poison.pk).update(
            kind="tests.testapp.jobs.always_fails", payload={}
        )
        run_burst(concurrency=1, batch_size=1)
    assert Effect.objects.filter(label__startswith="healthy").count() == 50
    remaining = Job.objects.get()
    assert (remaining.pk, remaining.status, remaining.attempts) == (slow_poison.pk, "ready", 1)
    assert remaining.run_at > timezone.now() + timedelta(minutes=29)


def test_retry_exception_sets_the_delay():
    retry_later.enqueue(delay=7200)
    run_burst()
    job = Job.objects.get()
    assert (job.status, job.attempts) == ("ready", 1)
    assert (
        timezone.now() + timedelta(minutes=119)
        < job.run_at
        < timezone.now() + timedelta(hours=2, minutes=1)
    )
    assert job.last_error == "Retry: retry in 7200 s"
    with pytest.raises(ValueError):
        Retry(delay=-1)


@pytest.mark.parametrize(
    ("enqueue", "reason"),
    [
        (lambda: give_up.enqueue(reason="order was deleted"), "failed: order was deleted"),
        (lambda: charge_card.enqueue(), "failed: card declined"),
        (
            lambda: call_partner.enqueue(failure="bad request"),
            "failed: ValueError: bad request",
        ),
    ],
    ids=["Fail", "PermanentError subclass", "exception outside retry_on"],
)
def test_permanent_failures_dead_letter_at_once(enqueue, reason):
    enqueue()
    run_burst()
    dead = DeadLetter.objects.get()
    assert (dead.reason, dead.attempts) == (reason, 1)
    assert dead.traceback
    assert not Job.objects.exists()


def test_an_exception_listed_in_retry_on_is_retried():
    call_partner.enqueue(failure="network")
    run_burst()
    job = Job.objects.get()
    assert (job.status, job.attempts, job.last_error) == (
        "ready",
        1,
        "ConnectionError: partner unreachable",
    )


def test_a_job_not_started_before_it_expires_is_dead_lettered_unrun():
    late = record.using(expires_at=timezone.now() - timedelta(seconds=1)).enqueue("too late")
    on_time = record.using(expires_at=timezone.now() + timedelta(hours=1)).enqueue("on time")
    run_burst()
    assert list(Effect.objects.values_list("label", flat=True)) == ["on time"]
    dead = DeadLetter.objects.get()
    assert (dead.job_id, dead.reason) == (late.pk, "expired")
    assert on_time.pk != late.pk


def test_expires_after_counts_from_enqueue_on_the_database_clock():
    job = send_reminder.enqueue("x")
    row = Job.objects.get(pk=job.pk)
    assert row.expires_at is not None
    assert row.expires_at - row.created_at == timedelta(minutes=10)


def test_cancel_removes_a_ready_job_but_not_a_running_one(queue_cursor):
    ready = record.enqueue("ready")
    running = record.enqueue("running")
    Job.objects.filter(pk=ready.pk).update(priority=-1)
    (claimed,) = claims.claim(queue_cursor, worker_id="w", limit=1)
    assert claimed.id == running.pk
    assert cancel(running.pk) is False
    assert cancel(ready.pk) is True
    assert cancel(ready.pk) is False  # already gone
    assert list(Job.objects.values_list("pk", flat=True)) == [running.pk]


def test_error_text_postgres_cannot_store_is_made_storable():
    raise_unstorable_error.enqueue(size=100_000)
    run_burst()
    dead = DeadLetter.objects.get()
    assert dead.last_error.startswith("RuntimeError: bad\\x00byte xxx")
    assert len(dead.last_error) < 70_000
    assert dead.last_error.endswith("more characters]")


def test_an_exception_that_cannot_be_printed_is_still_retried():
    raise_unprintable.enqueue()
    run_burst()
    job = Job.objects.get()
    assert (job.status, job.attempts) == ("ready", 1)
    assert job.last_error == "Unprintable (its message could not be formatted)"


@pytest.mark.parametrize("handler", [infinite_backoff, broken_backoff], ids=["inf", "raises"])
def test_a_broken_backoff_policy_falls_back_to_the_default(handler, caplog):
    with override_settings(JOBQ={"RETRY_BACKOFF_BASE": 600, "RETRY_BACKOFF_CAP": 600}):
        handler.enqueue()
        run_burst()
    job = Job.objects.get()
    assert (job.status, job.attempts) == ("ready", 1)
    now = timezone.now()
    assert now + timedelta(minutes=4) < job.run_at < now + timedelta(minutes=11)
    assert "backoff policy" in caplog.text


def test_dead_letters_count_only_attempts_that_ran():
    record.using(expires_at=timezone.now() - timedelta(seconds=1)).enqueue("late")
    run_burst()
    assert sorted(DeadLetter.objects.values_list("reason", "attempts")) == [("expired", 0)]
