"""The job signals: one per recorded outcome, with the kind's definition as sender, and user
receivers that raise never break the worker nor lose an outcome."""

import threading
from contextlib import contextmanager
from typing import Any

import pytest

from django_jobq import signals
from django_jobq.models import DeadLetter, Job
from django_jobq.worker import Worker
from tests.factories import JobFactory
from tests.testapp.jobs import always_fails, give_up, record
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)

ALL = (signals.job_started, signals.job_succeeded, signals.job_failed, signals.job_dead_lettered)
NAMES = {
    signals.job_started: "started",
    signals.job_succeeded: "succeeded",
    signals.job_failed: "failed",
    signals.job_dead_lettered: "dead_lettered",
}


@contextmanager
def receiving(*receivers_by_signal, sender=None):
    """Connect ``(signal, receiver)`` pairs for the block (weak=False: lambdas stay alive)."""
    for signal, receiver in receivers_by_signal:
        signal.connect(receiver, sender=sender, weak=False)
    try:
        yield
    finally:
        for signal, receiver in receivers_by_signal:
            signal.disconnect(receiver, sender=sender)


def run_burst(queue):
    return Worker(queues=[queue], burst=True, poll_interval=0.05).run()


def test_each_outcome_sends_one_signal_with_its_details():
    received = []

    def recorder(signal):
        def receive(sender, job, **kwargs):
            received.append((NAMES[signal], sender, job.kind, job.attempt, kwargs))

        return receive

    queue = "signals"
    record.using(queue=queue).enqueue("ok")
    always_fails.using(queue=queue, max_attempts=2).enqueue(reason="flaky")
    give_up.using(queue=queue).enqueue(reason="no such customer")
    JobFactory(queue=queue, kind="removed.kind")
    with receiving(*((s, recorder(s)) for s in ALL)):
        run_burst(queue)

    by_kind: dict[str, list[tuple[Any, ...]]] = {}
    for name, sender, kind, attempt, kwargs in received:
        by_kind.setdefault(kind, []).append((name, sender, attempt, kwargs))
    (started, succeeded) = by_kind["tests.testapp.jobs.record"]
    assert started == ("started", record, 1, {"signal": signals.job_started})
    assert succeeded[:3] == ("succeeded", record, 1)
    assert set(succeeded[3]) == {"signal", "duration"} and succeeded[3]["duration"] > 0
    (_, failed) = by_kind["tests.testapp.jobs.always_fails"]
    assert failed[:3] == ("failed", always_fails, 1)
    assert failed[3]["error"] == "RuntimeError: flaky"
    assert failed[3]["retry_delay"] > 0
    (_, dead) = by_kind["tests.testapp.jobs.give_up"]
    assert dead[:3] == ("dead_lettered", give_up, 1)
    assert dead[3]["reason"] == "failed: no such customer"
    # A kind this worker lacks is not claimed: it waits for a worker that has it, silently.
    assert "removed.kind" not in by_kind


def test_a_receiver_can_listen_to_one_kind():
    heard = []
    record.using(queue="one-kind").enqueue("mine")
    give_up.using(queue="one-kind").enqueue(reason="not mine")
    with (
        receiving(
            (signals.job_succeeded, lambda sender, job, **kw: heard.append(job.kind)), sender=record
        ),
        receiving(
            (signals.job_dead_lettered, lambda sender, job, **kw: heard.append(job.kind)),
            sender=record,
        ),
    ):
        run_burst("one-kind")
    assert heard == ["tests.testapp.jobs.record"]


def test_job_started_runs_on_the_handler_thread_before_the_handler():
    seen = []

    def on_start(sender, job, **kwargs):
        seen.append((threading.current_thread().name, Effect.objects.count()))

    record.using(queue="started").enqueue("after the signal")
    with receiving((signals.job_started, on_start)):
        run_burst("started")
    ((thread_name, effects_before),) = seen
    assert "-executor-" in thread_name
    assert effects_before == 0
    assert Effect.objects.count() == 1


@pytest.mark.parametrize("error", [RuntimeError("receiver bug"), SystemExit(3)])
def test_raising_receivers_break_nothing_and_lose_no_outcome(error, caplog):
    later = []

    def broken(sender, job, **kwargs):
        raise error

    queue = "broken-receivers"
    record.using(queue=queue).enqueue("one")
    record.using(queue=queue).enqueue("two")
    always_fails.using(queue=queue, max_attempts=1).enqueue()
    connected = [(signal, broken) for signal in ALL]
    connected.append((signals.job_succeeded, lambda sender, job, **kw: later.append(job.id)))
    with receiving(*connected):
        stats = run_burst(queue)

    assert (stats.outcome_counts.succeeded, stats.outcome_counts.dead_lettered) == (2, 1)
    assert not Job.objects.filter(queue=queue).exists()
    assert Effect.objects.count() == 2  # the handlers ran despite job_started's receiver
    assert DeadLetter.objects.get().kind == "tests.testapp.jobs.always_fails"
    if isinstance(error, Exception):
        assert len(later) == 2  # send_robust: the next receiver still ran
    assert "receiver bug" in caplog.text or "a signal receiver failed" in caplog.text
