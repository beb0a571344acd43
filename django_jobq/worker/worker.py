"""The worker's main loop.

One thread (the caller of :meth:`Worker.run`) owns a psycopg connection and does all the
queue bookkeeping: it claims jobs in batches, hands them to the executor threads, and
records their outcomes. Data flows one way: claim → executor → outcome → completer. A
heartbeater thread keeps the leases of every held job alive meanwhile. Between turns the
loop waits on the listener's socket itself (LISTEN/NOTIFY: a job was enqueued) beside its
other wake-ups (:mod:`.wakeup`); the listener's thread only opens and reopens that
connection (:mod:`.listener`).

The loop survives the loss of its connection: it logs, reconnects with backoff and carries
on. Outcomes reported meanwhile wait in the completer and are recorded after the reconnect
(or, if the outage outlasts a lease, are refused as lost leases and the jobs run again).
A connection that hangs is a lost connection too: a watchdog thread cuts a statement in
flight for too long (:mod:`.watchdog`), and the heartbeater stops extending leases while
the loop is stuck in one pass (:class:`.held.Progress`).

Shutdown is bounded: after :meth:`Worker.stop` the worker returns within the shutdown
timeout plus :data:`SHUTDOWN_SLACK`, whatever the database does. Backoff sleeps end at the
deadline, a statement in flight at the deadline is cut, and every thread is waited for a
bounded time. Without a shutdown timeout, running handlers are waited for however long they
take, but once none runs the last writes (releases, outcomes) get :data:`FINAL_WRITES_TIMEOUT`
seconds.

A worker holds at most ``concurrency + batch_size`` leased jobs: one running per executor
thread and up to ``batch_size`` claimed ahead (prefetched). A worker whose process registers
async kinds (``async def`` handlers) also runs an event loop (:mod:`.async_executor`) with
``async_concurrency`` slots, which add to that bound and to the default ``batch_size``; each
claimed job goes to a thread or to the loop by its kind's ``is_async``.

A turn that only records acks claims nothing while nothing new can be ready: the last claim
took fewer jobs than it asked for, the listener has been connected since (every job
enqueued, redriven or run now after that claim was announced), and the deadline that
claim's turn computed (a job falling due, another worker's lease lapsing, the poll interval)
has not come (:meth:`Worker._claim_may_wait`). A job that becomes ready without a
notification (a row another transaction had locked from that claim) waits for that
deadline, as it would for an idle worker.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
import unicodedata
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from django.db import connections
from django.utils import timezone

from .. import (
    claims,
    crash_points,
    db,
    flow_state,
    lanes,
    limited_claims,
    registry,
    sql,
    task_results,
    text,
)
from ..claim_positions import ClaimPositions
from ..conf import MAX_ASYNC_CONCURRENCY, get_settings, statement_timeout
from ..outcomes import Action, Outcome
from .announcer import Announcer
from .async_executor import AsyncExecutor
from .completer import Completer, OutcomeCounts
from .executor import ExecutorPool, refusal
from .heartbeat import Heartbeater
from .held import HeldJob, HeldJobs, Progress
from .listener import Listener
from .maintenance import Maintenance
from .observer import Observer
from .outage import OutageLog
from .plans import PlanRefresh
from .scheduler import Scheduler
from .statistics import StatisticsCheck
from .timers import doubling, reconnect_delays
from .wakeup import Wakeup
from .watchdog import Watchdog

logger = logging.getLogger("django_jobq.worker")

#: Bounds of the worker's options (sizes that fit the database's integers and a process).
MAX_CONCURRENCY = 1000
MAX_BATCH_SIZE = 10_000
MAX_POLL_INTERVAL = 3600.0
MAX_WORKER_ID_LENGTH = text.MAX_WORKER_ID_LENGTH  # Job.worker_id's max_length
#: Unicode categories refused in a worker id: control (newline, tab, NUL, ...), format
#: (zero-width and bidirectional marks), surrogates, line and paragraph separators. They
#: would split a log line, or make an id in the admin look like another.
_REFUSED_IN_WORKER_ID = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
#: Seconds between two looks of a burst worker that has nothing left to claim but waits
#: for jobs of its queues running elsewhere (another worker's, or a crashed one's lease).
BURST_RECHECK_INTERVAL = 0.1
#: Seconds before a worker tries again a limited claim that found a limit's row locked by
#: another worker's limited claim (it skipped it rather than wait).
LIMITED_RETRY_INTERVAL = 0.02
#: Seconds a finished job's outcome may wait for others to share its ack statement (one
#: commit for many jobs instead of one each). Short, so acks are still recorded promptly.
ACK_FLUSH_DELAY = 0.005
#: The outcomes after which a turn may claim nothing (see :meth:`Worker._claim_may_wait`):
#: they free a handler slot and make no job ready.
_ACKS = frozenset({Action.ACK, Action.ACKED_BY_HANDLER})
#: Seconds before the worker first tries again to record an outcome or release a job whose
#: row another transaction had locked (busy: skipped, not waited for; see
#: :mod:`django_jobq.leases`), and the most it waits between tries: the wait doubles from
#: the first to the most, since a claimer's lock lasts one statement while an operator's
#: may last minutes.
BUSY_RETRY_DELAYS = (0.005, 0.2)
#: psycopg's ``prepare_threshold`` of the main loop's connection once its statements may be
#: prepared (see :meth:`Worker._prepares_statements`): each is prepared on its first run, so
#: PostgreSQL can run a plan it made before (a generic plan) instead of planning at every run;
#: planning is most of a small claim's server time. It still plans again at times: after an
#: ANALYZE of the table, and where a plan for the parameters looks cheaper (docs/performance.md,
#: "Planning on the main loop"). The plans are made again once the job table has grown
#: (:mod:`.plans`).
PREPARE_THRESHOLD = 0
#: Seconds the worker's threads and its deregistration may take, together, once the main
#: loop is done (each is cut short by then: the threads are daemons, the statement is cut).
EXIT_TIMEOUT = 2.0
#: The most seconds a stopping worker returns after its shutdown timeout: a connection
#: attempt begun before the deadline (libpq waits at least 2 s per address) and
#: :data:`EXIT_TIMEOUT`.
SHUTDOWN_SLACK = 2.0 + EXIT_TIMEOUT
#: Without a shutdown timeout: seconds a stopping worker keeps trying to write its last
#: releases and outcomes once no handler runs (the jobs of unwritten ones run again).
FINAL_WRITES_TIMEOUT = 5.0


@dataclass(frozen=True)
class WorkerStats:
    """What a worker did, returned by :meth:`Worker.run`.

    ``elapsed`` is in seconds. ``abandoned`` counts jobs still running when the shutdown
    timeout passed: the worker stopped extending their leases, which then lapse.
    """

    worker_id: str
    elapsed: float
    claimed: int
    released: int
    abandoned: int
    heartbeats: int
    heartbeats_refused: int
    outcome_counts: OutcomeCounts


def _is_async_kind(kind: str) -> bool:
    definition = registry.get(kind)
    return definition is not None and definition.is_async


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def worker_id_problem(worker_id: str, *, max_length: int = MAX_WORKER_ID_LENGTH) -> str | None:
    """Why ``worker_id`` cannot name a worker, as the end of a sentence starting with its
    name ("must be 1 to 200 characters"), or ``None`` if it can. An id has 1 to
    ``max_length`` characters, none of them a control, format or separator character
    (see :data:`_REFUSED_IN_WORKER_ID`)."""
    if not 0 < len(worker_id) <= max_length:
        return f"must be 1 to {max_length} characters, not {len(worker_id)}"
    for position, character in enumerate(worker_id):
        if unicodedata.category(character) in _REFUSED_IN_WORKER_ID:
            return (
                f"must not contain control or invisible characters: {character!r} "
                f"(U+{ord(character):04X}) at position {position}"
            )
    return None


class Worker:
    """Claims and runs jobs until :meth:`stop` is called (or, in burst mode, until idle).

    Args:
        queues: queues to claim from; ``None`` means every queue.
        concurrency: executor threads, each with its own Django connection (>= 1).
        batch_size: the most jobs one claim takes, and the prefetch bound (>= 1); default:
            the handler slots (``concurrency``, plus ``async_concurrency`` when this process
            registers async kinds).
        async_concurrency: async jobs run at once on the worker's event loop, 1 to
            :data:`~django_jobq.conf.MAX_ASYNC_CONCURRENCY` (default
            ``JOBQ['ASYNC_CONCURRENCY']``). The loop, and these slots in the claim bound, exist
            only when this process registers async kinds (docs/async.md).
        poll_interval: the most seconds an idle worker waits before claiming again (default
            ``JOBQ['POLL_INTERVAL']``); a notification, a ``run_at`` or lease deadline that
            falls due, or a schedule tick wakes it sooner.
        worker_id: recorded on claimed jobs; defaults to ``host:pid``. 1 to 200 characters,
            without control or invisible characters (:func:`worker_id_problem`).
        burst: return once no job is due, none is held, and no job of the queues is
            running under any worker's lease (live or lapsed). A burst worker thus waits
            for a crashed worker's lease to lapse, then reclaims and runs its job; jobs
            whose ``run_at`` is still in the future (scheduled, or a retry's backoff) do
            not keep it.
        shutdown_timeout: seconds running jobs may take to finish after :meth:`stop`;
            ``None`` waits for them however long they take.
        scheduler: run the scheduler, which enqueues the jobs of due schedule ticks
            (:mod:`django_jobq.scheduling`); on by default.
        listen: wake on enqueue notifications (LISTEN on a connection of its own, to
            ``JOBQ['LISTEN_DATABASE']``; a connection that cannot hear them is logged as an
            error and dropped, see :mod:`.listener`); off, the worker only polls (e.g. behind
            PgBouncer in transaction mode without a direct ``LISTEN_DATABASE``).

    Raises:
        ValueError: an option out of range.
        ImproperlyConfigured: with the scheduler, a declared schedule is invalid.
        ImportError: ``TASKS`` uses ``JobqBackend`` but Django's Tasks framework is missing.

    Construction imports every installed app's ``tasks`` module when ``TASKS`` uses
    ``JobqBackend``, so the worker knows their tasks (:func:`django_jobq.task_results.discover`).
    """

    def __init__(
        self,
        *,
        queues: Sequence[str] | None = None,
        concurrency: int = 1,
        batch_size: int | None = None,
        poll_interval: float | None = None,
        worker_id: str | None = None,
        burst: bool = False,
        shutdown_timeout: float | None = None,
        scheduler: bool = True,
        listen: bool = True,
        async_concurrency: int | None = None,
    ) -> None:
        if not 1 <= concurrency <= MAX_CONCURRENCY:
            raise ValueError(f"concurrency must be 1 to {MAX_CONCURRENCY}, not {concurrency}.")
        if batch_size is not None and not 1 <= batch_size <= MAX_BATCH_SIZE:
            raise ValueError(f"batch_size must be 1 to {MAX_BATCH_SIZE}, not {batch_size}.")
        if shutdown_timeout is not None and not 0 <= shutdown_timeout < math.inf:
            raise ValueError(f"shutdown_timeout must be >= 0 seconds, not {shutdown_timeout}.")
        problem = None if worker_id is None else worker_id_problem(worker_id)
        if problem is not None:
            raise ValueError(f"worker_id {problem}.")
        if async_concurrency is not None and not 1 <= async_concurrency <= MAX_ASYNC_CONCURRENCY:
            raise ValueError(
                f"async_concurrency must be 1 to {MAX_ASYNC_CONCURRENCY}, not {async_concurrency}."
            )
        settings = get_settings()
        self.queues = list(queues) if queues else None
        self.concurrency = concurrency
        self.poll_interval = poll_interval if poll_interval is not None else settings.POLL_INTERVAL
        if not 0 < self.poll_interval <= MAX_POLL_INTERVAL:
            raise ValueError(
                f"poll_interval must be more than 0 and at most {MAX_POLL_INTERVAL:g} seconds, "
                f"not {self.poll_interval}."
            )
        self.worker_id = worker_id or default_worker_id()
        self.burst = burst
        self.shutdown_timeout = shutdown_timeout
        self._stopping = threading.Event()
        self._stop_requested_at: float | None = None
        # Ends the loop's wait between turns (and for outcomes to share an ack), beside
        # the listener's socket (see .wakeup).
        self._wakeup = Wakeup()
        # Set when a job of a served queue is announced: the next turn claims before it
        # records outcomes, and does not hold them back to share an ack.
        self._announced = threading.Event()
        self._outcomes: list[Outcome] = []
        self._outcomes_lock = threading.Lock()
        self._first_outcome_at = 0.0  # time.monotonic() of the oldest untaken outcome
        self._held = HeldJobs()
        self._progress = Progress()
        self._watchdog = Watchdog(
            bound=statement_timeout(settings) * db.CUT_AFTER_STATEMENT_TIMEOUTS,
            name=self.worker_id,
            deadline=self._cut_deadline,
        )
        self._exit_by: float | None = None  # time.monotonic(): the threads and deregistration
        self._failures = OutageLog()
        self._idle_since: float | None = None  # stopping, and no handler running since
        self._scheduler = Scheduler() if scheduler else None
        self._listener = (
            Listener(
                queues=self.queues,
                wake=self._announce,
                wakeup=self._wakeup,
                worker_id=self.worker_id,
                watchdog=self._watchdog,
            )
            if listen
            else None
        )
        # The listener's check notification proves that connections to the queue database
        # keep session state (see _keeps_session_state) when it connects with their alias.
        self._listener_proves_session = self._listener is not None and (
            settings.LISTEN_DATABASE in (None, settings.DATABASE)
        )
        self._plans = PlanRefresh(worker_id=self.worker_id)
        self._statistics = StatisticsCheck(worker_id=self.worker_id)
        self._heartbeater = Heartbeater(
            self._held, worker_id=self.worker_id, progress=self._progress, watchdog=self._watchdog
        )
        self._pool = ExecutorPool(
            concurrency,
            report=self._report,
            extend=self._heartbeater.extend_one,
            name=self.worker_id,
        )
        task_results.discover()
        self.kinds = registry.claimable_kinds()
        # The kinds that are Django tasks (their results are started as they are claimed).
        self._task_kinds = sorted(kind for kind in self.kinds if task_results.handler(kind))
        self._claims_take_tasks = bool(self._task_kinds)
        self._start_tasks_apart_until = 0.0  # time.monotonic()
        self.serves_async = any(_is_async_kind(kind) for kind in self.kinds)
        self.async_concurrency = async_concurrency or settings.ASYNC_CONCURRENCY
        self._async = AsyncExecutor(
            self.async_concurrency,
            report=self._report,
            extend=self._heartbeater.extend_one,
            name=self.worker_id,
        )
        # Slots for handlers: one per thread, and the loop's when it runs async kinds.
        slots = concurrency + (self.async_concurrency if self.serves_async else 0)
        self._slots = slots
        self.batch_size = batch_size or slots
        self._observer = Observer(
            worker_id=self.worker_id,
            queues=self.queues,
            concurrency=concurrency,
            kinds=self.kinds,
            slots=slots,
        )
        self._observing = False  # registered (on the first connection)
        # Where this process's claims start reading (see django_jobq.claim_positions).
        self._positions = ClaimPositions()
        # What it knows of pauses and limits (django_jobq.flow_state), loaded on the first
        # turn and whenever a claim finds it out of date; the lanes whose job it finished.
        self._flow: flow_state.FlowState | None = None
        self._limited_retry_at = math.inf  # time.monotonic(): a limited claim to retry
        self._limited_pending = True  # limited jobs may wait: claim them before the others
        # No limited claim after the plain one before then (time.monotonic()): the last one
        # found no limited job; a notification or a wake by the clock (a job falling due)
        # brings it forward.
        self._limited_idle_until = 0.0
        self._limited_queue_named = threading.Event()  # a limited queue got a job
        self._limited_maybe = threading.Event()  # a job that a kind limit may bind came
        self._finished_lanes: set[str] = set()
        # Rate-limited jobs just claimed: where their start is logged (see _hold).
        self._rated: dict[int, limited_claims.RatedStart] = {}
        # The last limited claim found every limit far from binding: it may fill the prefetch.
        self._limited_far = False
        self._limited_full = False  # this turn's limited claim took all it asked for
        self._limited_held_elsewhere = False  # the last limited claim found a row held
        # Reads the task results the outcomes finished and sends task_finished, off the loop.
        self._announcer = Announcer(name=self.worker_id, wake=self._wakeup.set)
        self._completer = Completer(
            on_applied=self._applied, observer=self._observer, announce=self._announcer.announce
        )
        self._maintenance = Maintenance(announce=self._announcer.announce)
        self._capacity = slots + self.batch_size
        self._refill_at = max(1, self.batch_size // 2)
        self._outstanding = 0  # claimed and not yet recorded (prefetched, running, reported)
        self._claim_was_short = False  # the last claim had less room than a batch
        # Until then (time.monotonic()) a turn that records only acks need not claim: the
        # last claim found its queues drained (see _claim_may_wait); 0: claim.
        self._drained_until = 0.0
        self._drained_at_reconnects = 0  # the listener's reconnects when it was set
        self._to_release: list[HeldJob] = []
        self._claimed = self._released = self._abandoned = self._reconnects = 0

    def stop(self) -> None:
        """Ask the worker to stop: no new claims, prefetched jobs released, running jobs
        finish (within the shutdown timeout). Safe from a signal handler or another thread:
        the loop's thread never holds the locks it takes (it never waits on ``_stopping``,
        and the wake-up takes none)."""
        if self._stop_requested_at is None:
            self._stop_requested_at = time.monotonic()
        self._stopping.set()
        self._wakeup.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def _announce(self, queues: Collection[str] | None = None) -> None:
        """A job was enqueued in ``queues`` (served ones; ``None``: perhaps in any, the
        listener reconnected): wake the loop, and cut short its wait for outcomes to share
        an ack. A limited queue named makes the next turn claim limited jobs first; any
        other, while kinds it serves have limits, makes it claim them after its plain
        claim."""
        flow = self._flow
        if queues is None or flow is None or not flow.queue_limits.keys().isdisjoint(queues):
            self._limited_queue_named.set()
        elif not flow.kind_limits.keys().isdisjoint(self.kinds):
            self._limited_maybe.set()
        self._announced.set()
        self._wakeup.set()

    def _report(self, outcome: Outcome) -> None:
        with self._outcomes_lock:
            if not self._outcomes:
                self._first_outcome_at = time.monotonic()
            self._outcomes.append(outcome)
        self._wakeup.set()

    def _wait_for_wake(self, timeout: float) -> bool:
        """Wait for a wake-up (an outcome, a stop, a job announced: the listener's socket
        is waited on here too, see :mod:`.listener`), ``timeout`` seconds at most
        (``math.inf``: however long); return whether one came."""
        if self._listener is None:
            return self._wakeup.wait(timeout)[0]
        return self._listener.wait(timeout)

    def _take_outcomes(self) -> list[Outcome]:
        """Take the reported outcomes, first letting others arrive for up to
        :data:`ACK_FLUSH_DELAY` after the oldest (unless every handler slot has reported, a
        job was announced, or the worker is stopping), so that one ack statement records many
        jobs."""
        while True:
            self._wakeup.clear()  # then look, then wait (see Wakeup)
            if (
                not self._outcomes
                or len(self._outcomes) >= self._slots
                or self._announced.is_set()
                or self._stopping.is_set()
            ):
                break
            time_left = self._first_outcome_at + ACK_FLUSH_DELAY - time.monotonic()
            if time_left <= 0:
                break
            self._wait_for_wake(time_left)
        with self._outcomes_lock:
            taken, self._outcomes = self._outcomes, []
        return taken

    def _hold(self, job: claims.ClaimedJob) -> HeldJob:
        definition = registry.get(job.kind)
        held = HeldJob(
            job,
            max_runtime=definition.max_runtime if definition else None,
            asynchronous=definition is not None and definition.is_async,
            rated=self._rated.pop(job.id, None),
        )
        self._held.add(held)
        return held

    def _submit(self, held: HeldJob) -> None:
        """Hand a held job to the event loop (an async kind's) or to the handler threads."""
        (self._async if held.asynchronous else self._pool).submit(held)

    def _shutdown_deadline(self) -> float | None:
        """When a stopping worker gives up (``time.monotonic()`` seconds): the shutdown
        timeout after the stop or, without one, :data:`FINAL_WRITES_TIMEOUT` after the last
        handler finished; ``None``: no deadline (yet)."""
        if self._stop_requested_at is None:
            return None
        if self.shutdown_timeout is not None:
            return self._stop_requested_at + self.shutdown_timeout
        if any(h.started is not None and not h.finished for h in self._held.snapshot()):
            self._idle_since = None
            return None
        if self._idle_since is None:
            self._idle_since = time.monotonic()
        return self._idle_since + FINAL_WRITES_TIMEOUT

    def _cut_deadline(self) -> float:
        """From when the watchdog cuts every statement in flight: the shutdown deadline,
        then the exit's (``time.monotonic()`` seconds; ``math.inf``: not stopping)."""
        if self._exit_by is not None:
            return self._exit_by
        deadline = self._shutdown_deadline()
        return math.inf if deadline is None else deadline

    def _shutdown_time_left(self) -> float | None:
        deadline = self._shutdown_deadline()
        return None if deadline is None else deadline - time.monotonic()

    def _execute_on_queues(
        self,
        cursor: psycopg.Cursor[Any],
        statements: tuple[str, str, str],
        params: dict[str, Any],
    ) -> Any:
        """Run the variant of a statement for this worker's queues (``statements``: for any
        queue, one queue, several queues); return its single value."""
        any_queue, one_queue, several_queues = statements
        if self.queues is None:
            cursor.execute(any_queue, params)
        elif len(self.queues) == 1:
            cursor.execute(one_queue, {**params, "queue": self.queues[0]})
        else:
            cursor.execute(several_queues, {**params, "queues": self.queues})
        ((value,),) = cursor.fetchall()
        return value

    def _idle_timeout(self, cursor: psycopg.Cursor[Any] | None) -> float:
        """Seconds to sleep when nothing is due: until the next ready job's ``run_at``, the
        next lease deadline of a job this worker does not hold (another worker's, or a
        predecessor's with the same worker id), read on ``cursor`` (``None``: not read, the
        worker cannot claim them yet), or the next schedule tick, and at most the poll
        interval."""
        until_due = None  # None: no future run_at and no lease
        if cursor is not None:
            held = sorted({held.job.id for held in self._held.snapshot()})
            until_due = self._execute_on_queues(
                cursor,
                (
                    sql.claims.SECONDS_UNTIL_DUE_ANY_QUEUE,
                    sql.claims.SECONDS_UNTIL_DUE_ONE_QUEUE,
                    sql.claims.SECONDS_UNTIL_DUE_QUEUES,
                ),
                {"held": held, "horizon": self.poll_interval},
            )
        timeout = min(self.poll_interval, math.inf if until_due is None else until_due)
        next_tick = self._scheduler.next_due if self._scheduler is not None else None
        if next_tick is not None:
            timeout = min(timeout, (next_tick - timezone.now()).total_seconds())
        timeout = min(timeout, self._observer.seconds_until_due())
        timeout = min(timeout, self._limited_retry_at - time.monotonic())
        if self._flow is not None:
            timeout = min(timeout, self._flow.reload_at - time.monotonic())
        return max(timeout, 0.0)

    def _applied(self, outcome: Outcome) -> None:
        """The completer recorded ``outcome``: the job is no longer held (and, in a lane,
        the lane's next job may be made ready; under a limit, a job the limit held back may
        be claimed: unless the last limited claim found every limit far from binding, the
        next turn claims limited jobs first, as nothing announces it). An outcome that may
        have made a job ready (anything but an ack, or the end of a job in a lane or under a
        limit) ends the drained state (:meth:`_claim_may_wait`): the turn claims."""
        job = outcome.job
        self._held.discard(job.lease)
        self._outstanding -= 1
        if job.ordering_key is not None:
            self._finished_lanes.add(job.ordering_key)
        limited = self._limited(job)
        if limited and not self._limited_far:
            self._limited_queue_named.set()
        if outcome.action not in _ACKS or job.ordering_key is not None or limited:
            self._drained_until = 0.0  # it may have made a job ready: the turn claims

    def _limited(self, job: claims.ClaimedJob) -> bool:
        """Whether ``job`` is under a limit (its queue's or its kind's): its end may free a
        slot of a concurrency limit."""
        flow = self._flow
        return flow is not None and (job.queue in flow.queue_limits or job.kind in flow.kind_limits)

    def _flush(self, cursor: psycopg.Cursor[Any]) -> None:
        """Record the waiting outcomes, then make the next job of each lane whose job ended
        ready (:func:`django_jobq.lanes.promote`, after the outcomes' commit; a crash in
        between leaves it to maintenance)."""
        self._completer.flush(cursor)
        if self._finished_lanes:
            finished = set(self._finished_lanes)
            lanes.promote(cursor, finished)
            self._finished_lanes.difference_update(finished)

    def _turn(self, connection: psycopg.Connection[Any]) -> float | None:
        """One pass of the main loop: record outcomes, then claim (or, once stopping,
        release the prefetched jobs).

        Returns:
            Seconds to wait for the next wake-up (0: go on at once; ``math.inf``: until
            woken), or ``None`` when the worker is done.

        Raises:
            psycopg.Error: a statement failed; nothing done so far is lost.
        """
        if connection.prepare_threshold is None and self._prepares_statements():
            connection.prepare_threshold = PREPARE_THRESHOLD
        cursor = db.kept_cursor(connection, "loop", psycopg.Connection.cursor)
        taken = self._take_outcomes()
        self._completer.pending.extend(taken)
        if self._listener is not None:
            self._listener.read_waiting()  # a notification that came with the outcomes
        # A job was announced: claim it first, then record the outcomes (an ack statement
        # before the claim would add its round trip to the job's pickup).
        claim_first = self._announced.is_set() and not self._stopping.is_set()
        if claim_first:
            self._announced.clear()
        else:
            self._flush(cursor)
        self._observer.tick(cursor)
        if self._stopping.is_set():
            return self._shutdown_turn(cursor)
        if self._announcer.behind():
            # task_finished's receivers are far behind: no claim until they catch up (the
            # announcer wakes the loop); outcomes are recorded meanwhile, leases extended.
            if claim_first:
                self._flush(cursor)
            return math.inf
        if not claim_first and self._claim_may_wait(taken):
            return max(0.0, self._drained_until - time.monotonic())
        timeout = self._claim_turn(connection, cursor)
        if (
            isinstance(connection, db.WatchedConnection)
            and connection.prepare_threshold is not None
        ):
            self._plans.refresh(connection)  # after the claims: their jobs are handed on
        if claim_first:
            outstanding = self._outstanding
            self._flush(cursor)
            if self._outstanding < outstanding and self._claim_was_short:
                return 0.0  # the acks freed room the claim lacked: claim again at once
            if self._limited_queue_named.is_set():
                return 0.0  # a limited job's end freed a slot: claim limited jobs at once
        return timeout

    def _claim_may_wait(self, taken: Sequence[Outcome]) -> bool:
        """Whether a turn that took the outcomes ``taken`` and recorded every waiting one may
        skip its claim, and wait until :attr:`_drained_until`: no job can have become ready
        that a claim would find. A claim's turn set that deadline (:meth:`_drained`): the
        claim took fewer jobs than it asked for and the turn read when the next job falls
        due. It holds while that deadline has not come, the listener has stayed connected
        (the jobs enqueued since were announced, and an announcement makes the turn claim
        first), no limited job is known to wait, and every outcome recorded since was an ack
        of a job in no lane and under no limit (:meth:`_applied` ends it otherwise). Never
        for a burst worker: it claims to find out that it is done."""
        return (
            bool(taken)
            and not self.burst
            and not self._limited_pending
            and not self._limited_queue_named.is_set()
            and not self._completer.pending
            and time.monotonic() < self._drained_until
            and self._listener is not None
            and self._listener.listening.is_set()
            and self._listener.reconnects == self._drained_at_reconnects
        )

    def _claim_turn(
        self, connection: psycopg.Connection[Any], cursor: psycopg.Cursor[Any]
    ) -> float | None:
        """The rest of a turn that is not stopping: maintenance, the statistics check
        (:mod:`.statistics`), the scheduler, the claim; returns what :meth:`_turn` does."""
        self._drained_until = 0.0
        self._maintenance.run_if_due(connection)
        # Before the claim: a backlog its statistics do not know is analysed before the
        # claim is planned (and the statement before the loop sleeps stays the due-time one).
        self._statistics.run_if_due(connection)
        if self._scheduler is not None:
            # The scheduler enqueues through this thread's Django connection: its
            # statements are bounded like the loop's own.
            django_connection = connections[get_settings().DATABASE]
            with self._watchdog.guard("scheduler", lambda: django_connection.connection):
                self._scheduler.run_if_due()
        # Read after the sweep (it may hand results over) and before the claim: a receiver
        # that enqueues a job and returns during the claim leaves the announcer idle, and
        # the claim without that job.
        announced_all = self._announcer.idle()
        flow = self._flow_state(cursor)
        flow.guard.checked = False
        # Limited jobs, for idle handler slots (and the prefetch, far from their limits):
        # before the plain claim while some may be waiting (or a limited queue got a job),
        # else after it, once the plain claim's jobs are handed on, and only when a limited
        # job may have come since the last limited claim found none (a quiet limited queue
        # then adds nothing to the pickup of the others). Each claim's jobs are handed on as
        # soon as it returns.
        if self._limited_queue_named.is_set():
            self._limited_queue_named.clear()
            self._limited_pending = True
        self._limited_full = False
        limited_first = self._limited_pending
        limited = self._claim_limited(connection, flow) if limited_first else []
        start_failed = self._hand_on(cursor, limited)
        # Refill the prefetch only once half a batch of room is free: small claims would
        # cost a statement (and a commit) for a job or two.
        room = self._capacity - self._outstanding
        limit = min(self.batch_size, room) if room >= self._refill_at else 0
        self._claim_was_short = limit < self.batch_size
        queues, excluded = self._open_queues(flow)
        kinds = flow.unlimited_kinds(self.kinds)
        if queues == [] or not kinds:
            limit = 0  # every queue it serves is paused or limited (or every kind limited)
            if not flow.guard.checked:  # no limited claim compared the digest this turn
                flow_state.digest_changed(cursor, flow)
        if limit:
            if crash_points.reach is not None:
                crash_points.reach("before_claim")
            if self._positions.seconds_until_probe() == 0:
                self._probe(cursor)
        claimed = self._claim_plain(
            cursor,
            worker_id=self.worker_id,
            limit=limit,
            queues=queues,
            kinds=kinds,
            positions=self._positions,
            excluded_queues=excluded,
            flow=flow.guard,
        )
        plain = claimed.jobs
        start_failed = self._hand_on(cursor, plain, claimed) or start_failed
        if (
            not limited_first
            and not flow.guard.changed
            and start_failed is None
            and self._limited_may_wait()
        ):
            limited = self._claim_limited(connection, flow)
            start_failed = self._hand_on(cursor, limited)
        if start_failed is not None:
            raise start_failed
        if flow.stale:
            return 0.0  # the pauses or limits changed: read them, and claim again at once
        if ((limit and len(plain) == limit) or self._limited_full) and (
            self._outstanding < self._capacity
        ):
            return 0.0  # more may be waiting: claim again at once
        jobs = limited + plain
        if limit and not jobs and self._positions.is_set():
            # The claim read from this process's positions: before waiting (or stopping),
            # look from the start once the probe is due, and claim again if it found a job.
            if self.burst or self._positions.seconds_until_probe() == 0:
                if self._probe(cursor):
                    return 0.0
            else:
                return min(self._idle_timeout(cursor), self._positions.seconds_until_probe())
        if not jobs and self._outstanding == 0 and self.burst:
            if not announced_all:
                return math.inf  # its receivers may enqueue jobs: look again once they ran
            if self._limited_held_elsewhere:
                return LIMITED_RETRY_INTERVAL  # its jobs may be claimable: not done yet
            if not self._any_running(cursor):
                return None
            # Only other workers' jobs are left: look again soon (their acks notify nobody).
            return min(self._idle_timeout(cursor), BURST_RECHECK_INTERVAL)
        # Wait for an outcome to free room, a notification, or the poll interval; when the
        # claim took every due job, at most until the next one falls due (or a limited
        # claim may be tried again). With too little room to claim, a job that falls due
        # waits for an outcome to free room, which wakes the loop: no statement asks when.
        if (len(plain) < limit or not limit) and not self._limited_full:
            may_claim = self._capacity - self._outstanding >= self._refill_at
            timeout = self._idle_timeout(cursor if may_claim else None)
            if may_claim and limit:
                self._drained(timeout)
            return timeout
        # A claim took all it asked for, and the prefetch is full: its jobs' outcomes wake
        # the loop.
        return min(self.poll_interval, max(0.0, self._limited_retry_at - time.monotonic()))

    def _claim_plain(
        self, cursor: psycopg.Cursor[Any], *, limit: int, **claim_arguments: Any
    ) -> task_results.TasksClaim:
        """The plain claim (:func:`django_jobq.claims.claim`). Where the connection keeps
        session state (the listener's check), a worker that runs tasks, and whose last claim
        that took jobs took a task's, starts the claim's tasks in the claim's round trip
        (:func:`django_jobq.task_results.claim_and_start`); a worker whose claims take plain
        jobs only sends no statement about task results, nor does one for a while after
        that start found the task results' table locked (a migration's lock): then each
        task's runner starts its own."""
        if (
            limit
            and self._claims_take_tasks
            and time.monotonic() >= self._start_tasks_apart_until
            and self._keeps_session_state()
            and psycopg.Pipeline.is_supported()
        ):
            claimed = task_results.claim_and_start(
                cursor, task_kinds=self._task_kinds, limit=limit, **claim_arguments
            )
            if claimed.results_locked:
                apart = task_results.START_APART_AFTER_LOCK
                self._start_tasks_apart_until = time.monotonic() + apart
        else:
            jobs = claims.claim(cursor, limit=limit, **claim_arguments)
            # While the task results' table was found locked, each task's runner starts its
            # own, waiting for the lock on its handler thread rather than on the main loop.
            apart = time.monotonic() < self._start_tasks_apart_until
            claimed = task_results.TasksClaim(
                jobs, frozenset(job.lease for job in jobs) if apart else frozenset()
            )
        if claimed.jobs and self._task_kinds:
            self._claims_take_tasks = any(
                task_results.handler(job.kind) is not None for job in claimed.jobs
            )
        return claimed

    def _drained(self, timeout: float) -> None:
        """Note that this turn's claim took fewer jobs than it asked for (its queues drained)
        and that the turn, having read when the next job falls due, waits ``timeout`` seconds
        at most (see :meth:`_claim_may_wait`); with claim positions set, only until the probe
        is due. (A claim from positions that took nothing sets no deadline: its turn probes
        or waits for the probe instead.)"""
        if self._listener is None:
            return
        if self._positions.is_set():
            timeout = min(timeout, self._positions.seconds_until_probe())
        self._drained_until = time.monotonic() + timeout
        self._drained_at_reconnects = self._listener.reconnects

    def _limited_may_wait(self) -> bool:
        """Whether a limited job may wait that no limited claim has seen: a job that a kind
        limit may bind was announced, or the last limited claim that found none is at least a
        poll interval old (or the loop woke by the clock: a job fell due); always, for a burst
        worker."""
        if self._limited_maybe.is_set() or self.burst:
            # A burst worker claims limited jobs every turn: it must not stop while one it
            # could run waits (for a slot that another worker's job freed, say).
            self._limited_maybe.clear()
            return True
        return time.monotonic() >= self._limited_idle_until

    def _hand_on(
        self,
        cursor: psycopg.Cursor[Any],
        jobs: list[claims.ClaimedJob],
        claimed: task_results.TasksClaim | None = None,
    ) -> psycopg.Error | None:
        """Hand a claim's ``jobs`` to the handler threads (or the event loop), and record at
        once those that must not run; return the error of the tasks' start if it failed
        for the connection (:func:`django_jobq.db.is_connection_fault`; the jobs are handed
        on all the same: the caller then lets the loop reconnect). ``claimed``: how the
        claim of ``jobs`` started their tasks itself (:meth:`_claim_plain`)."""
        if not jobs:
            return None
        if crash_points.reach is not None:
            crash_points.reach("after_claim")
        try:
            if claimed is not None and claimed.start_error is not None:
                raise claimed.start_error  # the start sent with the claim failed: as below
            # Before a handler thread can take one.
            task_results.start_claimed(cursor, jobs, tried=claimed.tried if claimed else ())
        except psycopg.Error as exc:
            # The jobs are leased whatever happened to this informative write: hand them on
            # (each task's runner then starts it itself), then let the loop reconnect if the
            # connection failed. A failure of one task's data (a payload written past
            # enqueue: no result id) is that task's: its runner meets it again, and its
            # attempt fails with it.
            start_failed: psycopg.Error | None = exc if db.is_connection_fault(exc) else None
            if start_failed is None:
                logger.warning(
                    "worker %s: starting the claim's tasks failed (%s); each task's runner "
                    "starts its own",
                    self.worker_id,
                    text.first_line(str(exc)),
                )
        else:
            start_failed = None
        for job in jobs:
            # A job that must not run (poison row, expired, exhausted) is recorded at once,
            # without waiting for a handler thread or being heartbeated.
            refused = refusal(job)
            if refused is None:
                self._submit(self._hold(job))
            else:
                self._rated.pop(job.id, None)  # its logged start counts, on the safe side
                self._report(refused)
        self._pool.let_start()
        self._observer.claimed(jobs)  # after let_start: off a lone job's pickup
        self._outstanding += len(jobs)
        self._claimed += len(jobs)
        return start_failed

    def _flow_state(self, cursor: psycopg.Cursor[Any]) -> flow_state.FlowState:
        """What this worker knows of pauses and limits, loaded again when out of date (the
        claim positions then start afresh: a resumed queue's jobs lie behind them)."""
        if self._flow is None or self._flow.stale:
            self._flow = flow_state.load(cursor)
            self._positions = ClaimPositions()
        return self._flow

    def _open_queues(self, flow: flow_state.FlowState) -> tuple[list[str] | None, frozenset[str]]:
        """The queues a plain claim takes from (``None``: every queue) and, then, those it
        leaves out: the paused and limited ones."""
        excluded = flow.excluded_queues()
        if self.queues is None:
            return None, excluded
        return [queue for queue in self.queues if queue not in excluded], frozenset()

    def _claim_limited(
        self, connection: psycopg.Connection[Any], flow: flow_state.FlowState
    ) -> list[claims.ClaimedJob]:
        """Claim jobs of limited queues and kinds for the idle handler slots
        (:mod:`django_jobq.limited_claims`), and for the prefetch too while the limits are
        far from binding; note whether limited jobs may still wait (then the next turn
        claims them first), and when to try again if a limit's row was held by another
        worker or a rate limit stopped the claim."""
        idle = max(0, self._slots - self._outstanding)
        room = self._capacity - self._outstanding
        prefetch = room - idle if room >= self._refill_at else 0
        if self._stopping.is_set():
            return []
        if idle == 0 and not (self._limited_far and prefetch > 0):
            self._limited_pending = bool(flow.queue_limits or flow.kind_limits)
            return []
        result = limited_claims.claim_limited(
            connection,
            worker_id=self.worker_id,
            limit=idle,
            prefetch=prefetch,
            queues=self.queues,
            kinds=self.kinds,
            state=flow,
        )
        self._limited_far = result.far_from_binding
        self._limited_full = result.full
        self._limited_held_elsewhere = result.held_elsewhere
        retry_in = LIMITED_RETRY_INTERVAL if result.held_elsewhere else math.inf
        if result.next_start_in is not None:
            retry_in = min(retry_in, result.next_start_in)
        self._limited_retry_at = time.monotonic() + retry_in
        self._limited_pending = bool(result.jobs) or result.held_elsewhere or retry_in < math.inf
        quiet = not self._limited_pending  # it found no job, and nothing to try again
        self._limited_idle_until = time.monotonic() + self.poll_interval if quiet else 0.0
        self._rated.update(result.rated)
        return result.jobs

    def _prepares_statements(self) -> bool:
        """Whether the main loop's connection may prepare its statements: ``DATABASES``'
        ``OPTIONS`` do not set ``prepare_threshold`` (else psycopg follows them), and it
        keeps session state (:meth:`_keeps_session_state`; PgBouncer before 1.21 cannot carry
        prepared statements in transaction mode). With ``listen=False`` nothing proves it,
        and nothing is prepared."""
        return not db.prepares_by_choice() and self._keeps_session_state()

    def _keeps_session_state(self) -> bool:
        """Whether the main loop's connection keeps session state between transactions: the
        listener, connected with the same alias, heard its check notification. A connection
        that keeps a ``LISTEN`` across transactions reaches PostgreSQL directly or through a
        pool in session mode; a pool in transaction mode fails that check."""
        return (
            self._listener_proves_session
            and self._listener is not None
            and self._listener.keeps_session_state.is_set()
        )

    def _probe(self, cursor: psycopg.Cursor[Any]) -> bool:
        """Run the claim positions' probe; whether a job waits behind a position."""
        flow = self._flow
        if flow is None:
            return claims.probe_claim_positions(
                cursor, self._positions, queues=self.queues, kinds=self.kinds
            )
        queues, excluded = self._open_queues(flow)
        if queues == []:
            return False
        return claims.probe_claim_positions(
            cursor,
            self._positions,
            queues=queues,
            kinds=flow.unlimited_kinds(self.kinds),
            excluded_queues=excluded,
        )

    def _any_running(self, cursor: psycopg.Cursor[Any]) -> bool:
        """Whether a job of this worker's queues is running, its lease live or lapsed."""
        return bool(
            self._execute_on_queues(
                cursor,
                (
                    sql.claims.RUNNING_JOB_EXISTS_ANY_QUEUE,
                    sql.claims.RUNNING_JOB_EXISTS_ONE_QUEUE,
                    sql.claims.RUNNING_JOB_EXISTS_QUEUES,
                ),
                {},
            )
        )

    def _shutdown_turn(self, cursor: psycopg.Cursor[Any]) -> float | None:
        """Release prefetched jobs; finish once nothing is outstanding or time is up."""
        self._to_release.extend(self._pool.take_unstarted())
        self._to_release.extend(self._async.take_unstarted())
        if self._to_release:
            released = task_results.release(cursor, [held.job.lease for held in self._to_release])
            self._released += len(released)
            done = [held for held in self._to_release if held.job.id not in released.busy]
            for held in done:
                self._held.discard(held.job.lease)
            self._outstanding -= len(done)
            self._to_release = [held for held in self._to_release if held.job.id in released.busy]
        if (self._outstanding == 0 and self._announcer.idle()) or self._shutdown_time_is_up():
            return None
        time_left = self._shutdown_time_left()
        return math.inf if time_left is None else time_left

    def _shutdown_time_is_up(self) -> bool:
        time_left = self._shutdown_time_left()
        if time_left is None or time_left > 0:
            return False
        self._abandoned = self._outstanding
        return True

    def run(self) -> WorkerStats:
        """Run until stopped (or, in burst mode, idle); return what was done. A worker runs
        once.

        Database connection errors do not end it (they are logged, and the worker reconnects
        with backoff); other errors, which are bugs, are raised after the worker's threads
        stop.
        """
        started = time.monotonic()
        logger.info(
            "worker %s starting: queues=%s concurrency=%s async_concurrency=%s batch_size=%s "
            "kinds=%s (%s)",
            self.worker_id,
            ",".join(self.queues) if self.queues else "*",
            self.concurrency,
            self.async_concurrency if self.serves_async else "-",
            self.batch_size,
            len(self.kinds),
            registry.kinds_fingerprint(self.kinds),
        )
        logger.debug("worker %s claims kinds: %s", self.worker_id, ", ".join(self.kinds))
        if not self.kinds:
            logger.warning(
                "worker %s has no job kinds registered: it will claim nothing. Are the apps "
                "with jobs.py (or tasks.py) in INSTALLED_APPS of these settings?",
                self.worker_id,
            )
        connection: psycopg.Connection[Any] | None = None
        delays = reconnect_delays()
        busy_delays = doubling(*BUSY_RETRY_DELAYS)
        failed = False
        self._watchdog.start()
        self._heartbeater.start()
        if self._listener is not None:
            self._listener.start()
        self._pool.start()
        self._announcer.start()
        if self.serves_async:
            self._async.start()
        try:
            while True:
                self._wakeup.clear()
                self._progress.busy()
                try:
                    if connection is None:
                        connection = self._connect()
                    if not self._observing:
                        self._observer.start(connection.cursor())
                        self._observing = True
                    timeout = self._turn(connection)
                    if timeout is not None and (self._completer.pending or self._to_release):
                        timeout = min(timeout, next(busy_delays))  # rows that were busy
                    else:
                        busy_delays = doubling(*BUSY_RETRY_DELAYS)
                    delays = reconnect_delays()
                except psycopg.Error as exc:
                    # A lost connection, or a prepared statement a migration made stale (a
                    # new connection prepares it afresh): reconnect. Other errors are bugs.
                    if not db.is_connection_fault(exc):
                        raise
                    self._drained_until = 0.0  # the next turn claims
                    if connection is not None:
                        connection.close()
                        connection = None
                    if self._stopping.is_set() and self._shutdown_time_is_up():
                        break
                    self._back_off(next(delays), exc)
                    continue
                self._progress.progressed()
                if timeout is None:
                    break
                # Even with no time to wait: notifications that came during the turn are
                # read now, so the next turn claims the announced jobs first.
                if not self._wait_for_wake(timeout) and timeout > 0:
                    self._limited_idle_until = 0.0  # woken by the clock: a job fell due
        except BaseException:
            failed = True
            raise
        finally:
            self._exit(connection, wait=not (failed or self._abandoned))
        return self._finish(time.monotonic() - started)

    def _connect(self) -> psycopg.Connection[Any]:
        """Open the main loop's connection, within the shutdown deadline if stopping."""
        name = f"jobq worker {self.worker_id}"
        time_left = self._shutdown_time_left()
        connection = db.connect(application_name=name, connect_timeout=time_left)
        self._failures.restored("worker %s: database connection restored", self.worker_id)
        return self._watchdog.watch(connection, name)

    def _back_off(self, delay: float, exc: psycopg.Error) -> None:
        """Log a database error (with back-off) and wait ``delay`` seconds before the
        reconnect, never past the shutdown deadline."""
        self._reconnects += 1
        self._failures.failed(
            "worker %s: database error, reconnecting in %.2g s (%s outcome(s) waiting to be "
            "recorded): %s",
            self.worker_id,
            delay,
            len(self._completer.pending),
            exc,
        )
        # Outcomes arriving meanwhile must not hasten the reconnect, a stop may (it has
        # jobs to release). What woke the loop meanwhile is handled by the turn after it.
        # The wait watches the listener's socket too: a listener connection lost in the
        # same outage is found now and reopened by its thread meanwhile.
        if not self._stopping.is_set():
            deadline = time.monotonic() + delay
            while (backoff_left := deadline - time.monotonic()) > 0:
                self._wakeup.clear()  # then look, then wait (see Wakeup)
                if self._stopping.is_set():
                    break
                self._wait_for_wake(backoff_left)
            return
        time_left = self._shutdown_time_left()
        time.sleep(delay if time_left is None else max(0.0, min(delay, time_left)))

    def _exit(self, connection: psycopg.Connection[Any] | None, *, wait: bool) -> None:
        """Stop the threads and deregister, within :data:`EXIT_TIMEOUT` seconds together.

        Normally nothing is left here. After an error or the shutdown deadline, held jobs
        are left to lapse and other workers reclaim them: stop heartbeating and do not wait
        for running handlers (the process is about to exit; a handler running on without
        its lease would overlap the next attempt). ``wait``: wait for the handler threads.
        """
        exit_by = self._exit_by = time.monotonic() + EXIT_TIMEOUT
        self._heartbeater.stop()
        if self._listener is not None:
            self._listener.stop(timeout=max(0.0, exit_by - time.monotonic()))
        self._pool.take_unstarted()
        self._async.take_unstarted()
        self._pool.stop(wait=wait, timeout=max(0.0, exit_by - time.monotonic()))
        self._async.stop(wait=wait, timeout=max(0.0, exit_by - time.monotonic()))
        if connection is not None:
            if self._observing:
                self._observer.stop(connection.cursor())
            connection.close()
        # Normally idle by now; after an error or the shutdown deadline, its receivers get
        # what is left of the exit's time, after the worker's deregistration.
        self._announcer.stop(timeout=max(0.0, exit_by - time.monotonic()))
        self._watchdog.stop()

    def _finish(self, elapsed: float) -> WorkerStats:
        stats = WorkerStats(
            worker_id=self.worker_id,
            elapsed=elapsed,
            claimed=self._claimed,
            released=self._released,
            abandoned=self._abandoned,
            heartbeats=self._heartbeater.heartbeats,
            heartbeats_refused=self._heartbeater.refused,
            outcome_counts=self._completer.outcome_counts,
        )
        if self._abandoned and self.shutdown_timeout is None:
            logger.warning(
                "worker %s: the database could not be reached for %g s after the last job "
                "finished: %s outcome(s) or release(s) not recorded; their leases will lapse "
                "and other workers will run them again",
                self.worker_id,
                FINAL_WRITES_TIMEOUT,
                self._abandoned,
            )
        elif self._abandoned:
            logger.warning(
                "worker %s: shutdown timeout (%g s) passed with %s job(s) still held (running, "
                "not yet released, or finished with the outcome not yet recorded); "
                "their leases will lapse and other workers will retry them",
                self.worker_id,
                self.shutdown_timeout,
                self._abandoned,
            )
        counts = stats.outcome_counts
        logger.info(
            "worker %s stopped after %.1f s: %s succeeded, %s retried, %s dead-lettered, "
            "%s released, %s lease lost, %s heartbeats (%s refused)",
            self.worker_id,
            stats.elapsed,
            counts.succeeded,
            counts.retried,
            counts.dead_lettered,
            self._released,
            counts.lease_lost,
            stats.heartbeats,
            stats.heartbeats_refused,
        )
        return stats
