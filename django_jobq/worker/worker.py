"""The worker's main loop.

One thread (the caller of :meth:`Worker.run`) owns a psycopg connection and does all the
queue bookkeeping: it claims jobs in batches, hands them to the executor threads, and
records their outcomes. Data flows one way: claim → executor → outcome → completer.

A worker holds at most ``concurrency + batch_size`` leased jobs: one running per executor
thread and up to ``batch_size`` claimed ahead (prefetched).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from .. import db, leases
from ..conf import get_settings
from .completer import Completer, Tally
from .executor import ExecutorPool, Outcome

logger = logging.getLogger("django_jobq.worker")


@dataclass(frozen=True)
class WorkerStats:
    """What a worker did, returned by :meth:`Worker.run`. ``elapsed`` is in seconds."""

    worker_id: str
    elapsed: float
    claimed: int
    released: int
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
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {concurrency}.")
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, not {batch_size}.")
        settings = get_settings()
        self.queues = list(queues) if queues else None
        self.concurrency = concurrency
        self.batch_size = batch_size or concurrency
        self.poll_interval = poll_interval if poll_interval is not None else settings.POLL_INTERVAL
        if self.poll_interval <= 0:
            raise ValueError(f"poll_interval must be positive, not {self.poll_interval}.")
        self.worker_id = worker_id or default_worker_id()
        self.burst = burst
        self._retry_delay = settings.RETRY_DELAY
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._outcomes: list[Outcome] = []
        self._outcomes_lock = threading.Lock()

    def stop(self) -> None:
        """Ask the worker to stop: no new claims, prefetched jobs released, running jobs
        finish. Safe to call from a signal handler or another thread."""
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

    def run(self) -> WorkerStats:
        """Run until stopped; return what was done. Raises on database errors."""
        started = time.monotonic()
        capacity = self.concurrency + self.batch_size
        outstanding = claimed_total = released = 0
        pool = ExecutorPool(self.concurrency, self._report, name=self.worker_id)
        logger.info(
            "worker %s starting: queues=%s concurrency=%s batch_size=%s",
            self.worker_id,
            ",".join(self.queues) if self.queues else "*",
            self.concurrency,
            self.batch_size,
        )
        with db.connect(application_name=f"jobq worker {self.worker_id}") as connection:
            cursor = connection.cursor()
            completer = Completer(cursor, retry_delay=self._retry_delay)
            pool.start()
            try:
                while True:
                    self._wake.clear()
                    outcomes = self._take_outcomes()
                    completer.complete(outcomes)
                    outstanding -= len(outcomes)
                    if self._stopping.is_set():
                        unstarted = pool.take_unstarted()
                        released += len(leases.release(cursor, [job.lease for job in unstarted]))
                        outstanding -= len(unstarted)
                        if outstanding == 0:
                            break
                        self._wake.wait()
                        continue
                    limit = min(self.batch_size, capacity - outstanding)
                    jobs = leases.claim(
                        cursor, worker_id=self.worker_id, limit=limit, queues=self.queues
                    )
                    for job in jobs:
                        pool.submit(job)
                    outstanding += len(jobs)
                    claimed_total += len(jobs)
                    if jobs and len(jobs) == limit and outstanding < capacity:
                        continue  # more may be waiting: claim again at once
                    if not jobs and outstanding == 0 and self.burst:
                        break
                    # Sleep until an outcome frees room, or the poll interval passes.
                    self._wake.wait(self.poll_interval)
            finally:
                # Normally nothing is left here. After a database error, jobs never started
                # are dropped: their leases lapse and another worker reclaims them.
                pool.take_unstarted()
                pool.stop()
        stats = WorkerStats(
            worker_id=self.worker_id,
            elapsed=time.monotonic() - started,
            claimed=claimed_total,
            released=released,
            tally=completer.tally,
        )
        tally = stats.tally
        logger.info(
            "worker %s stopped after %.1f s: %s succeeded, %s retried, %s dead-lettered, "
            "%s released, %s lease lost",
            self.worker_id,
            stats.elapsed,
            tally.succeeded,
            tally.retried,
            tally.dead_lettered,
            released,
            tally.lease_lost,
        )
        return stats
