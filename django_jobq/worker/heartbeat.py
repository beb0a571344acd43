"""The heartbeater: keeps the leases of a worker's held jobs alive.

A thread with its own database connection. Each held job is due a heartbeat every third of
its visibility timeout; all jobs due together are extended by one statement
(``HEARTBEAT_JOBS``). A refused heartbeat means the lease is lost: the job is marked so (its
handler can see it through ``JobContext.lease_lost``), a warning is logged and counted. A
job whose row another transaction has locked is skipped, not waited for (busy: the lease is
not lost), and tried again within half a heartbeat interval (at most a second).
A running job past its ``max_runtime`` is no longer extended, so its lease lapses and
another worker can take the job; that is logged as an error.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import psycopg

from .. import db, leases, metrics
from .held import HeldJob, HeldJobs

logger = logging.getLogger("django_jobq.worker")

#: Seconds to wait before retrying after the heartbeat connection failed.
_RECONNECT_DELAY = 1.0


class Heartbeater:
    """Runs :meth:`run` on a thread of its own; stop with :meth:`stop`."""

    def __init__(self, held: HeldJobs, *, worker_id: str) -> None:
        self._held = held
        self._worker_id = worker_id
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # one statement at a time on the connection
        self._connection: psycopg.Connection[Any] | None = None
        self._thread = threading.Thread(target=self.run, name=f"{worker_id}-heartbeat", daemon=True)
        self.heartbeats = 0
        self.refused = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop extending leases (held jobs' leases then lapse normally) and close."""
        self._stopping.set()
        self._held.changed.set()
        self._thread.join()

    def run(self) -> None:
        try:
            while not self._stopping.is_set():
                held = self._held.snapshot()
                now = time.monotonic()
                due = [h for h in held if h.next_heartbeat <= now and self._should_extend(h, now)]
                if due:
                    self.extend(due)
                upcoming = [
                    h.next_heartbeat
                    for h in self._held.snapshot()
                    if not (h.lease_lost or h.overran or h.acked)
                ]
                timeout = max(0.0, min(upcoming) - time.monotonic()) if upcoming else None
                self._held.changed.wait(timeout)
                self._held.changed.clear()
        finally:
            with self._lock:
                if self._connection is not None:
                    self._connection.close()

    def _should_extend(self, held: HeldJob, now: float) -> bool:
        if held.lease_lost or held.overran or held.acked:  # acked: the job row is gone
            return False
        max_runtime = held.max_runtime
        if (
            max_runtime is not None
            and held.started is not None
            and now - held.started > max_runtime
        ):
            held.overran = True
            logger.error(
                "job %s %s attempt %s exceeded max_runtime (%g s): no longer extending its "
                "lease; another worker may take it once the lease lapses",
                held.job.id,
                held.job.kind,
                held.job.attempt,
                max_runtime,
            )
            return False
        return True

    def extend(self, due: list[HeldJob]) -> bool:
        """Extend the leases of ``due`` now; return whether all of them were extended (a busy
        lease, whose row another transaction holds, is not: it is tried again soon).

        Database errors are logged and leave the jobs due again shortly (the lease lapses
        if the database stays unreachable).
        """
        try:
            with self._lock:
                if self._connection is None or self._connection.closed:
                    self._connection = db.connect(
                        application_name=f"jobq heartbeat {self._worker_id}"
                    )
                extended = leases.heartbeat(self._connection.cursor(), [h.job.lease for h in due])
        except psycopg.Error as exc:
            logger.warning("heartbeat failed, retrying in %g s: %s", _RECONNECT_DELAY, exc)
            for held in due:
                # Retry well within the lease, even for short visibility timeouts.
                retry_in = min(_RECONNECT_DELAY, held.heartbeat_interval / 2)
                held.next_heartbeat = time.monotonic() + retry_in
            with self._lock:
                if self._connection is not None:
                    self._connection.close()
                    self._connection = None
            return False
        now = time.monotonic()
        for held in due:
            if held.job.id in extended:
                held.deadline = extended[held.job.id]
                held.next_heartbeat = now + held.heartbeat_interval
                self.heartbeats += 1
                metrics.observe_heartbeat(held.job.queue)
            elif held.job.id in extended.busy:
                # Another transaction holds the row's lock (not a lost lease): try again soon.
                held.next_heartbeat = now + min(_RECONNECT_DELAY, held.heartbeat_interval / 2)
            elif held.finished:
                # Acked between the snapshot and this statement: not a lost lease (the ack
                # says whether the lease held). No more beats for it.
                held.lease_lost = True
            else:
                held.lease_lost = True
                self.refused += 1
                metrics.observe_refused("heartbeat")
                logger.warning(
                    "job %s %s attempt %s: heartbeat refused, lease lost (deadline %s passed "
                    "or another attempt holds the job)",
                    held.job.id,
                    held.job.kind,
                    held.job.attempt,
                    held.deadline.isoformat(),
                )
        return len(extended) == len(due)

    def extend_one(self, held: HeldJob) -> bool:
        """Extend one job's lease now (``JobContext.heartbeat``)."""
        if held.lease_lost:
            return False
        return self.extend([held])
