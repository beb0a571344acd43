"""The worker's main loop.

One thread (the caller of :meth:`Worker.run`) owns a psycopg connection and does all the
queue bookkeeping: it claims jobs in batches, hands them to the executor threads, and
records their outcomes. Data flows one way: claim → executor → outcome → completer. A
heartbeater thread keeps the leases of every held job alive meanwhile, and a listener
thread wakes the loop when a job is enqueued (LISTEN/NOTIFY).

The loop survives the loss of its connection: it logs, reconnects with backoff and carries
on. Outcomes reported meanwhile wait in the completer and are recorded after the reconnect
(or, if the outage outlasts a lease, are refused as lost leases and the jobs run again).

A worker holds at most ``concurrency + batch_size`` leased jobs: one running per executor
thread and up to ``batch_size`` claimed ahead (prefetched).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from django.utils import timezone

from .. import db, faults, leases, registry, sql, task_results
from ..conf import get_settings
from .completer import Completer, Tally
from .executor import ExecutorPool, Outcome, refusal
from .heartbeat import Heartbeater
from .held import HeldJob, HeldJobs
from .listener import Listener, reconnect_delays
from .maintenance import Maintenance
from .observer import Observer
from .scheduler import Scheduler

logger = logging.getLogger("django_jobq.worker")

#: Bounds of the worker's options (sizes that fit the database's integers and a process).
MAX_CONCURRENCY = 1000
MAX_BATCH_SIZE = 10_000
MAX_POLL_INTERVAL = 3600.0
MAX_WORKER_ID_LENGTH = 200  # Job.worker_id's max_length
#: Seconds a finished job's outcome may wait for others to share its ack statement (one
#: commit for many jobs instead of one each). Short, so acks are still recorded promptly.
ACK_FLUSH_DELAY = 0.005


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
    tally: Tally


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class Worker:
    """Claims and runs jobs until :meth:`stop` is called (or, in burst mode, until idle).

    Args:
        queues: queues to claim from; ``None`` means every queue.
        concurrency: executor threads, each with its own Django connection (>= 1).
        batch_size: the most jobs one claim takes, and the prefetch bound (>= 1).
        poll_interval: the most seconds an idle worker waits before claiming again (default
            ``JOBQ['POLL_INTERVAL']``); a notification, a ``run_at`` or lease deadline that
            falls due, or a schedule tick wakes it sooner.
        worker_id: recorded on claimed jobs; defaults to ``host:pid``.
        burst: return as soon as no job is due and none is in flight.
        shutdown_timeout: seconds running jobs may take to finish after :meth:`stop`;
            ``None`` waits for them however long they take.
        scheduler: run the scheduler, which enqueues the jobs of due schedule ticks
            (:mod:`django_jobq.schedules`); on by default.
        listen: wake on enqueue notifications (LISTEN on a connection of its own); off, the
            worker only polls (e.g. behind a PgBouncer in transaction mode).

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
    ) -> None:
        if not 1 <= concurrency <= MAX_CONCURRENCY:
            raise ValueError(f"concurrency must be 1 to {MAX_CONCURRENCY}, not {concurrency}.")
        if batch_size is not None and not 1 <= batch_size <= MAX_BATCH_SIZE:
            raise ValueError(f"batch_size must be 1 to {MAX_BATCH_SIZE}, not {batch_size}.")
        if shutdown_timeout is not None and not 0 <= shutdown_timeout < math.inf:
            raise ValueError(f"shutdown_timeout must be >= 0 seconds, not {shutdown_timeout}.")
        if worker_id is not None and not 0 < len(worker_id) <= MAX_WORKER_ID_LENGTH:
            raise ValueError(f"worker_id must be 1 to {MAX_WORKER_ID_LENGTH} characters.")
        settings = get_settings()
        self.queues = list(queues) if queues else None
        self.concurrency = concurrency
        self.batch_size = batch_size or concurrency
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
        self._wake = threading.Event()
        self._outcomes: list[Outcome] = []
        self._outcomes_changed = threading.Condition()
        self._first_outcome_at = 0.0  # time.monotonic() of the oldest untaken outcome
        self._held = HeldJobs()
        self._scheduler = Scheduler() if scheduler else None
        self._listener = (
            Listener(queues=self.queues, wake=self._wake.set, worker_id=self.worker_id)
            if listen
            else None
        )
        self._heartbeater = Heartbeater(self._held, worker_id=self.worker_id)
        self._pool = ExecutorPool(
            concurrency,
            report=self._report,
            extend=self._heartbeater.extend_one,
            name=self.worker_id,
        )
        self._observer = Observer(
            worker_id=self.worker_id, queues=self.queues, concurrency=concurrency
        )
        self._observing = False  # registered (on the first connection)
        self._completer = Completer(on_applied=self._applied, observer=self._observer)
        self._maintenance = Maintenance()
        self._capacity = self.concurrency + self.batch_size
        self._refill_at = max(1, self.batch_size // 2)
        self._outstanding = 0  # claimed and not yet recorded (prefetched, running, reported)
        self._to_release: list[HeldJob] = []
        self._claimed = self._released = self._abandoned = self._reconnects = 0
        task_results.discover()

    def stop(self) -> None:
        """Ask the worker to stop: no new claims, prefetched jobs released, running jobs
        finish (within the shutdown timeout). Safe from a signal handler or another thread."""
        if self._stop_requested_at is None:
            self._stop_requested_at = time.monotonic()
        self._stopping.set()
        self._wake.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def _report(self, outcome: Outcome) -> None:
        with self._outcomes_changed:
            if not self._outcomes:
                self._first_outcome_at = time.monotonic()
            self._outcomes.append(outcome)
            self._outcomes_changed.notify()
        self._wake.set()

    def _take_outcomes(self) -> list[Outcome]:
        """Take the reported outcomes, first letting others arrive for up to
        :data:`ACK_FLUSH_DELAY` after the oldest (unless every thread has reported, or the
        worker is stopping), so that one ack statement records many jobs."""
        with self._outcomes_changed:
            if self._outcomes and not self._stopping.is_set():
                deadline = self._first_outcome_at + ACK_FLUSH_DELAY
                self._outcomes_changed.wait_for(
                    lambda: len(self._outcomes) >= self.concurrency or self._stopping.is_set(),
                    timeout=max(0.0, deadline - time.monotonic()),
                )
            taken, self._outcomes = self._outcomes, []
        return taken

    def _hold(self, job: leases.ClaimedJob) -> HeldJob:
        definition = registry.get(job.kind)
        held = HeldJob(job, max_runtime=definition.max_runtime if definition else None)
        self._held.add(held)
        return held

    def _shutdown_time_left(self) -> float | None:
        if self.shutdown_timeout is None or self._stop_requested_at is None:
            return None
        return self._stop_requested_at + self.shutdown_timeout - time.monotonic()

    def _idle_timeout(self, cursor: leases.Cursor) -> float:
        """Seconds to sleep when nothing is due: until the next ready job's ``run_at``, the
        next lease deadline (of another worker's job) or the next schedule tick, and at most
        the poll interval."""
        params = {"worker_id": self.worker_id, "horizon": self.poll_interval}
        if self.queues is None:
            cursor.execute(sql.SECONDS_UNTIL_DUE_ANY_QUEUE, params)
        elif len(self.queues) == 1:
            cursor.execute(sql.SECONDS_UNTIL_DUE_ONE_QUEUE, {**params, "queue": self.queues[0]})
        else:
            cursor.execute(sql.SECONDS_UNTIL_DUE_QUEUES, {**params, "queues": self.queues})
        ((until_due,),) = cursor.fetchall()  # None: no future run_at and no lease
        timeout = min(self.poll_interval, math.inf if until_due is None else until_due)
        next_tick = self._scheduler.next_due if self._scheduler is not None else None
        if next_tick is not None:
            timeout = min(timeout, (next_tick - timezone.now()).total_seconds())
        timeout = min(timeout, self._observer.seconds_until_due())
        return max(timeout, 0.0)

    def _applied(self, outcome: Outcome) -> None:
        """The completer recorded ``outcome``: the job is no longer held."""
        self._held.discard(outcome.job.lease)
        self._outstanding -= 1

    def _turn(self, connection: psycopg.Connection[Any]) -> float | None:
        """One pass of the main loop: record outcomes, then claim (or, once stopping,
        release the prefetched jobs).

        Returns:
            Seconds to wait for the next wake-up (0: go on at once; ``math.inf``: until
            woken), or ``None`` when the worker is done.

        Raises:
            psycopg.Error: a statement failed; nothing done so far is lost.
        """
        cursor = connection.cursor()
        self._completer.pending.extend(self._take_outcomes())
        self._completer.flush(cursor)
        self._observer.tick(cursor)
        if self._stopping.is_set():
            return self._shutdown_turn(cursor)
        self._maintenance.run_if_due(connection)
        if self._scheduler is not None:
            self._scheduler.run_if_due()
        # Refill the prefetch only once half a batch of room is free: small claims would
        # cost a statement (and a commit) for a job or two.
        room = self._capacity - self._outstanding
        limit = min(self.batch_size, room) if room >= self._refill_at else 0
        if limit:
            faults.reached("before_claim")
        jobs = leases.claim(cursor, worker_id=self.worker_id, limit=limit, queues=self.queues)
        if jobs:
            faults.reached("after_claim")
        self._observer.claimed(jobs)
        for job in jobs:
            # A job that must not run (poison row, expired, exhausted) is recorded at once,
            # without waiting for a handler thread or being heartbeated.
            refused = refusal(job)
            if refused is None:
                self._pool.submit(self._hold(job))
            else:
                self._report(refused)
        self._outstanding += len(jobs)
        self._claimed += len(jobs)
        if jobs and len(jobs) == limit and self._outstanding < self._capacity:
            return 0.0  # more may be waiting: claim again at once
        if not jobs and self._outstanding == 0 and self.burst:
            return None
        # Wait for an outcome to free room, a notification, or the poll interval; when the
        # claim took every due job, at most until the next one falls due.
        return self._idle_timeout(cursor) if len(jobs) < limit else self.poll_interval

    def _shutdown_turn(self, cursor: leases.Cursor) -> float | None:
        """Release prefetched jobs; finish once nothing is outstanding or time is up."""
        self._to_release.extend(self._pool.take_unstarted())
        if self._to_release:
            released = leases.release(cursor, [held.job.lease for held in self._to_release])
            self._released += len(released)
            for held in self._to_release:
                self._held.discard(held.job.lease)
            self._outstanding -= len(self._to_release)
            self._to_release = []
        if self._outstanding == 0 or self._shutdown_time_is_up():
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
            "worker %s starting: queues=%s concurrency=%s batch_size=%s",
            self.worker_id,
            ",".join(self.queues) if self.queues else "*",
            self.concurrency,
            self.batch_size,
        )
        connection: psycopg.Connection[Any] | None = None
        delays = reconnect_delays()
        failed = False
        self._heartbeater.start()
        if self._listener is not None:
            self._listener.start()
        self._pool.start()
        try:
            while True:
                self._wake.clear()
                try:
                    if connection is None:
                        connection = db.connect(application_name=f"jobq worker {self.worker_id}")
                        if self._reconnects:
                            logger.info("worker %s: database connection restored", self.worker_id)
                    if not self._observing:
                        self._observer.start(connection.cursor())
                        self._observing = True
                    timeout = self._turn(connection)
                    delays = reconnect_delays()
                except psycopg.OperationalError as exc:
                    if connection is not None:
                        connection.close()
                        connection = None
                    if self._stopping.is_set() and self._shutdown_time_is_up():
                        break
                    timeout = next(delays)
                    self._reconnects += 1
                    logger.warning(
                        "worker %s: database error, reconnecting in %.2g s (%s outcome(s) "
                        "waiting to be recorded): %s",
                        self.worker_id,
                        timeout,
                        len(self._completer.pending),
                        exc,
                    )
                    # Back off; outcomes arriving meanwhile must not hasten the reconnect, a
                    # stop may (it has jobs to release).
                    if self._stopping.is_set():
                        time.sleep(timeout)
                    else:
                        self._stopping.wait(timeout)
                    continue
                if timeout is None:
                    break
                if timeout > 0:
                    self._wake.wait(None if timeout == math.inf else timeout)
        except BaseException:
            failed = True
            raise
        finally:
            # Normally nothing is left here. After an error or the shutdown timeout, held
            # jobs are left to lapse and other workers reclaim them: stop heartbeating and
            # do not wait for running handlers (the process is about to exit; a handler
            # running on without its lease would overlap the next attempt).
            self._heartbeater.stop()
            if self._listener is not None:
                self._listener.stop()
            self._pool.take_unstarted()
            self._pool.stop(wait=not (failed or self._abandoned))
            if connection is not None:
                if self._observing:
                    self._observer.stop(connection.cursor())
                connection.close()
        return self._finish(time.monotonic() - started)

    def _finish(self, elapsed: float) -> WorkerStats:
        stats = WorkerStats(
            worker_id=self.worker_id,
            elapsed=elapsed,
            claimed=self._claimed,
            released=self._released,
            abandoned=self._abandoned,
            heartbeats=self._heartbeater.heartbeats,
            heartbeats_refused=self._heartbeater.refused,
            tally=self._completer.tally,
        )
        if self._abandoned:
            logger.warning(
                "worker %s: shutdown timeout (%g s) passed with %s job(s) still running; "
                "their leases will lapse and other workers will retry them",
                self.worker_id,
                self.shutdown_timeout,
                self._abandoned,
            )
        tally = stats.tally
        logger.info(
            "worker %s stopped after %.1f s: %s succeeded, %s retried, %s dead-lettered, "
            "%s released, %s lease lost, %s heartbeats (%s refused)",
            self.worker_id,
            stats.elapsed,
            tally.succeeded,
            tally.retried,
            tally.dead_lettered,
            self._released,
            tally.lease_lost,
            stats.heartbeats,
            stats.heartbeats_refused,
        )
        return stats
