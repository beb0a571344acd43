"""Async handlers (``async def``) run natively on the worker's event loop, side by side, with
the sync jobs' semantics: retries and dead letters, ``max_runtime`` (the task is cancelled and
its lease released), the context (``aheartbeat``, ``aatomic``), Django's async ORM, signals and
metrics.

Worker tests run a real ``jobq_worker`` process that registers the handlers of
``tests/testapp/async_jobs.py`` (environment ``JOBQ_TEST_ASYNC_JOBS``); the tests enqueue
those kinds by name. In-process tests register handlers of their own in an isolated registry.
"""

import asyncio
import functools
import signal
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.utils import timezone
from opentelemetry import trace
from prometheus_client import REGISTRY

from django_jobq import claims, enqueue, enqueue_many, job, registry, signals
from django_jobq.exceptions import MaxRuntimeExceeded
from django_jobq.models import DeadLetter, Job
from django_jobq.outcomes import Action
from django_jobq.worker import Worker
from django_jobq.worker.executor import execute_async
from django_jobq.worker.held import HeldJob
from tests.conftest import wait_until
from tests.test_tracing import attributes, exporter, named, spans  # noqa: F401 (fixtures)
from tests.testapp.jobs import record
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)

QUEUE = "async"  # tests/testapp/async_jobs.py's


def start_worker(manage, *options):
    """A ``jobq_worker`` process with the async kinds, serving ``async`` (and ``options``)."""
    return manage(
        "jobq_worker",
        "--queue",
        QUEUE,
        "--poll-interval",
        "0.1",
        *options,
        JOBQ_TEST_ASYNC_JOBS="1",
    )


def stop(worker):
    """SIGTERM the worker; return its stderr once it exited cleanly."""
    worker.send_signal(signal.SIGTERM)
    _, stderr = worker.communicate(timeout=60)
    assert worker.returncode == 0, stderr
    return stderr


def most_at_once(intervals):
    """The most ``(start, end)`` intervals open at one instant."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    open_now = most = 0
    for _, step in events:
        open_now += step
        most = max(most, open_now)
    return most


# -- registration --------------------------------------------------------------------------


async def _coroutine_function(label: str) -> None: ...


async def _async_generator(label: str):
    yield label


class _AsyncCallable:
    async def __call__(self, label: str) -> None: ...


def _plain(label: str) -> None: ...


@pytest.mark.parametrize(
    "handler",
    [_coroutine_function, functools.partial(_coroutine_function, label="x"), _AsyncCallable()],
    ids=["async-def", "partial", "async-__call__"],
)
def test_job_registers_an_async_handler_as_async(handler):
    with registry.isolated():
        definition = job(name="async_tests.handler")(handler)
        assert registry.get("async_tests.handler") is definition
        assert definition.is_async
        assert definition.__dict__["is_async"] is True  # fixed when it was registered
    assert not job(name="async_tests.plain")(_plain).is_async


def _generator(label: str) -> Iterator[str]:
    yield label


class _YieldingCallable:
    def __call__(self, label: str) -> Iterator[str]:
        yield label


@pytest.mark.parametrize(
    "handler",
    [
        _async_generator,
        functools.partial(_async_generator, label="x"),
        _generator,
        _YieldingCallable(),
    ],
    ids=["async-generator", "partial", "generator", "yielding-call"],
)
def test_job_refuses_a_generator_plain_or_async_whose_body_would_never_run(handler):
    with registry.isolated():
        with pytest.raises(TypeError, match="is a generator function"):
            job(name="async_tests.generator")(handler)
        assert registry.get("async_tests.generator") is None


def test_the_async_concurrency_is_checked():
    with pytest.raises(ValueError, match="async_concurrency must be 1 to 10000"):
        Worker(async_concurrency=0)


def test_a_worker_without_async_kinds_has_no_loop_slots():
    with registry.isolated():
        worker = Worker(concurrency=2, async_concurrency=50)
        assert not worker.serves_async
        assert (worker.batch_size, worker._capacity) == (2, 4)
        job(name="async_tests.handler")(_coroutine_function)
        worker = Worker(concurrency=2, async_concurrency=50)
        assert worker.serves_async
        assert (worker.batch_size, worker._capacity) == (52, 104)


# -- in one worker process -------------------------------------------------------------------


def test_a_thousand_async_jobs_overlap_in_one_worker_process_with_default_flags(manage, tmp_path):
    times = tmp_path / "times"
    labels = [f"sleep {n}" for n in range(1000)]
    enqueue_many(
        {
            "kind": "async.sleep",
            "payload": {"path": str(times), "label": label, "seconds": 0.1},
            "queue": QUEUE,
        }
        for label in labels
    )
    worker = start_worker(manage)
    wait_until(lambda: not Job.objects.exists(), timeout=60, what="the 1,000 jobs to be acked")
    stop(worker)

    lines = [line.rsplit(" ", 2) for line in times.read_text().splitlines()]
    assert sorted(label for label, _, _ in lines) == sorted(labels)  # each ran once
    intervals = [(float(start), float(end)) for _, start, end in lines]
    overlap = most_at_once(intervals)
    assert overlap > 50  # the default ASYNC_CONCURRENCY is 100
    assert overlap <= 100
    elapsed = max(end for _, end in intervals) - min(start for start, _ in intervals)
    print(f"1,000 async jobs of 0.1 s: {elapsed:.2f} s from the first start to the last end")


def test_an_async_handler_that_raises_retries_then_dead_letters(manage):
    failing = enqueue("async.fails", {"label": "flaky"}, queue=QUEUE, max_attempts=3)
    worker = start_worker(manage)
    dead = wait_until(
        lambda: DeadLetter.objects.filter(job_id=failing.pk).first(), what="the dead letter"
    )
    stderr = stop(worker)
    assert (dead.attempts, dead.reason) == (3, DeadLetter.Reason.MAX_ATTEMPTS_EXCEEDED)
    assert dead.last_error == "RuntimeError: flaky broke"
    assert 'raise RuntimeError(f"{label} broke")' in dead.traceback
    assert "async_jobs.py" in dead.traceback
    assert "attempt 1/3 failed: RuntimeError: flaky broke" in stderr
    assert "attempt 2/3 failed: RuntimeError: flaky broke" in stderr


def test_an_async_handler_past_max_runtime_is_cancelled_and_its_lease_released(manage):
    # A visibility timeout of 300 s: a lease left to lapse would hold the jobs long past the
    # test's deadline; the cancelled attempts are recorded at once instead.
    retried = enqueue(
        "async.overrun_retried",
        {"label": "retried"},
        queue=QUEUE,
        max_attempts=2,
        visibility_timeout=300,
    )
    final = enqueue(
        "async.overrun_final",
        {"label": "final"},
        queue=QUEUE,
        max_attempts=1,
        visibility_timeout=300,
    )
    started = time.monotonic()
    worker = start_worker(manage)
    dead = wait_until(
        lambda: DeadLetter.objects.filter(job_id=final.pk).first(), what="the final attempt"
    )
    wait_until(
        lambda: Job.objects.filter(pk=retried.pk, status="ready", attempts=1).exists(),
        what="the retried job back to ready",
    )
    assert time.monotonic() - started < 60  # far within the 300 s leases
    stop(worker)

    error = "MaxRuntimeExceeded: max_runtime of 0.3 s exceeded; the task was cancelled"
    assert (dead.attempts, dead.reason, dead.last_error) == (
        1,
        DeadLetter.Reason.MAX_ATTEMPTS_EXCEEDED,
        error,
    )
    retried.refresh_from_db()
    assert (retried.status, retried.attempts, retried.last_error) == ("ready", 1, error)
    assert retried.run_at > timezone.now() + timedelta(minutes=50)  # its backoff: 3600 s
    assert not Effect.objects.exists()  # neither body went on after its await


def test_an_async_handler_with_context_heartbeats_and_commits_its_write_with_the_ack(manage):
    job_row = enqueue("async.context", {"label": "ctx"}, queue=QUEUE, visibility_timeout=300)
    rolled_back = enqueue("async.atomic_fails", {"label": "undone"}, queue=QUEUE, max_attempts=1)
    worker = start_worker(manage)
    wait_until(lambda: not Job.objects.exists(), what="both jobs to end")
    stop(worker)

    assert list(Effect.objects.values_list("label", flat=True)) == [
        f"ctx job {job_row.pk} attempt 1 extended=True moved=True"
    ]
    assert not DeadLetter.objects.filter(job_id=job_row.pk).exists()
    dead = DeadLetter.objects.get(job_id=rolled_back.pk)  # its write rolled back, not acked
    assert dead.last_error == "RuntimeError: undone: failed after its write"


def test_async_orm_signals_and_a_sync_kind_in_one_worker(manage):
    enqueue("async.orm", {"label": "orm"}, queue=QUEUE)
    record.using(queue=QUEUE).enqueue("sync beside async")
    worker = start_worker(manage)
    wait_until(lambda: not Job.objects.exists(), what="both jobs to be acked")
    wait_until(lambda: Effect.objects.count() == 5, what="the effects and the signals' rows")
    stop(worker)

    labels = set(Effect.objects.values_list("label", flat=True))
    assert {"orm", "orm counted 1", "sync beside async"} <= labels
    # The receivers use the sync ORM: they ran in a sync context, in the worker process.
    announced = sorted(label.rsplit(" pid ", 1)[0] for label in labels if " pid " in label)
    assert announced == ["job_started orm", "job_succeeded orm"]


def test_a_running_async_job_is_heartbeated_past_its_visibility_timeout(manage):
    # A lease of 1 s, a job of 2.5 s: without the automatic heartbeats the lease would
    # lapse and a second attempt start.
    enqueue(
        "async.slow",
        {"label": "long", "seconds": 2.5},
        queue=QUEUE,
        visibility_timeout=1,
        max_attempts=1,
    )
    worker = start_worker(manage)
    wait_until(lambda: not Job.objects.exists(), what="the long job to be acked")
    stop(worker)
    assert sorted(Effect.objects.values_list("label", flat=True)) == [
        "long finished attempt 1",
        "long started",
    ]
    assert not DeadLetter.objects.exists()


def enqueue_slow(count, seconds):
    return enqueue_many(
        {
            "kind": "async.slow",
            "payload": {"label": f"slow {n}", "seconds": seconds},
            "queue": QUEUE,
            "visibility_timeout": 300,
        }
        for n in range(count)
    )


def started_labels():
    return sorted(Effect.objects.filter(label__endswith=" started").values_list("label", flat=True))


def test_shutdown_releases_unstarted_async_jobs_and_lets_running_ones_finish(manage):
    jobs = enqueue_slow(5, seconds=2)
    worker = start_worker(manage, "--async-concurrency", "2", "--shutdown-timeout", "30")
    wait_until(lambda: len(started_labels()) == 2, what="two jobs running on the loop")
    assert Job.objects.filter(status="running").count() == 5  # three claimed, waiting
    stop(worker)  # exit 0: the running ones finished

    started = started_labels()
    assert len(started) == 2
    finished = sorted(
        Effect.objects.filter(label__contains="finished").values_list("label", flat=True)
    )
    assert sorted(finished) == [label.replace("started", "finished attempt 1") for label in started]
    released = Job.objects.filter(pk__in=[job.pk for job in jobs])
    assert sorted(released.values_list("status", "attempts")) == [("ready", 0)] * 3


def test_async_jobs_still_running_at_the_shutdown_timeout_are_cancelled(manage):
    enqueue_slow(2, seconds=60)
    worker = start_worker(manage, "--shutdown-timeout", "0.5")
    wait_until(lambda: len(started_labels()) == 2, what="both jobs running")
    worker.send_signal(signal.SIGTERM)
    _, stderr = worker.communicate(timeout=30)
    assert worker.returncode == 1, stderr  # the shutdown timeout passed with jobs running
    assert "cancelled 2 async job(s) still running at shutdown" in stderr
    assert not Effect.objects.filter(label__contains="finished").exists()
    # Their outcomes are not recorded: the leases lapse and other workers run them again.
    assert Job.objects.filter(status="running", attempts=1).count() == 2


# -- in process --------------------------------------------------------------------------------


def test_async_jobs_send_signals_and_count_in_the_metrics():
    queue = "async-metrics"
    seen = []

    async def observed(label: str) -> None:
        busy = REGISTRY.get_sample_value("jobq_worker_threads", {"state": "busy"}) or 0.0
        seen.append((label, busy))
        await asyncio.sleep(0)

    received = []

    def recorder(name):
        def receive(sender, job, **kwargs):
            received.append((name, job.payload["label"]))

        return receive

    receivers = [
        (signals.job_started, recorder("started")),
        (signals.job_succeeded, recorder("succeeded")),
    ]
    with registry.isolated():
        definition = job(name="async_tests.observed", queue=queue)(observed)
        for name in ("a", "b"):
            definition.enqueue(name)
        for signal_, receiver in receivers:
            signal_.connect(receiver, sender=definition, weak=False)
        idle_before = REGISTRY.get_sample_value("jobq_worker_threads", {"state": "idle"}) or 0
        try:
            stats = Worker(
                queues=[queue], burst=True, poll_interval=0.05, async_concurrency=7
            ).run()
        finally:
            for signal_, receiver in receivers:
                signal_.disconnect(receiver, sender=definition)

    assert stats.outcome_counts.succeeded == 2
    assert sorted(label for label, _ in seen) == ["a", "b"]
    assert all(busy >= 1 for _, busy in seen)  # a slot counted busy while each ran
    assert sorted(received) == [
        ("started", "a"),
        ("started", "b"),
        ("succeeded", "a"),
        ("succeeded", "b"),
    ]
    labels = {"queue": queue, "kind": "async_tests.observed"}
    assert REGISTRY.get_sample_value("jobq_jobs_succeeded_total", labels) == 2
    durations = {**labels, "outcome": "succeeded"}
    assert REGISTRY.get_sample_value("jobq_job_duration_seconds_count", durations) == 2
    # The loop's 7 slots were counted idle while the worker ran, and are gone with it.
    assert REGISTRY.get_sample_value("jobq_worker_threads", {"state": "idle"}) == idle_before


def test_each_async_attempt_runs_in_its_own_span(spans):  # noqa: F811 (the fixture)
    seen = []

    async def traced(label: str) -> None:
        before = trace.get_current_span()
        await asyncio.sleep(0.05)  # the other job runs meanwhile, in its own span
        seen.append((label, before, trace.get_current_span()))

    with registry.isolated():
        definition = job(name="async_tests.traced", queue="async-traced")(traced)
        definition.enqueue("a")
        definition.enqueue("b")
        Worker(queues=["async-traced"], burst=True, poll_interval=0.05).run()

    finished = named(spans, "process async_tests.traced")
    assert len(finished) == 2
    assert all(attributes(span)["jobq.outcome"] == "succeeded" for span in finished)
    assert len(seen) == 2
    for _, before, after in seen:
        assert before is after  # the job's span stays current across its awaits
        assert before.get_span_context().span_id in {s.context.span_id for s in finished}
    assert seen[0][1] is not seen[1][1]


def always_extended(held):
    """A heartbeat that always extends (no heartbeater in these tests)."""
    return True


def _claim_one(connect, kind):
    cursor = connect().cursor()
    (claimed,) = claims.claim(cursor, worker_id="async-tests", limit=1, kinds=[kind])
    return HeldJob(claimed)


async def _raises(label: str) -> None:
    await asyncio.sleep(0)
    raise RuntimeError(label)


async def _creates(label: str) -> str:
    await Effect.objects.acreate(label=label)
    return label


async def _outlasts(label: str) -> None:
    await asyncio.sleep(30)
    await Effect.objects.acreate(label=label)


def test_execute_async_returns_the_verdict_and_never_raises(connect):
    with registry.isolated():
        job(name="async_tests.raises", max_attempts=1)(_raises).enqueue("broken")
        job(name="async_tests.creates")(_creates).enqueue("created")
        job(name="async_tests.outlasts", max_runtime=0.05)(_outlasts).enqueue("late")
        failed = async_to_sync(execute_async)(
            _claim_one(connect, "async_tests.raises"), always_extended
        )
        done = async_to_sync(execute_async)(
            _claim_one(connect, "async_tests.creates"), always_extended
        )
        held = _claim_one(connect, "async_tests.outlasts")
        cancelled = async_to_sync(execute_async)(held, always_extended)

    assert failed.action is Action.DEAD_LETTER
    assert isinstance(failed.exception, RuntimeError)
    assert failed.error == "RuntimeError: broken"
    assert (done.action, done.returned) == (Action.ACK, "created")
    assert list(Effect.objects.values_list("label", flat=True)) == ["created"]
    assert cancelled.action is Action.RETRY
    assert isinstance(cancelled.exception, MaxRuntimeExceeded)
    assert held.started is not None
