"""Maintenance: periodic clean-up that one worker at a time does for everybody.

Every :data:`INTERVAL` seconds each worker tries a transaction-scoped advisory lock
(``TRY_MAINTENANCE_LOCK``); the one that gets it runs the sweeps, the others skip the round.
A round first makes the leases no worker could have written lapse (a running row with a
NULL or far-future deadline, written by another producer: it would never be reclaimed) and
makes the next job of a lane ready where the lane's job ended without that (see
:mod:`django_jobq.sql.lanes`), then the sweeps delete dead letters older than
``JOBQ['DEAD_LETTER_RETENTION']``, dedup keys older than ``JOBQ['DEDUP_RETENTION']``, task
results finished longer ago than ``JOBQ['TASK_RESULT_RETENTION']``, per-minute statistics
(outcome rollups and queue samples) older than ``JOBQ['STATS_RETENTION']``, and the rows of
workers not seen for an hour (:data:`.registration.PRUNE_AFTER`: crashed without
deregistering).

The unknown-kind sweep (:meth:`Maintenance.sweep_unknown_kinds`), under the same lock, runs
more often (every quarter of ``JOBQ['UNKNOWN_KIND_GRACE']``, between 1 and 60 s): it
dead-letters, as "unknown kind", the due ready jobs of a (queue, kind) that live workers
serve but none of them has (a worker claims only the kinds it has, so nobody else would).
The grace is counted from the first sweep that saw the pair so, and starts again whenever a
sweep finds a live worker with the kind (or this worker has not looked for two sweep
intervals): a worker restart shorter than the grace never dead-letters a backlog, however
old its jobs. Only jobs due for longer than the grace are taken. A queue no live worker
serves is an outage: its jobs wait, whatever their kind; a worker with no kinds at all
serves nothing (``sql.maintenance.WAITING_FOR_A_WORKER``).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import class_row, scalar_row

from .. import sql, task_results, text
from ..conf import get_settings
from ..metrics import instruments
from ..models import StoredTaskResult
from ..stats import STALE_AFTER, WaitingKind, waiting_kinds
from .registration import PRUNE_AFTER
from .timers import Every

logger = logging.getLogger("django_jobq.worker")

#: Seconds between two maintenance rounds of one worker.
INTERVAL = 60.0
#: Advisory lock key for maintenance ("jobq" in ASCII), shared by all workers.
LOCK_KEY = 0x6A6F6271
#: Rows deleted per statement, and statements per round, so a backlog is worked off in
#: short transactions over several rounds.
BATCH_SIZE = 1000
BATCHES_PER_ROUND = 10


class Maintenance:
    """Call :meth:`run_if_due` from the worker's main loop; it returns at once if the
    previous round was less than :data:`INTERVAL` seconds ago. ``clock`` gives
    ``time.monotonic()`` seconds (tests pass a simulated one). ``announce`` sends
    ``task_finished`` for the results of tasks' jobs a sweep dead-lettered, once committed
    (the worker's announcer thread; by default on the caller's thread)."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        announce: Callable[[Sequence[StoredTaskResult]], None] = task_results.announce_finished,
    ) -> None:
        self._clock = clock
        self._announce = announce
        self._rounds = Every(INTERVAL, clock=clock)
        self._sweeps = Every(INTERVAL, clock=clock)  # its interval follows the grace
        # (queue, kind) -> [first, last] clock times a sweep of this worker saw its jobs wait.
        self._seen_waiting: dict[tuple[str, str], list[float]] = {}

    def run_if_due(self, connection: psycopg.Connection[Any]) -> None:
        """Run a round on ``connection`` (autocommit) if one is due, and the unknown-kind
        sweep if it is due.

        Raises:
            psycopg.Error: a statement failed; the round is skipped until the next interval.
        """
        grace = get_settings().UNKNOWN_KIND_GRACE
        if grace is not None:
            self._sweeps.interval = sweep_interval(grace)
            if self._sweeps.due():
                self.sweep_unknown_kinds(connection, grace)
        if not self._rounds.due():
            return
        if not self._rescue_stranded_leases(connection):
            return  # another worker holds the maintenance lock this round
        self._promote_stalled_lanes(connection)
        config = get_settings()
        for what, statement, retention in (
            ("dead letters", sql.maintenance.PRUNE_DEAD_LETTERS, config.DEAD_LETTER_RETENTION),
            ("dedup keys", sql.maintenance.PRUNE_DEDUP_KEYS, config.DEDUP_RETENTION),
            ("task results", sql.maintenance.PRUNE_TASK_RESULTS, config.TASK_RESULT_RETENTION),
            ("outcome rollups", sql.maintenance.PRUNE_OUTCOME_ROLLUPS, config.STATS_RETENTION),
            ("queue samples", sql.maintenance.PRUNE_QUEUE_SAMPLES, config.STATS_RETENTION),
            ("stale workers", sql.maintenance.PRUNE_WORKER_PROCESSES, PRUNE_AFTER),
        ):
            if retention is not None and not self._prune(connection, what, statement, retention):
                return  # another worker holds the maintenance lock this round

    def _rescue_stranded_leases(self, connection: psycopg.Connection[Any]) -> bool:
        """Make the leases no worker could have written lapse now (``RESCUE_STRANDED_LEASES``:
        a running row that would otherwise never be reclaimed); ``False`` if another worker
        is at it."""
        with connection.transaction():
            if not _took_the_lock(connection):
                return False
            rescued = (
                connection.cursor(row_factory=scalar_row)
                .execute(sql.maintenance.RESCUE_STRANDED_LEASES)
                .fetchall()
            )
        if rescued:
            logger.warning(
                "maintenance: %s running job(s) had a lease deadline no worker writes (NULL or "
                "more than 10 years ahead): made it lapse now, to be reclaimed: ids %s",
                len(rescued),
                ", ".join(map(str, rescued[:20])) + (" …" if len(rescued) > 20 else ""),
            )
        return True

    def _promote_stalled_lanes(self, connection: psycopg.Connection[Any]) -> None:
        """Make ready the next job of each lane whose job ended without its worker doing so
        (``sql.lanes.PROMOTE_STALLED_LANES``: the worker crashed between the ack and the
        promotion; an operator deleted or cancelled the job)."""
        promoted = (
            connection.cursor(row_factory=scalar_row)
            .execute(sql.lanes.PROMOTE_STALLED_LANES, {"channel": sql.wake.WAKE_CHANNEL})
            .fetchone()
        )
        if promoted:
            logger.info("maintenance: made the next job of %s stalled lane(s) ready", promoted)

    def _prune(
        self, connection: psycopg.Connection[Any], what: str, statement: str, retention: float
    ) -> bool:
        """Delete rows past ``retention`` seconds; ``False`` if another worker is at it."""
        pruned = 0
        for _ in range(BATCHES_PER_ROUND):
            with connection.transaction():
                if not _took_the_lock(connection):
                    return False
                cursor = connection.cursor()
                cursor.execute(statement, {"older_than": retention, "limit": BATCH_SIZE})
                pruned += cursor.rowcount
                if cursor.rowcount < BATCH_SIZE:
                    break
        if pruned:
            logger.info("maintenance: deleted %s %s past their retention", pruned, what)
        return True

    def _overdue(self, waiting: list[WaitingKind], grace: float) -> list[WaitingKind]:
        """The pairs of ``waiting`` (read now) whose jobs this worker has seen wait for a
        worker for ``grace`` seconds, in sweeps no further apart than two sweep intervals,
        and that have jobs due for longer than the grace; forget the pairs no longer
        waiting."""
        now = self._clock()
        gap = 2 * sweep_interval(grace)
        seen: dict[tuple[str, str], list[float]] = {}
        for pair in waiting:
            key = (pair.queue, pair.kind)
            first, last = self._seen_waiting.get(key, (now, now))
            seen[key] = [first if now - last <= gap else now, now]
        self._seen_waiting = seen
        return [
            pair
            for pair in waiting
            if pair.oldest_age > grace and now - seen[(pair.queue, pair.kind)][0] >= grace
        ]

    def sweep_unknown_kinds(self, connection: psycopg.Connection[Any], grace: float) -> int:
        """Dead-letter the jobs that waited ``grace`` seconds for a worker that can run them,
        counted from this worker's first sweep that saw them wait (see the module docs and
        :meth:`_overdue`; ``sql.maintenance.DEAD_LETTER_UNKNOWN_KINDS``), at most
        :data:`BATCH_SIZE` per queue and kind, in one transaction under the maintenance
        lock. Their reason names the kinds the live workers of the queue know. Returns how
        many were dead-lettered (0 if another worker holds the lock).

        Raises:
            psycopg.Error: a statement failed.
        """
        with connection.transaction():
            if not _took_the_lock(connection):
                return 0
            cursor = connection.cursor()
            overdue = self._overdue(waiting_kinds(cursor), grace)
            if not overdue:
                return 0
            letters = (
                connection.cursor(row_factory=class_row(_SweptJob))
                .execute(
                    sql.maintenance.DEAD_LETTER_UNKNOWN_KINDS,
                    {
                        "stale_after": STALE_AFTER,
                        "queue": [w.queue for w in overdue],
                        "kind": [w.kind for w in overdue],
                        "reason": [unknown_kind_reason(w, grace) for w in overdue],
                        "grace": grace,
                        "limit": BATCH_SIZE,
                        "error": _UNKNOWN_KIND_ERROR,
                        "traceback": "",
                    },
                )
                .fetchall()
            )
            # A Django task's result fails with the dead letter, in the same transaction.
            failed = task_results.fail_unrun(cursor, letters, announce=False)
        self._announce(failed)  # task_finished, once committed
        swept = Counter((letter.queue, letter.kind) for letter in letters)
        for (queue, kind), count in sorted(swept.items()):
            instruments.observe_dead_lettered(queue, kind, "unknown kind", count)
            logger.warning(
                "maintenance: %s jobs of kind %r on queue %r became dead letters: no live "
                "worker serving the queue has that kind after %g s",
                count,
                kind,
                queue,
                grace,
            )
        return len(letters)


def sweep_interval(grace: float) -> float:
    """Seconds between two unknown-kind sweeps of a worker: a quarter of the grace, 1 to
    :data:`INTERVAL`."""
    return min(INTERVAL, max(1.0, grace / 4))


def _took_the_lock(connection: psycopg.Connection[Any]) -> bool:
    """Try the maintenance lock for the connection's transaction (``TRY_MAINTENANCE_LOCK``);
    ``False``: another worker holds it this round."""
    cursor = connection.cursor(row_factory=scalar_row)
    return bool(cursor.execute(sql.maintenance.TRY_MAINTENANCE_LOCK, {"key": LOCK_KEY}).fetchone())


#: The error of an unknown kind's dead letters.
_UNKNOWN_KIND_ERROR = "no live worker serving its queue has registered its kind"


@dataclass(frozen=True)
class _SweptJob:
    """A job the unknown-kind sweep dead-lettered (a row of ``DEAD_LETTER_UNKNOWN_KINDS``),
    as ``task_results.fail_unrun`` reads it (its payload only says which task result it
    has, if any)."""

    queue: str
    kind: str
    reason: str
    payload: dict[str, Any]
    last_error: str = _UNKNOWN_KIND_ERROR


def unknown_kind_reason(waiting: WaitingKind, grace: float) -> str:
    """The dead-letter reason of a job that no live worker serving its queue can run,
    naming the kinds they have (bounded like every reason, :func:`django_jobq.text.reason`)."""
    known = ", ".join(waiting.known) or "none"
    return text.reason(
        f"unknown kind: no live worker of queue {waiting.queue} has registered "
        f"{waiting.kind} (waited over {grace:g} s); the kinds they know: {known}"
    )
