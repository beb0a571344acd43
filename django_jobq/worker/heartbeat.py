"""The heartbeater: keeps the leases of a worker's held jobs alive.

A thread with its own database connection. Each held job is due a heartbeat every third of
its visibility timeout; all jobs due together are extended by one statement
(``sql.leases.HEARTBEAT_JOBS``). A refused heartbeat means the lease is lost: the job is
marked so (its handler can see it through ``JobContext.lease_lost``), a warning is logged
and counted. A job whose row another transaction has locked is skipped, not waited for
(busy: the lease is not lost), and tried again within half a heartbeat interval (at most a
second).
Abort requests (:func:`django_jobq.operations.abort`): each heartbeat returns whether the
job has one, and between two heartbeats the heartbeater looks for them (one read for all
jobs due a look, ``sql.aborts.ABORT_REQUESTED``) every half heartbeat interval, so a
request is seen within half a heartbeat interval of being made. A job seen with one is
flagged (``HeldJob.abort_seen``): its handler sees ``JobContext.abort_requested``, an async
handler's task is cancelled. Its lease is extended as before: a handler that ignores the
request runs to completion.
A running job past its ``max_runtime`` is no longer extended, so its lease lapses and
another worker can take the job; that is logged as an error. (An async job's task is
cancelled then by the event loop, which reports its failure at once: nothing to log here.)

Leases follow liveness: only jobs that are prefetched or whose handler is running are
extended, not a finished job waiting for its ack (``HeldJob.finished``). And while the
worker's main loop is stuck in one pass (a hung statement, a reconnect that does not
succeed) for longer than a job's heartbeat interval (a third of its visibility timeout),
that job is not extended either, so a wedged worker gives its jobs up within about
4/3 of a lease; heartbeats resume as soon as the loop completes a pass.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import psycopg

from .. import db, leases
from ..metrics import instruments
from .held import HeldJob, HeldJobs, Progress
from .outage import OutageLog
from .watchdog import Watchdog

logger = logging.getLogger("django_jobq.worker")

#: Seconds to wait before retrying after the heartbeat connection failed.
_RECONNECT_DELAY = 1.0
#: Seconds between two looks at a stalled main loop, to resume heartbeats once it moves.
_STALL_RECHECK = 0.1
#: Seconds :meth:`Heartbeater.stop` waits for the thread (it may be cut from a statement).
STOP_TIMEOUT = 1.0


def _watches_abort(held: HeldJob) -> bool:
    """Whether the heartbeater still looks for an abort request of ``held`` between two
    heartbeats: until one is seen, while its lease is held."""
    return not (held.abort_requested or held.lease_lost)


class Heartbeater:
    """Runs :meth:`run` on a thread of its own; stop with :meth:`stop`. ``progress`` is the
    main loop's (leases are withheld while it is stalled), ``watchdog`` cuts a heartbeat
    statement that hangs."""

    def __init__(
        self,
        held: HeldJobs,
        *,
        worker_id: str,
        progress: Progress | None = None,
        watchdog: Watchdog | None = None,
    ) -> None:
        self._held = held
        self._worker_id = worker_id
        self._progress = progress or Progress()  # the worker's main loop; else never stalled
        self._watchdog = watchdog
        self._failures = OutageLog()
        self._withheld = False  # leases not extended because the main loop is stalled
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # one statement at a time on the connection
        self._connection: psycopg.Connection[Any] | None = None
        self._thread = threading.Thread(target=self.run, name=f"{worker_id}-heartbeat", daemon=True)
        self.heartbeats = 0
        self.refused = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop extending leases (held jobs' leases then lapse normally) and close; waits
        :data:`STOP_TIMEOUT` seconds at most for the thread."""
        self._stopping.set()
        self._held.changed.set()
        self._thread.join(STOP_TIMEOUT)

    def run(self) -> None:
        try:
            while not self._stopping.is_set():
                self._held.changed.wait(self._beat())
                self._held.changed.clear()
        finally:
            with self._lock:
                if self._connection is not None:
                    self._connection.close()

    def _beat(self) -> float | None:
        """Extend the leases that are due; return the seconds until the next is (``None``:
        none is held)."""
        now = time.monotonic()
        live = [h for h in self._held.snapshot() if self._should_extend(h, now)]
        stalled = self._progress.stalled_for(now)
        extendable = [h for h in live if stalled <= h.heartbeat_interval]
        self._note_withheld(len(live) - len(extendable), stalled)
        due = [h for h in extendable if h.next_heartbeat <= now]
        if due:
            self.extend(due)
        if any(_watches_abort(h) and h.next_abort_look <= now for h in extendable):
            # One read for every look due within the next half look interval as well, so
            # that jobs claimed at different moments share their looks from then on.
            looks = [
                h
                for h in extendable
                if _watches_abort(h) and h.next_abort_look <= now + h.abort_look_interval / 2
            ]
            self.look_for_aborts(looks)
        upcoming = [h.next_heartbeat for h in extendable if not h.lease_lost]
        upcoming.extend(h.next_abort_look for h in extendable if _watches_abort(h))
        if len(extendable) < len(live):
            upcoming.append(now + _STALL_RECHECK)
        return max(0.0, min(upcoming) - time.monotonic()) if upcoming else None

    def _note_withheld(self, withheld: int, stalled: float) -> None:
        """Log when leases start, and stop, being withheld from a stalled main loop."""
        if withheld and not self._withheld:
            logger.warning(
                "worker %s: main loop has made no progress for %.1f s: not extending %s "
                "lease(s) until it does (another worker may take those jobs)",
                self._worker_id,
                stalled,
                withheld,
            )
        elif self._withheld and not withheld:
            logger.info("worker %s: main loop progressing, heartbeats resumed", self._worker_id)
        self._withheld = bool(withheld)

    def _should_extend(self, held: HeldJob, now: float) -> bool:
        """Whether ``held``'s lease is still the worker's to keep: prefetched, or its
        handler running, within ``max_runtime``."""
        if held.lease_lost or held.overran or held.acked or held.finished:
            # acked: the job row is gone; finished: its outcome awaits the main loop's write,
            # which must come within the lease.
            return False
        max_runtime = held.max_runtime
        if (
            max_runtime is not None
            and held.started is not None
            and now - held.started > max_runtime
        ):
            held.overran = True
            if held.asynchronous:
                return False  # its task is cancelled: the attempt's failure says so
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

    def _connect(self) -> psycopg.Connection[Any]:
        """The heartbeat connection, opened if need be (the caller holds ``_lock``)."""
        if self._connection is None or self._connection.closed:
            name = f"jobq heartbeat {self._worker_id}"
            self._connection = db.connect(application_name=name)
            if self._watchdog is not None:
                self._watchdog.watch(self._connection, name)
        return self._connection

    def _drop_connection(self) -> None:
        """Close the heartbeat connection after an error (the next statement reconnects)."""
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None

    def extend(self, due: list[HeldJob]) -> bool:
        """Extend the leases of ``due`` now; return whether all of them were extended (a busy
        lease, whose row another transaction holds, is not: it is tried again soon).

        Database errors are logged and leave the jobs due again shortly (the lease lapses
        if the database stays unreachable).
        """
        try:
            with self._lock:
                connection = self._connect()
                extended = leases.heartbeat(connection.cursor(), [h.job.lease for h in due])
        except psycopg.Error as exc:
            self._failures.failed(
                "worker %s: heartbeat failed, retrying in %g s: %s",
                self._worker_id,
                _RECONNECT_DELAY,
                exc,
            )
            for held in due:
                # Retry well within the lease, even for short visibility timeouts.
                retry_in = min(_RECONNECT_DELAY, held.heartbeat_interval / 2)
                held.next_heartbeat = time.monotonic() + retry_in
            self._drop_connection()
            return False
        self._failures.restored("worker %s: heartbeats restored", self._worker_id)
        now = time.monotonic()
        for held in due:
            if held.job.id in extended:
                held.deadline = extended[held.job.id]
                held.next_heartbeat = now + held.heartbeat_interval
                held.next_abort_look = now + held.abort_look_interval
                self.heartbeats += 1
                instruments.observe_heartbeat(held.job.queue)
                if held.job.id in extended.abort_requested:
                    self._abort_seen(held)
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
                instruments.observe_refused("heartbeat")
                logger.warning(
                    "job %s %s attempt %s: heartbeat refused, lease lost (deadline %s passed "
                    "or another attempt holds the job)",
                    held.job.id,
                    held.job.kind,
                    held.job.attempt,
                    held.deadline.isoformat(),
                )
        return len(extended) == len(due)

    def look_for_aborts(self, held_jobs: list[HeldJob]) -> None:
        """Read whether an abort is requested for ``held_jobs`` (one statement, a read: see
        ``sql.aborts.ABORT_REQUESTED``) and flag those that have one. A database error is
        logged as a heartbeat's is; the next heartbeat reads the requests again."""
        try:
            with self._lock:
                connection = self._connect()
                requested = leases.abort_requested(
                    connection.cursor(), [h.job.lease for h in held_jobs]
                )
        except psycopg.Error as exc:
            self._failures.failed(
                "worker %s: reading abort requests failed: %s", self._worker_id, exc
            )
            self._drop_connection()
            requested = frozenset()
        now = time.monotonic()
        for held in held_jobs:
            held.next_abort_look = now + held.abort_look_interval
            if held.job.id in requested:
                self._abort_seen(held)

    def _abort_seen(self, held: HeldJob) -> None:
        """A heartbeat or a look found an abort requested for ``held``: flag it (its context
        says so; an async handler's task is cancelled), once."""
        if held.abort_requested:
            return
        logger.info(
            "job %s %s attempt %s: abort requested; its handler is told",
            held.job.id,
            held.job.kind,
            held.job.attempt,
        )
        held.abort_seen()

    def extend_one(self, held: HeldJob) -> bool:
        """Extend one job's lease now (``JobContext.heartbeat``); ``False`` without a
        statement when the lease is lost or the main loop is stalled (the same rule as the
        heartbeater's own beats: a wedged worker gives its jobs up)."""
        if held.lease_lost:
            return False
        if self._progress.stalled_for(time.monotonic()) > held.heartbeat_interval:
            return False
        return self.extend([held])
