"""Handler threads: each runs claimed jobs one at a time and reports an :class:`Outcome`;
and the verdict on an attempt, for them and for the event loop of async handlers
(:func:`execute`, :func:`execute_async`, :mod:`.async_executor`).

Handlers use Django's ORM on the thread's own Django connection. As around a request, the
pool closes old connections before and after every job (:func:`execute` itself does not:
:mod:`django_jobq.testing` runs it inside a test's transaction), so a broken or expired
connection never leaks from one job into the next.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import queue
import threading
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import sync_to_async
from django.db import close_old_connections, connections

from .. import db, limited_claims, registry, signals, text, tracing
from ..backoff import default_backoff
from ..claims import ClaimedJob
from ..conf import MAX_DURATION
from ..context import JobContext
from ..exceptions import Aborted, MaxRuntimeExceeded, PermanentError, Retry
from ..idempotency import LeaseLost
from ..metrics import instruments
from ..models import DeadLetter
from ..outcomes import Action, Outcome
from ..registry import KindDefinition
from .held import HeldJob
from .observer import outcome_name

logger = logging.getLogger("django_jobq.worker")


def _failed(
    job: ClaimedJob,
    exc: BaseException,
    described: tuple[str, str],
    duration: float,
    *,
    reason: str = "",
    retry_delay: float = 0.0,
) -> Outcome:
    """The verdict on an attempt that raised ``exc`` (``described``: its error and
    traceback): a dead letter with ``reason`` or, without one, a retry in ``retry_delay`` s."""
    error, tb = described
    return Outcome(
        job,
        Action.DEAD_LETTER if reason else Action.RETRY,
        duration=duration,
        retry_delay=retry_delay,
        reason=reason,
        error=error,
        traceback=tb,
        exception_class_path=class_path(exc),
        exception=exc,
    )


def _refused(job: ClaimedJob, reason: str, error: str) -> Outcome:
    return Outcome(job, Action.DEAD_LETTER, reason=reason, error=error, ran=False)


def refusal(job: ClaimedJob) -> Outcome | None:
    """The dead-letter verdict for a claimed job that must not run, or ``None``: a poison
    row (``ClaimedJob.poison``), a job with an abort requested (``ClaimedJob.abort_requested``:
    a reclaim of an aborted job, say), a reclaim past the final attempt, an expired job. With
    OpenTelemetry, a refused job's attempt gets its span too (see :func:`execute`)."""
    refused = _refusal(job)
    if refused is not None and tracing.ENABLED and tracing.configured():
        with tracing.processing(job) as attempt:
            _decided(attempt, refused)
    return refused


def _refusal(job: ClaimedJob) -> Outcome | None:
    """:func:`refusal`, untraced."""
    if job.poison:
        return _refused(
            job,
            f"{DeadLetter.Reason.POISON_ROW}: {job.poison}",
            f"the row holds what enqueue never writes ({job.poison}); it was not run",
        )
    if job.abort_requested:
        return _refused(
            job,
            DeadLetter.Reason.ABORTED,
            f"an abort was requested while an earlier attempt ran (its lease lapsed, or it "
            f"was retried or released before the request was seen); attempt {job.attempt} "
            f"was not run",
        )
    if job.attempts_exhausted and not job.reclaimed:
        used = job.attempt - 1
        return _refused(
            job,
            f"{DeadLetter.Reason.MAX_ATTEMPTS_EXCEEDED}: it was ready with attempts "
            f"{used} of max_attempts {job.max_attempts}",
            f"no attempt was left when it was claimed (attempt {job.attempt} would have "
            f"started, of max_attempts {job.max_attempts}); it was not run",
        )
    if job.attempts_exhausted:
        return _refused(
            job,
            DeadLetter.Reason.LEASE_EXPIRED_ON_FINAL_ATTEMPT,
            f"the lease of attempt {job.max_attempts} of {job.max_attempts} lapsed before it "
            f"was acked (worker crashed, stalled or overran)",
        )
    if job.expired:
        return _refused(
            job,
            DeadLetter.Reason.EXPIRED,
            f"attempt {job.attempt} would have started after the job's expires_at",
        )
    return None


def describe(exc: BaseException) -> tuple[str, str]:
    """``(error, traceback)`` of an exception, as storable text within
    :data:`~django_jobq.text.MAX_ERROR_LENGTH`; never raises (an exception's ``__str__`` is
    user code too)."""
    try:
        error = f"{type(exc).__name__}: {exc}"
    except Exception:
        error = f"{type(exc).__name__} (its message could not be formatted)"
    try:
        tb = "".join(traceback.format_exception(exc))
    except Exception:
        tb = ""
    return text.fit(error), text.fit(tb)


def class_path(exc: BaseException) -> str:
    """``module.QualName`` of an exception's class, as Django's Tasks framework records it."""
    return f"{type(exc).__module__}.{type(exc).__qualname__}"


def _retry_delay(job: ClaimedJob, definition: KindDefinition, exc: BaseException) -> float:
    """Seconds until the next attempt: ``Retry(delay=...)``, else the kind's policy. A policy
    that raises or returns something other than 0 to 10 years of seconds is a bug: it is
    logged and the default policy decides instead."""
    if isinstance(exc, Retry) and exc.delay is not None:
        return exc.delay
    policy = definition.backoff or default_backoff()
    try:
        delay = policy(job.attempt)
        valid = isinstance(delay, int | float) and not isinstance(delay, bool)
        if valid and 0 <= delay <= MAX_DURATION:  # also refuses NaN
            return float(delay)
        raise ValueError(f"returned {delay!r}, not 0 to {MAX_DURATION:g} seconds")
    except Exception as problem:
        logger.error("job %s %s: backoff policy %r failed: %s", job.id, job.kind, policy, problem)
        return default_backoff()(job.attempt)


def _verdict_on_failure(
    job: ClaimedJob,
    definition: KindDefinition,
    exc: BaseException,
    described: tuple[str, str],
    duration: float,
) -> Outcome:
    """Retry, or dead-letter: a permanent error, an exception outside ``retry_on`` (``Retry``
    and ``MaxRuntimeExceeded`` are never outside it), or the final attempt (``described``:
    ``exc``'s error and traceback, :func:`describe`). A dead letter's reason quotes the
    error, cut to the reason's column (the whole error is the dead letter's
    ``last_error``)."""
    error = described[0]
    if isinstance(exc, PermanentError):
        message = error.partition(": ")[2] or error
        reason = text.reason(f"{DeadLetter.Reason.FAILED}: {message}")
        return _failed(job, exc, described, duration, reason=reason)
    retryable = (
        isinstance(exc, Retry | MaxRuntimeExceeded)
        or definition.retry_on is None
        or isinstance(exc, definition.retry_on)
    )
    if not retryable:
        reason = text.reason(f"{DeadLetter.Reason.FAILED}: {error}")
        return _failed(job, exc, described, duration, reason=reason)
    if job.is_final_attempt:
        reason = DeadLetter.Reason.MAX_ATTEMPTS_EXCEEDED
        return _failed(job, exc, described, duration, reason=reason)
    delay = _retry_delay(job, definition, exc)
    return _failed(job, exc, described, duration, retry_delay=delay)


def execute(held: HeldJob, extend: Callable[[HeldJob], bool]) -> Outcome:
    """Run a held job's handler with its payload as keyword arguments, and return the
    verdict; never raises.

    ``extend`` is what ``JobContext.heartbeat`` calls, for handlers that take a context.

    Aborts: a job whose abort request was seen before its handler started is dead-lettered
    "aborted" unrun; once seen while it runs, any exception the handler raises (its
    context's ``raise_if_aborted()``'s :class:`~django_jobq.exceptions.Aborted`, or another)
    makes the attempt a dead letter "aborted", never a retry; a handler that returns is
    acked as usual.

    With OpenTelemetry (:mod:`django_jobq.tracing`), the attempt runs in its span, current
    while the handler runs; the span records the handler's exception, and ends with the
    verdict (``jobq.outcome``; status ERROR for a dead letter), before the completer writes it.

    An async handler's jobs go to :func:`execute_async` instead; called here, its coroutine
    is closed unrun and the job dead-lettered (:func:`_not_awaited`).
    """
    if not (tracing.ENABLED and tracing.configured()):
        return _execute(held, extend, None)
    with tracing.processing(held.job) as attempt:
        return _decided(attempt, _execute(held, extend, attempt))


async def execute_async(held: HeldJob, extend: Callable[[HeldJob], bool]) -> Outcome:
    """:func:`execute` for a job whose handler is a coroutine function
    (``KindDefinition.is_async``): await it with its payload as keyword arguments, and
    return the verdict; never raises (a ``CancelledError`` from outside is a failed attempt
    too).

    The kind's ``max_runtime`` (seconds) bounds the await: past it the handler's task is
    cancelled and the attempt fails with :class:`~django_jobq.exceptions.MaxRuntimeExceeded`
    (a retry, or a dead letter on the final attempt). An abort request seen while it runs
    cancels the task too (``HeldJob.on_abort``): the attempt raises
    :class:`~django_jobq.exceptions.Aborted` and becomes a dead letter "aborted".
    ``job_started`` is sent through ``sync_to_async(thread_sensitive=True)``, since receivers
    may use the ORM: on Django's sync thread, or on the thread of an enclosing
    ``async_to_sync`` (a test's). No connection hygiene here; the worker's
    :class:`~.async_executor.AsyncExecutor` does it.
    """
    if not (tracing.ENABLED and tracing.configured()):
        return await _execute_async(held, extend, None)
    with tracing.processing(held.job) as attempt:
        return _decided(attempt, await _execute_async(held, extend, attempt))


def _decided(attempt: tracing.Attempt, outcome: Outcome) -> Outcome:
    """``outcome``, recorded on the attempt's span."""
    attempt.decided(outcome_name(outcome, applied=True), outcome.reason)
    return outcome


def _definition(held: HeldJob) -> KindDefinition | Outcome:
    """The definition that runs ``held``'s job, or the dead-letter verdict of a job that must
    not run: a refusal (:func:`refusal`), an abort requested while it waited for a handler
    slot, or a kind no handler is registered for here."""
    job = held.job
    if (refused := _refusal(job)) is not None:
        return refused
    if held.abort_requested:
        return _refused(
            job,
            DeadLetter.Reason.ABORTED,
            f"an abort was requested before attempt {job.attempt} started; it was not run",
        )
    definition = registry.get(job.kind)
    if definition is None:
        return _refused(
            job,
            DeadLetter.Reason.UNKNOWN_KIND,
            f"no handler is registered for kind {job.kind!r} in this worker",
        )
    return definition


def _arguments(
    held: HeldJob, definition: KindDefinition, extend: Callable[[HeldJob], bool]
) -> tuple[JobContext, ...]:
    """The positional arguments of the handler: its context, if it takes one."""
    if definition.takes_context:
        return (JobContext(held, lambda: extend(held)),)
    return ()


def _verdict_on_exception(
    held: HeldJob,
    definition: KindDefinition,
    exc: BaseException,
    duration: float,
    attempt: tracing.Attempt | None,
) -> Outcome:
    """The verdict on an attempt whose handler raised ``exc`` after ``duration`` seconds,
    recorded on ``attempt``'s span when traced."""
    described = describe(exc)
    if attempt is not None:
        attempt.failed(exc, *described)
    error = described[0]
    job = held.job
    if held.acked:  # raised after its transaction committed: the job is done anyway
        return Outcome(job, Action.ACKED_BY_HANDLER, duration=duration, error=error, exception=exc)
    if isinstance(exc, LeaseLost):
        return Outcome(job, Action.LEASE_LOST, duration=duration, error=error, exception=exc)
    if held.abort_requested:  # an aborted job is never retried, whatever it raised
        return _failed(job, exc, described, duration, reason=DeadLetter.Reason.ABORTED)
    return _verdict_on_failure(job, definition, exc, described, duration)


def _verdict_on_return(held: HeldJob, returned: Any, duration: float) -> Outcome:
    """The verdict on an attempt whose handler returned ``returned`` after ``duration``
    seconds."""
    if inspect.isawaitable(returned) and not held.acked:
        return _not_awaited(held.job, returned, duration)
    action = Action.ACKED_BY_HANDLER if held.acked else Action.ACK
    return Outcome(held.job, action, duration=duration, returned=returned)


def _execute(
    held: HeldJob, extend: Callable[[HeldJob], bool], attempt: tracing.Attempt | None
) -> Outcome:
    """:func:`execute`; the handler's exception is recorded on ``attempt``, when traced."""
    definition = _definition(held)
    if isinstance(definition, Outcome):
        return definition
    signals.send(signals.job_started, held.job)
    instruments.handler_started()
    started = held.started = time.monotonic()
    try:
        arguments = _arguments(held, definition, extend)
        if held.rated is not None and held.rated.needs_confirming():  # late behind its claim
            limited_claims.confirm_start(held.rated)
        returned = definition.func(*arguments, **held.job.payload)
    except BaseException as exc:  # any failure of user code is the job's outcome
        return _verdict_on_exception(held, definition, exc, time.monotonic() - started, attempt)
    finally:
        instruments.handler_finished()
    return _verdict_on_return(held, returned, time.monotonic() - started)


async def _execute_async(
    held: HeldJob, extend: Callable[[HeldJob], bool], attempt: tracing.Attempt | None
) -> Outcome:
    """:func:`execute_async`; the handler's exception is recorded on ``attempt``, when
    traced."""
    definition = _definition(held)
    if isinstance(definition, Outcome):
        return definition
    await sync_to_async(signals.send, thread_sensitive=True)(signals.job_started, held.job)
    instruments.handler_started()
    started = held.started = time.monotonic()
    try:
        with _AbortWatch(held) as watch:
            try:
                arguments = _arguments(held, definition, extend)
                if held.rated is not None and held.rated.needs_confirming():  # late
                    await sync_to_async(limited_claims.confirm_start, thread_sensitive=True)(
                        held.rated
                    )
                returned = await _within_max_runtime(
                    definition.func(*arguments, **held.job.payload), definition.max_runtime
                )
            except asyncio.CancelledError as exc:
                watch.raise_if_cancelled_by_it(exc)
                raise
    except BaseException as exc:  # any failure of user code is the job's outcome
        return _verdict_on_exception(held, definition, exc, time.monotonic() - started, attempt)
    finally:
        instruments.handler_finished()
    return _verdict_on_return(held, returned, time.monotonic() - started)


class _AbortWatch:
    """While an async handler runs (``with``, in its task): cancel the task when the worker
    sees an abort request (``HeldJob.on_abort``, called from the heartbeater's thread; the
    cancel itself runs on the loop), then turn that cancellation into
    :class:`~django_jobq.exceptions.Aborted` (:meth:`raise_if_cancelled_by_it`). A request
    seen before the handler started is refused earlier (:func:`_definition`)."""

    def __init__(self, held: HeldJob) -> None:
        self._held = held
        self._task = asyncio.current_task()
        self._loop = asyncio.get_running_loop()
        self._running = False
        self.cancelled = False
        self._uncancelled = False

    def __enter__(self) -> _AbortWatch:
        self._running = True
        self._held.on_abort = self._request
        if self._held.abort_requested:  # seen between _definition and here
            self._cancel()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._running = False
        self._held.on_abort = None
        if self._pending():  # the handler swallowed the cancellation (and returned)
            self._uncancel()

    def _pending(self) -> bool:
        """Whether this watch's cancellation is still counted on the task."""
        return self.cancelled and not self._uncancelled

    def _uncancel(self) -> None:
        assert self._task is not None
        self._uncancelled = True
        self._task.uncancel()

    def _request(self) -> None:
        self._loop.call_soon_threadsafe(self._cancel)

    def _cancel(self) -> None:
        if self._running and not self.cancelled and self._task is not None:
            self.cancelled = True
            self._task.cancel("jobq: abort requested")

    def raise_if_cancelled_by_it(self, exc: asyncio.CancelledError) -> None:
        """Raise ``Aborted`` if the abort cancelled the task (it uncancels it: the task goes
        on to report the verdict); return if the cancellation came from elsewhere (the
        worker's shutdown), which then propagates."""
        if not self._pending() or self._task is None:
            return
        if self._task.cancelling() > 1:
            return  # also cancelled from elsewhere (the worker's shutdown): that one wins
        self._uncancel()
        raise Aborted(
            f"job {self._held.job.id} attempt {self._held.job.attempt}: abort requested by an "
            f"operator; the task was cancelled"
        ) from exc


async def _within_max_runtime(awaitable: Awaitable[Any], max_runtime: float | None) -> Any:
    """Await ``awaitable`` in this task, cancelling it after ``max_runtime`` seconds
    (``None``: no limit).

    Raises:
        MaxRuntimeExceeded: the time ran out and the cancelled handler raised (a handler
            that swallows the cancellation and returns has its value kept: its work is done).
        BaseException: whatever the handler raises.
    """
    timeout = asyncio.timeout(max_runtime)
    try:
        async with timeout:
            return await awaitable
    except TimeoutError as exc:
        if not timeout.expired():
            raise  # the handler's own
        raise MaxRuntimeExceeded(
            f"max_runtime of {max_runtime:g} s exceeded; the task was cancelled"
        ) from exc


def _not_awaited(job: ClaimedJob, returned: Any, duration: float) -> Outcome:
    """The dead letter of a handler that returned an awaitable from a plain function (a
    sync wrapper of an async function, which ``@job`` cannot see through): its body never
    ran, so it must not be acked. The awaitable is closed unrun."""
    if inspect.iscoroutine(returned):
        returned.close()
    error = (
        f"the handler returned {type(returned).__name__}, an awaitable, from a plain function, "
        f"so its body did not run; declare the handler itself with async def and the worker "
        f"awaits it"
    )
    reason = text.reason(f"{DeadLetter.Reason.FAILED}: {error}")
    return Outcome(job, Action.DEAD_LETTER, duration=duration, reason=reason, error=error)


def undecided(held: HeldJob, exc: Exception) -> Outcome:
    """The outcome of a job whose verdict could not be reached (``exc`` is a bug of the
    worker's, logged here): a retry in a minute, so that neither the job nor its executor
    wedges."""
    logger.exception("job %s: could not decide its outcome", held.job.id, exc_info=exc)
    error, tb = describe(exc)
    return Outcome(held.job, Action.RETRY, retry_delay=60.0, error=error, traceback=tb)


#: The longest :meth:`ExecutorPool.let_start` waits for a thread to take a job, in seconds.
#: A woken thread takes one in 13-23 microseconds on the development machine (a thread
#: blocked on a ``queue.SimpleQueue``, woken by ``put``); the bound is for a thread that is
#: not scheduled at once.
LET_START_TIMEOUT = 0.001


class ExecutorPool:
    """``size`` threads taking held jobs from one local queue.

    ``report`` is called (on the executor thread) with each outcome; ``extend`` backs
    ``JobContext.heartbeat``. Jobs submitted but not yet started can be taken back with
    :meth:`take_unstarted` (for release at shutdown).
    """

    def __init__(
        self,
        size: int,
        *,
        report: Callable[[Outcome], None],
        extend: Callable[[HeldJob], bool],
        name: str,
    ) -> None:
        self._jobs: queue.SimpleQueue[HeldJob | None] = queue.SimpleQueue()
        # Per thread (each writes only its own slot: no lock, no lost update): whether it
        # waits for a job, and how many it took.
        self._waiting = [False] * size
        self._takes = [0] * size
        self._submitted = 0  # jobs submitted since the last let_start
        self._takes_at_submit = 0  # sum(self._takes) when the first of them was submitted
        self._awaited = False  # let_start waits: a take sets _taken
        self._taken = threading.Event()
        self._report = report
        self._extend = extend
        self._threads = [
            threading.Thread(target=self._run, args=(n,), name=f"{name}-executor-{n}", daemon=True)
            for n in range(size)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    @property
    def idle_threads(self) -> int:
        """How many threads wait for a job (a reading that may be out of date at once)."""
        return sum(self._waiting)

    def submit(self, held: HeldJob) -> None:
        if not self._submitted:
            self._takes_at_submit = sum(self._takes)
        self._submitted += 1
        self._jobs.put(held)

    def let_start(self) -> None:
        """After a claim's jobs were submitted, let an idle thread take the job before the
        caller goes on: wait until a thread took it, at most :data:`LET_START_TIMEOUT`
        seconds. Only for a claim of a single job, submitted while every thread was idle
        (the pickup of a job that arrives alone); otherwise it returns at once.

        The thread woken for a job needs the GIL, which the caller (the main loop) holds
        until its next blocking call: the statement after the claim, once it is built.
        Waiting releases it then and there: 0.05-0.13 ms off the mean of that handoff
        (docs/performance.md, "Where the time goes"). Not while a handler runs: a CPU-bound
        one holds the GIL, and the caller, to go on after the wait, would wait for it to be
        switched out (``sys.getswitchinterval()``, 5 ms by default) once more per claim.
        Not for several jobs: the threads they wake contend with the caller for the GIL when
        it goes on (a 32-thread worker bursting through no-op jobs, waiting on every claim,
        waited 1.4-1.8 ms on average, past this timeout)."""
        submitted, self._submitted = self._submitted, 0
        if submitted != 1 or not all(self._waiting):
            return
        self._taken.clear()
        self._awaited = True  # from here on, a take sets _taken (before: it is counted)
        if sum(self._takes) == self._takes_at_submit:
            self._taken.wait(LET_START_TIMEOUT)
        self._awaited = False

    def take_unstarted(self) -> list[HeldJob]:
        """Remove and return the jobs no thread has started."""
        taken: list[HeldJob] = []
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                return taken
            if job is not None:
                taken.append(job)

    def stop(self, *, wait: bool = True, timeout: float | None = None) -> None:
        """Let every thread finish its current job, then end; ``wait`` joins them, for
        ``timeout`` seconds at most together (``None``: however long)."""
        for _ in self._threads:
            self._jobs.put(None)
        if wait:
            deadline = None if timeout is None else time.monotonic() + timeout
            for thread in self._threads:
                thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def _run(self, number: int) -> None:
        try:
            while (held := self._take(number)) is not None:
                try:
                    db.close_unusable_connections()
                    outcome = execute(held, self._extend)
                except Exception as exc:  # a bug here must not wedge the job or the thread
                    outcome = undecided(held, exc)
                try:
                    close_old_connections()
                except Exception:  # the verdict stands: a failed close must not retry the job
                    logger.exception("job %s: closing connections after it failed", held.job.id)
                held.finished = True
                self._report(outcome)
        finally:
            connections.close_all()

    def _take(self, number: int) -> HeldJob | None:
        """The next job for thread ``number`` (``None``: stop), counted waiting meanwhile."""
        self._waiting[number] = True
        try:
            held = self._jobs.get()
        finally:
            self._waiting[number] = False
        self._takes[number] += 1
        if self._awaited:
            self._taken.set()
        return held
