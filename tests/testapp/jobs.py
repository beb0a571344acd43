"""Handlers used by the tests (autodiscovered like any app's ``jobs`` module)."""

import os
import signal
import time
from datetime import timedelta

from django.db import connection, transaction

from django_jobq import job
from django_jobq.backoff import FixedBackoff
from django_jobq.context import JobContext
from django_jobq.exceptions import Fail, PermanentError, Retry

from .models import Effect


@job
def record(label: str) -> None:
    """Write one Effect row."""
    Effect.objects.create(label=label)


@job(max_attempts=2)
def always_fails(reason: str = "boom") -> None:
    raise RuntimeError(reason)


@job(queue="slow")
def wait_for_lock(lock_id: int, label: str) -> None:
    """Block until the test releases PostgreSQL advisory lock ``lock_id``, then record."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s)", [lock_id])
        cursor.execute("SELECT pg_advisory_unlock(%s)", [lock_id])
    Effect.objects.create(label=label)


@job(queue="leases", takes_context=True)
def hold_lock(ctx: JobContext, lock_id: int, label: str) -> None:
    """Block until the test releases advisory lock ``lock_id``, then record the attempt."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s)", [lock_id])
        cursor.execute("SELECT pg_advisory_unlock(%s)", [lock_id])
    Effect.objects.create(label=f"{label} attempt {ctx.attempt}")


@job(queue="leases", takes_context=True, max_runtime=0.5)
def overrun(ctx: JobContext, lock_id: int) -> None:
    hold_lock.func(ctx, lock_id, "overran")


@job(takes_context=True)
def inspect_context(ctx: JobContext) -> None:
    before = ctx.deadline
    extended = ctx.heartbeat()
    Effect.objects.create(
        label=f"job {ctx.job_id} attempt {ctx.attempt} {ctx.kind} {ctx.queue} "
        f"extended={extended} moved={ctx.deadline >= before} lost={ctx.lease_lost}"
    )


@job(backoff=FixedBackoff(0), max_attempts=3)
def poison(label: str) -> None:
    """Record the attempt, then fail: a job that can never succeed."""
    Effect.objects.create(label=label)
    raise RuntimeError("poison")


@job
def retry_later(delay: float) -> None:
    raise Retry(delay=delay)


@job
def give_up(reason: str) -> None:
    raise Fail(reason)


class CardDeclined(PermanentError):
    pass


@job
def charge_card() -> None:
    raise CardDeclined("card declined")


@job(retry_on=(ConnectionError,), backoff=FixedBackoff(3600))
def call_partner(failure: str) -> None:
    raise ConnectionError("partner unreachable") if failure == "network" else ValueError(failure)


@job(expires_after=timedelta(minutes=10))
def send_reminder(label: str) -> None:
    Effect.objects.create(label=label)


@job(max_attempts=1)
def raise_unstorable_error(size: int) -> None:
    """Fail with a message PostgreSQL text cannot hold as is: a NUL byte, and long."""
    raise RuntimeError("bad\x00byte " + "x" * size)


def _wait_for_advisory_lock(lock_id: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s)", [lock_id])
        cursor.execute("SELECT pg_advisory_unlock(%s)", [lock_id])


@job(queue="idempotency", takes_context=True, visibility_timeout=1)
def complete_in_transaction(
    ctx: JobContext,
    label: str,
    lock_id: int = 0,
    crash_after_commit: bool = False,
    linger: float = 0.0,
) -> None:
    """Mechanism 1. Attempt 1 can be made to wait for a test's advisory lock inside its
    transaction (after the effect), or to SIGKILL its own worker right after committing.
    With ``linger`` (seconds) the handler keeps running after the commit, then records
    whether it was told its lease was lost."""
    with ctx.atomic():
        effect = Effect.objects.create(label=f"{label} attempt {ctx.attempt}")
        if lock_id and ctx.attempt == 1:
            _wait_for_advisory_lock(lock_id)
    if crash_after_commit and ctx.attempt == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    if linger:
        time.sleep(linger)  # the point: outlive several heartbeat intervals after the ack
        Effect.objects.filter(pk=effect.pk).update(
            label=f"{label} attempt {ctx.attempt} lease_lost={ctx.lease_lost}"
        )


@job(queue="idempotency", takes_context=True, visibility_timeout=1, backoff=FixedBackoff(0))
def record_once(
    ctx: JobContext,
    order_id: int,
    fail_after_effect: bool = False,
    crash_after_commit: bool = False,
) -> None:
    """Mechanism 2: the effect and its dedup key commit together; the worker acks after."""
    with transaction.atomic(), ctx.idempotent(f"order-{order_id}") as first_time:
        if first_time:
            Effect.objects.create(label=f"order {order_id}")
            if fail_after_effect and ctx.attempt == 1:
                raise RuntimeError("failed after the effect, before the commit")
    if crash_after_commit and ctx.attempt == 1:
        os.kill(os.getpid(), signal.SIGKILL)


@job(queue="idempotency", takes_context=True, max_attempts=1)
def nested_complete(ctx: JobContext) -> None:
    """Misuse: ctx.atomic() inside the handler's own transaction."""
    with transaction.atomic(), ctx.atomic():
        Effect.objects.create(label="never")


@job(queue="leases", takes_context=True)
def hold_lock_per_attempt(ctx: JobContext, lock_id: int) -> None:
    """Attempt N waits for advisory lock ``lock_id + N``, so a test can end attempts apart."""
    _wait_for_advisory_lock(lock_id + ctx.attempt)
    Effect.objects.create(label=f"attempt {ctx.attempt}")


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ is broken too")


@job(max_attempts=2, backoff=FixedBackoff(3600))
def raise_unprintable() -> None:
    raise Unprintable


@job(backoff=lambda attempt: float("inf"))
def infinite_backoff() -> None:
    raise RuntimeError("retry me")


@job(backoff=lambda attempt: 1 / 0)
def broken_backoff() -> None:
    raise RuntimeError("retry me")


# -- outcomes: long failures, unrecordable outcomes, awaitables (tests/test_outcomes.py) ----


@job(queue="outcomes")
def outcomes_fail_long(size: int) -> None:
    """Fail permanently with a message longer than a dead letter's reason."""
    raise Fail("x" * size)


@job(queue="outcomes", retry_on=(ConnectionError,))
def outcomes_raise_long(size: int) -> None:
    """Raise an exception outside ``retry_on`` with a long message."""
    raise ValueError("y" * size)


@job(queue="outcomes")
def outcomes_record(label: str) -> None:
    Effect.objects.create(label=label)


@job(queue="outcomes", max_attempts=3, backoff=FixedBackoff(0))
def outcomes_flaky(label: str) -> None:
    """Fail every attempt with a two-line message (the log quotes only the first)."""
    raise RuntimeError(f"{label} broke\nsecond line")


async def _outcomes_async_body(label: str) -> None:
    Effect.objects.create(label=label)  # never reached: the coroutine is not awaited


@job(queue="outcomes")
def outcomes_returns_coroutine(label: str) -> object:
    """A sync wrapper that returns its async function's coroutine instead of running it."""
    return _outcomes_async_body(label)


@job(queue="small", takes_context=True)
def small_record_attempt(ctx: JobContext, label: str) -> None:
    """Write one Effect row naming the attempt that ran: ``"<label> attempt <n>"``."""
    Effect.objects.create(label=f"{label} attempt {ctx.attempt}")


@job(queue="connections", visibility_timeout=1)
def connections_wait_for_file(path: str) -> None:
    """Create ``<path>.started``, then run, without touching the database, until the test
    creates ``path`` (at most 60 s), so the job stays running through a database outage."""
    with open(f"{path}.started", "w"):
        pass
    deadline = time.monotonic() + 60
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.02)


@job(
    name="renames.greet",
    aliases=["tests.testapp.jobs.renames_old_greet", "renames.hello"],
    queue="renames",
    takes_context=True,
)
def renames_greet(ctx: JobContext, label: str) -> None:
    """A renamed handler: once ``tests.testapp.jobs.renames_old_greet`` (the default kind of a
    function of that name), then ``renames.hello``. Writes ``"<label> <stored kind>"``."""
    Effect.objects.create(label=f"{label} {ctx.kind}")


@job(queue="renames-ticks")
def renames_tick(label: str) -> None:
    """The handler of the rolling-deploy schedule (its jobs are counted, not run)."""


@job
def mistakes_send_receipt(order_id: int) -> None:
    """A kind for near-miss suggestions ("did you mean ...?")."""


from . import mistakes_more_jobs  # noqa: E402, F401  (a module jobs.py imports counts as one)


def kinds_new_release(label: str) -> None:
    """A kind a new release adds: registered only in processes started with the environment
    variable ``JOBQ_TEST_NEW_RELEASE`` set (a worker of the new release, beside old ones).
    Writes ``"<label> by <pid>"``, naming the worker process that ran it."""
    Effect.objects.create(label=f"{label} by {os.getpid()}")


if os.environ.get("JOBQ_TEST_NEW_RELEASE"):
    job(name="kinds.new_release", queue="kinds")(kinds_new_release)

if os.environ.get("JOBQ_TEST_ASYNC_JOBS"):  # a worker with async kinds (tests/test_async_jobs.py)
    from . import async_jobs  # noqa: F401


@job
def enqueue_behind(label: str) -> None:
    """Enqueue ``record(label)`` with a ``run_at`` a day in the past: behind the claim
    position of the worker running this job (see test_claim_positions)."""
    from django.utils import timezone

    record.using(run_at=timezone.now() - timedelta(days=1)).enqueue(label)


@job(queue="pgbouncer", takes_context=True, max_attempts=3, backoff=FixedBackoff(0))
def pgbouncer_attempts(ctx: JobContext, label: str, failures: int) -> None:
    """Fail the first ``failures`` attempts, then write ``"<label> attempt <n>"``: with 3
    attempts, 0 or 1 failures succeed (1 after a retry), 3 make a dead letter."""
    if ctx.attempt <= failures:
        raise RuntimeError(f"{label} fails attempt {ctx.attempt}")
    Effect.objects.create(label=f"{label} attempt {ctx.attempt}")


@job(takes_context=True)
def record_backend(ctx: JobContext, label: str) -> None:
    """Write ``"<label> attempt <n> pid <server pid>"``: which server process the handler
    thread's Django connection talks to."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    Effect.objects.create(label=f"{label} attempt {ctx.attempt} pid {pid}")


def _timed_run(label: str, seconds: float, lane: str) -> None:
    """Record a run with the handler's own start and end times (tests/test_flow_control.py)."""
    from .models import Run

    started = time.time()
    if seconds:
        time.sleep(seconds)
    Run.objects.create(label=label, lane=lane, started=started, finished=time.time())


@job(queue="flow")
def flow_step(label: str, seconds: float = 0.0, lane: str = "") -> None:
    """A run of a flow-control test, in queue "flow" (which the tests pause and limit)."""
    _timed_run(label, seconds, lane)


@job(queue="flow", takes_context=True, backoff=FixedBackoff(0), max_attempts=3)
def flow_flaky(ctx: JobContext, label: str) -> None:
    """A run of a flow-control test in queue "flow" whose first attempt fails, retried at
    once: each attempt records its run, as ``"<label> attempt <n>"``."""
    _timed_run(f"{label} attempt {ctx.attempt}", 0.0, "")
    if ctx.attempt == 1:
        raise RuntimeError(f"{label} fails its first attempt")


@job(queue="flow-kinds", concurrency_limit=2)
def limited_step(label: str, seconds: float = 0.0) -> None:
    """A run of a kind that at most two workers run at once, fleet-wide."""
    _timed_run(label, seconds, "")


@job(queue="flow-kinds", rate_limit="5/s")
def rated_step(label: str) -> None:
    """A run of a kind started at most five times in any second, fleet-wide."""
    _timed_run(label, 0.0, "")


#: Seconds the abort tests' handlers wait for something before giving up (far past any test's
#: deadline: a handler that waits this long has already failed its test).
ABORT_TEST_PATIENCE = 60.0


@job(queue="aborts", takes_context=True, visibility_timeout=3, max_attempts=5)
def loop_until_aborted(ctx: JobContext, label: str) -> None:
    """Write ``"<label> started attempt <n>"``, then check for an abort every 50 ms: the
    handler of docs/flow-control.md ("Aborting a running job"), stopped by
    ``raise_if_aborted()``."""
    Effect.objects.create(label=f"{label} started attempt {ctx.attempt}")
    give_up = time.monotonic() + ABORT_TEST_PATIENCE
    while time.monotonic() < give_up:
        ctx.raise_if_aborted()
        time.sleep(0.05)


@job(queue="aborts", takes_context=True, visibility_timeout=3, max_attempts=5)
def ignore_abort(ctx: JobContext, label: str) -> None:
    """Write ``"<label> started"``, wait until the worker has seen an abort request, then
    go on and finish anyway (``"<label> finished, abort_requested=True"``): a handler that
    ignores the request."""
    Effect.objects.create(label=f"{label} started")
    give_up = time.monotonic() + ABORT_TEST_PATIENCE
    while not ctx.abort_requested and time.monotonic() < give_up:
        time.sleep(0.05)
    Effect.objects.create(label=f"{label} finished, abort_requested={ctx.abort_requested}")
