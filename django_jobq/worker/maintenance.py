"""Maintenance: periodic clean-up that one worker at a time does for everybody.

Every :data:`INTERVAL` seconds each worker tries a transaction-scoped advisory lock
(``TRY_MAINTENANCE_LOCK``); the one that gets it runs the sweeps, the others skip the round.
Today's sweep: delete dead letters older than ``JOBQ['DEAD_LETTER_RETENTION']``.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import psycopg

from .. import sql
from ..conf import get_settings

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

    def __init__(self, connection: psycopg.Connection[Any]) -> None:
        self._connection = connection
        self._next_round = time.monotonic()

    def run_if_due(self) -> None:
        if time.monotonic() < self._next_round:
            return
        self._next_round = time.monotonic() + INTERVAL
        retention = get_settings().DEAD_LETTER_RETENTION
        if retention is None:
            return
        pruned = 0
        for _ in range(BATCHES_PER_ROUND):
            with self._connection.transaction():
                cursor = self._connection.cursor()
                cursor.execute(sql.TRY_MAINTENANCE_LOCK, {"key": LOCK_KEY})
                row = cursor.fetchone()
                if not (row and row[0]):
                    break  # another worker is doing this round
                cursor.execute(
                    sql.PRUNE_DEAD_LETTERS, {"older_than": retention, "limit": BATCH_SIZE}
                )
                pruned += cursor.rowcount
                if cursor.rowcount < BATCH_SIZE:
                    break
        if pruned:
            logger.info("maintenance: deleted %s dead letters past their retention", pruned)
