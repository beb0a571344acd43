"""The worker's main loop.

One thread (the caller of :meth:`Worker.run`) owns a psycopg connection and does all the
queue bookkeeping: it claims jobs in batches, hands them to the executor threads, and
records their outcomes. Data flows one way: claim → executor → outcome → completer. A
heartbeater thread keeps the leases of every held job alive meanwhile.

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

from django.utils import timezone

from .. import db, faults, leases, registry, sql
from ..conf import get_settings
from .completer import Completer, Tally
from .executor import ExecutorPool, Outcome
from .heartbeat import Heartbeater
from .held import HeldJob, HeldJobs
from .maintenance import Maintenance
from .scheduler import Scheduler

logger = logging.getLogger("django_jobq.worker")

#: Bounds of the worker's options (sizes that fit the database's integers and a process).
MAX_CONCURRENCY = 1000
MAX_BATCH_SIZE = 10_000
MAX_POLL_INTERVAL = 3600.0
MAX_WORKER_ID_LENGTH = 200  # Job.worker_id's max_length


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
        poll_interval: seconds to sleep after a claim found nothing (default ``JOBQ``).
        worker_id: recorded on claimed jobs; defaults to ``host:pid``.
        burst: return as soon as no job is due and none is in flight.
        shutdown_timeout: seconds running jobs may take to finish after :meth:`stop`;
            ``None`` waits for them however long they take.
        scheduler: run the scheduler, which enqueues the jobs of due schedule ticks
            (:mod:`django_jobq.schedules`); on by default.

    Raises:
        ValueError: an option out of range.
        ImproperlyConfigured: with the scheduler, a declared schedule is invalid.
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
        self._outcomes_lock = threading.Lock()
        self._held = HeldJobs()
        self._scheduler = Scheduler() if scheduler else None

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
        with self._outcomes_lock:
            self._outcomes.append(outcome)
        self._wake.set()

    def _take_outcomes(self) -> list[Outcome]:
        with self._outcomes_lock:
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
        params = {"worker_id": self.worker_id}
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
        return max(timeout, 0.0)

    def run(self) -> WorkerStats:
        """Run until stopped; return what was done. Raises on database errors."""
        started = time.monotonic()
        capacity = self.concurrency + self.batch_size
        outstanding = claimed_total = released = abandoned = 0
        failed = False
        heartbeater = Heartbeater(self._held, worker_id=self.worker_id)
        pool = ExecutorPool(
            self.concurrency,
            report=self._report,
            extend=heartbeater.extend_one,
            name=self.worker_id,
        )
        logger.info(
            "worker %s starting: queues=%s concurrency=%s batch_size=%s",
            self.worker_id,
            ",".join(self.queues) if self.queues else "*",
            self.concurrency,
            self.batch_size,
        )
        with db.connect(application_name=f"jobq worker {self.worker_id}") as connection:
            cursor = connection.cursor()
            completer = Completer(cursor)
            maintenance = Maintenance(connection)
            heartbeater.start()
            pool.start()
            try:
                while True:
                    self._wake.clear()
                    outcomes = self._take_outcomes()
                    completer.complete(outcomes)
                    for outcome in outcomes:
                        self._held.discard(outcome.job.lease)
                    outstanding -= len(outcomes)
                    if self._stopping.is_set():
                        unstarted = pool.take_unstarted()
                        released += len(leases.release(cursor, [h.job.lease for h in unstarted]))
                        for held in unstarted:
                            self._held.discard(held.job.lease)
                        outstanding -= len(unstarted)
                        time_left = self._shutdown_time_left()
                        if outstanding == 0:
                            break
                        if time_left is not None and time_left <= 0:
                            abandoned = outstanding
                            break
                        self._wake.wait(time_left)
                        continue
                    maintenance.run_if_due()
                    if self._scheduler is not None:
                        self._scheduler.run_if_due()
                    limit = min(self.batch_size, capacity - outstanding)
                    faults.reached("before_claim")
                    jobs = leases.claim(
                        cursor, worker_id=self.worker_id, limit=limit, queues=self.queues
                    )
                    if jobs:
                        faults.reached("after_claim")
                    for job in jobs:
                        pool.submit(self._hold(job))
                    outstanding += len(jobs)
                    claimed_total += len(jobs)
                    if jobs and len(jobs) == limit and outstanding < capacity:
                        continue  # more may be waiting: claim again at once
                    if not jobs and outstanding == 0 and self.burst:
                        break
                    # Sleep until an outcome frees room, or the poll interval passes; when the
                    # claim took every due job, at most until the next one falls due.
                    self._wake.wait(
                        self._idle_timeout(cursor) if len(jobs) < limit else self.poll_interval
                    )
            except BaseException:
                failed = True
                raise
            finally:
                # Normally nothing is left here. After an error or the shutdown timeout, held
                # jobs are left to lapse and other workers reclaim them: stop heartbeating and
                # do not wait for running handlers (the process is about to exit; a handler
                # running on without its lease would overlap the next attempt).
                heartbeater.stop()
                pool.take_unstarted()
                pool.stop(wait=not (failed or abandoned))
        stats = WorkerStats(
            worker_id=self.worker_id,
            elapsed=time.monotonic() - started,
            claimed=claimed_total,
            released=released,
            abandoned=abandoned,
            heartbeats=heartbeater.heartbeats,
            heartbeats_refused=heartbeater.refused,
            tally=completer.tally,
        )
        if abandoned:
            logger.warning(
                "worker %s: shutdown timeout (%g s) passed with %s job(s) still running; "
                "their leases will lapse and other workers will retry them",
                self.worker_id,
                self.shutdown_timeout,
                abandoned,
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
            released,
            tally.lease_lost,
            stats.heartbeats,
            stats.heartbeats_refused,
        )
        return stats
