"""The worker, in process: handlers run, and each outcome is recorded as an ack, a retry or
a dead letter. (Real worker processes are tested in tests/acceptance.)"""

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import override_settings
from django.utils import timezone

from django_jobq import claims, job, registry, sql
from django_jobq.models import DeadLetter, Job
from django_jobq.worker import Worker
from tests.conftest import wait_until
from tests.factories import JobFactory
from tests.testapp.jobs import always_fails, hold_lock, inspect_context, overrun, record
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)


def run_burst(**options):
    return Worker(burst=True, poll_interval=0.05, **options).run()


def test_successful_jobs_run_once_and_are_acked():
    for n in range(20):
        record.enqueue(f"e{n}")
    stats = run_burst(concurrency=3, batch_size=4)
    assert sorted(Effect.objects.values_list("label", flat=True)) == sorted(
        f"e{n}" for n in range(20)
    )
    assert not Job.objects.exists()
    assert (stats.claimed, stats.outcome_counts.succeeded) == (20, 20)


def test_a_failing_job_is_retried_after_the_backoff_delay_with_its_error():
    with override_settings(JOBQ={"RETRY_BACKOFF_BASE": 3600, "RETRY_BACKOFF_CAP": 3600}):
        always_fails.enqueue(reason="flaky partner")
        stats = run_burst()
    job = Job.objects.get()
    assert (job.status, job.attempts) == ("ready", 1)
    assert job.last_error == "RuntimeError: flaky partner"
    # Equal jitter: the first retry waits between base/2 and base.
    assert timezone.now() + timedelta(minutes=29) < job.run_at < timezone.now() + timedelta(hours=1)
    assert stats.outcome_counts.retried == 1


def test_the_last_failed_attempt_becomes_a_dead_letter_with_traceback():
    always_fails.using(max_attempts=1).enqueue(reason="poison")
    run_burst()
    assert not Job.objects.exists()
    dead = DeadLetter.objects.get()
    assert (dead.reason, dead.attempts, dead.last_error) == (
        "max attempts exceeded",
        1,
        "RuntimeError: poison",
    )
    assert "raise RuntimeError(reason)" in dead.traceback


def test_a_kind_the_worker_lacks_is_left_ready_for_a_worker_that_has_it():
    waiting = JobFactory(kind="added.in.next.deploy", payload={"x": 1})
    record.enqueue("after")
    stats = run_burst()
    assert Effect.objects.get().label == "after"
    assert (stats.claimed, stats.outcome_counts.dead_lettered) == (1, 0)
    waiting.refresh_from_db()
    assert (waiting.status, waiting.attempts) == (Job.Status.READY, 0)
    assert not DeadLetter.objects.exists()


def removed_in_last_deploy(x: int) -> None:
    """A handler registered only while the test below makes its worker."""


def test_a_claimed_job_whose_handler_is_gone_is_still_dead_lettered_at_once():
    # The safety net: the worker claims only the kinds of its registry, read when it is
    # made; a handler removed from the registry afterwards is refused as an unknown kind.
    JobFactory(kind="removed.in.last.deploy", payload={"x": 1})
    record.enqueue("after")
    with registry.isolated():
        job(name="removed.in.last.deploy")(removed_in_last_deploy)
        worker = Worker(burst=True, poll_interval=0.05)
    stats = worker.run()
    dead = DeadLetter.objects.get()
    assert (dead.kind, dead.reason, dead.payload) == (
        "removed.in.last.deploy",
        "unknown kind",
        {"x": 1},
    )
    assert "no handler is registered" in dead.last_error
    assert Effect.objects.get().label == "after"
    assert stats.outcome_counts.dead_lettered == 1


def test_a_payload_the_handler_cannot_take_is_a_failed_attempt_not_a_crash():
    JobFactory(kind="tests.testapp.jobs.record", payload={"wrong": 1}, max_attempts=1)
    run_burst()
    assert "unexpected keyword argument 'wrong'" in DeadLetter.objects.get().last_error


def test_worker_claims_only_its_queues():
    record.using(queue="mine").enqueue("mine")
    theirs = record.using(queue="theirs").enqueue("theirs")
    run_burst(queues=["mine"])
    assert Effect.objects.get().label == "mine"
    assert list(Job.objects.values_list("pk", flat=True)) == [theirs.pk]


def test_handlers_get_a_fresh_django_connection_after_a_broken_one():
    """close_old_connections() runs around every job, as around a request."""
    record.enqueue("first")
    record.enqueue("second")
    run_burst()
    assert Effect.objects.count() == 2
    assert connection.is_usable()


def test_worker_options_are_validated():
    with pytest.raises(ValueError, match="concurrency"):
        Worker(concurrency=0)
    with pytest.raises(ValueError, match="batch_size"):
        Worker(batch_size=0)
    with pytest.raises(ValueError, match="poll_interval"):
        Worker(poll_interval=0)


def test_a_handler_taking_a_context_sees_its_lease():
    job = inspect_context.using(queue="ctx").enqueue()
    run_burst(queues=["ctx"])
    assert Effect.objects.get().label == (
        f"job {job.pk} attempt 1 tests.testapp.jobs.inspect_context ctx "
        "extended=True moved=True lost=False"
    )


def test_a_worker_with_no_room_to_claim_does_not_ask_when_the_next_job_falls_due(monkeypatch):
    """A worker whose handler threads and prefetch are full cannot claim a job that falls
    due before an outcome frees room, and an outcome wakes its loop: its turns then send no
    statement asking when the next job falls due (``sql.claims.SECONDS_UNTIL_DUE_*``, which
    reads the claim index from its start); with room, a turn that claimed everything due
    still asks."""
    lock_id = 93
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s)", [lock_id])
    asked: list[bool] = []  # per SECONDS_UNTIL_DUE statement: had the worker room to claim?
    turns: list[bool] = []  # per turn: had it room to claim at its end?

    def has_room(worker: Worker) -> bool:
        return worker._capacity - worker._outstanding >= worker._refill_at

    execute_on_queues, turn = Worker._execute_on_queues, Worker._turn

    def execute_and_note(worker: Worker, cursor: Any, statements: Any, params: Any) -> Any:
        if sql.claims.SECONDS_UNTIL_DUE_ANY_QUEUE in statements:
            asked.append(has_room(worker))
        return execute_on_queues(worker, cursor, statements, params)

    def turn_and_note(worker: Worker, connection_: Any) -> Any:
        timeout = turn(worker, connection_)
        turns.append(has_room(worker))
        return timeout

    monkeypatch.setattr(Worker, "_execute_on_queues", execute_and_note)
    monkeypatch.setattr(Worker, "_turn", turn_and_note)
    worker = Worker(queues=["leases"], concurrency=1, batch_size=1, poll_interval=0.05)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_until(lambda: True in asked, what="an idle turn that asks")
        hold_lock.enqueue(lock_id=lock_id, label="holds its thread")
        record.using(queue="leases").enqueue("prefetched")  # room for none after it
        wait_until(lambda: turns[-3:] == [False] * 3, what="turns with no room to claim")
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock_all()")
        wait_until(lambda: Effect.objects.count() == 2, what="both jobs to run")
        worker.stop()
        thread.join(30)
    assert False not in asked


def test_a_job_past_max_runtime_is_no_longer_heartbeated(caplog, queue_cursor):
    """``overrun`` has max_runtime=0.5 s; with a 1 s visibility timeout its lease lapses
    while it still runs, another worker reclaims it, and the first attempt's ack is refused."""
    lock_id = 91
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s)", [lock_id])
    job = overrun.using(visibility_timeout=1).enqueue(lock_id=lock_id)
    # Prefetched behind it, this job fills the worker (concurrency 1 + batch 1), so the worker
    # claims nothing more and "other" is the one to reclaim the lapsed lease.
    record.using(queue="leases").enqueue("prefetched")
    worker = Worker(queues=["leases"], poll_interval=0.05)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_until(
            lambda: Job.objects.filter(pk=job.pk, worker_id=worker.worker_id).exists(),
            what="the worker to claim the job",
        )
        (reclaimed,) = wait_until(
            lambda: claims.claim(queue_cursor, worker_id="other", limit=1, queues=["leases"]),
            what="the overrunning job's lease to lapse",
        )
        assert (reclaimed.id, reclaimed.attempt) == (job.pk, 2)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock_all()")
        worker.stop()
        thread.join(30)
    assert "exceeded max_runtime" in caplog.text
    assert Job.objects.get(pk=job.pk).attempts == 2  # attempt 1's late ack was refused
