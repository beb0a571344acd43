"""Maintenance: periodic clean-up that one worker at a time does for everybody.

Every :data:`INTERVAL` seconds each worker tries a transaction-scoped advisory lock
(``TRY_MAINTENANCE_LOCK``); the one that gets it runs the sweeps, the others skip the round.
A round first makes the leases no worker could have written lapse (a running row with a
NULL or far-future deadline, written by another producer: it would never be reclaimed),
then the sweeps delete dead letters older than ``JOBQ['DEAD_LETTER_RETENTION']``, dedup keys
older than ``JOBQ['DEDUP_RETENTION']``, task results finished longer ago than
``JOBQ['TASK_RESULT_RETENTION']``, per-minute statistics (outcome rollups and queue samples)
older than ``JOBQ['STATS_RETENTION']``, and the rows of workers not seen for an hour
(:data:`.registration.PRUNE_AFTER`: crashed without deregistering).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import psycopg

from .. import sql
from ..conf import get_settings
from .registration import PRUNE_AFTER

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
    previous round was less than :data:`INTERVAL` seconds ago."""

    def __init__(self) -> None:
        self._next_round = time.monotonic()

    def run_if_due(self, connection: psycopg.Connection[Any]) -> None:
        """Run a round on ``connection`` (autocommit) if one is due.

        Raises:
            psycopg.Error: a statement failed; the round is skipped until the next interval.
        """
        if time.monotonic() < self._next_round:
            return
        self._next_round = time.monotonic() + INTERVAL
        if not self._rescue_stranded_leases(connection):
            return  # another worker holds the maintenance lock this round
        config = get_settings()
        for what, statement, retention in (
            ("dead letters", sql.PRUNE_DEAD_LETTERS, config.DEAD_LETTER_RETENTION),
            ("dedup keys", sql.PRUNE_DEDUP_KEYS, config.DEDUP_RETENTION),
            ("task results", sql.PRUNE_TASK_RESULTS, config.TASK_RESULT_RETENTION),
            ("outcome rollups", sql.PRUNE_OUTCOME_ROLLUPS, config.STATS_RETENTION),
            ("queue samples", sql.PRUNE_QUEUE_SAMPLES, config.STATS_RETENTION),
            ("stale workers", sql.PRUNE_WORKER_PROCESSES, PRUNE_AFTER),
        ):
            if retention is not None and not self._prune(connection, what, statement, retention):
                return  # another worker holds the maintenance lock this round

    def _rescue_stranded_leases(self, connection: psycopg.Connection[Any]) -> bool:
        """Make the leases no worker could have written lapse now (``RESCUE_STRANDED_LEASES``:
        a running row that would otherwise never be reclaimed); ``False`` if another worker
        is at it."""
        with connection.transaction():
            cursor = connection.cursor()
            cursor.execute(sql.TRY_MAINTENANCE_LOCK, {"key": LOCK_KEY})
            row = cursor.fetchone()
            if not (row and row[0]):
                return False
            cursor.execute(sql.RESCUE_STRANDED_LEASES)
            rescued = [job_id for (job_id,) in cursor.fetchall()]
        if rescued:
            logger.warning(
                "maintenance: %s running job(s) had a lease deadline no worker writes (NULL or "
                "more than 10 years ahead): made it lapse now, to be reclaimed: ids %s",
                len(rescued),
                ", ".join(map(str, rescued[:20])) + (" …" if len(rescued) > 20 else ""),
            )
        return True

    def _prune(
        self, connection: psycopg.Connection[Any], what: str, statement: str, retention: float
    ) -> bool:
        """Delete rows past ``retention`` seconds; ``False`` if another worker is at it."""
        pruned = 0
        for _ in range(BATCHES_PER_ROUND):
            with connection.transaction():
                cursor = connection.cursor()
                cursor.execute(sql.TRY_MAINTENANCE_LOCK, {"key": LOCK_KEY})
                row = cursor.fetchone()
                if not (row and row[0]):
                    return False
                cursor.execute(statement, {"older_than": retention, "limit": BATCH_SIZE})
                pruned += cursor.rowcount
                if cursor.rowcount < BATCH_SIZE:
                    break
        if pruned:
            logger.info("maintenance: deleted %s %s past their retention", pruned, what)
        return True
