"""The main loop's prepared statements, planned again once the job table has grown.

The main loop's connection prepares its statements (``worker.PREPARE_THRESHOLD``), and
PostgreSQL keeps a prepared statement's generic plan until the table's statistics change,
however much the table grows meanwhile (``sql.plans``). A worker that waited on an empty,
analysed queue then reads the whole table in every claim and ack once a backlog arrives.
Measured (throwaway cluster, autovacuum on, ``--concurrency 32``, 100,000 no-op jobs
enqueued in one transaction): the worker drained them in 67 s, its claims averaging 18 ms
and its acks 36 ms (446 ms at most); a worker started once they were enqueued took 13 s,
with claims of 0.6 ms and acks of 0.2 ms. With autovacuum off, nothing plans them again.

:class:`PlanRefresh` reads the table's size (``sql.plans.JOB_TABLE_SIZE``) on the main
loop's connection: once when the connection is new, then at most every
:data:`CHECK_INTERVAL` seconds, and only once the worker has claimed jobs since the last
read (an idle worker sends nothing).
When the table has grown to :data:`GROWTH_FACTOR` times the smallest size read since the
plans were last discarded, by at least :data:`MIN_GROWTH` bytes, it discards them
(``sql.plans.DISCARD_PLANS``): each statement is planned again at its next run, for the
table as it is then. A plan made for a smaller table thus serves a table at most twice the
size read, plus what the table grows in one check interval. A table that grows from empty
to N bytes costs about log2(N / MIN_GROWTH) discards, each a few plannings of every
statement (a claim's takes about a millisecond).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import psycopg

from .. import sql
from .timers import Every

logger = logging.getLogger("django_jobq.worker")

#: The fewest seconds between two reads of the table's size on one connection.
CHECK_INTERVAL = 1.0
#: How many times the smallest size read the table must have grown to for the plans to be
#: made again.
GROWTH_FACTOR = 2
#: The least growth, in bytes, that makes the plans be made again (8 pages: a sequential
#: scan of a smaller table costs about as little as the index scans it replaces).
MIN_GROWTH = 64 * 1024


class PlanRefresh:
    """Discards the plans of the main loop's prepared statements when the job table has
    grown since they may have been made (see the module's docstring). Used by the main
    loop's thread only."""

    def __init__(self, *, worker_id: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.worker_id = worker_id
        self._clock = clock
        self._connection: psycopg.Connection[Any] | None = None
        self._smallest = 0
        self._claimed_at_read = 0
        self._every = Every(CHECK_INTERVAL, clock=clock)

    def check(self, cursor: psycopg.Cursor[Any], *, claimed: int) -> bool:
        """Read the table's size on ``cursor`` when due, and discard the connection's plans
        if it has grown enough. ``claimed``: how many jobs the worker has claimed so far (a
        running count); the size is read only if it grew since the last read, or on a new
        connection. Returns whether the plans were discarded.

        Raises:
            psycopg.Error: a statement failed (the plans are kept; the next due check
                reads again).
        """
        if cursor.connection is not self._connection:
            # A new connection: its plans are made from now on, for the table as it is.
            self._smallest = self._size(cursor)
            self._connection = cursor.connection
            self._claimed_at_read = claimed
            self._every = Every(CHECK_INTERVAL, clock=self._clock)
            self._every.due()  # the next read is an interval from now
            return False
        if claimed == self._claimed_at_read or not self._every.due():
            return False
        self._claimed_at_read = claimed
        size = self._size(cursor)
        if size < GROWTH_FACTOR * self._smallest or size - self._smallest < MIN_GROWTH:
            self._smallest = min(self._smallest, size)
            return False
        cursor.execute(sql.plans.DISCARD_PLANS)
        logger.debug(
            "worker %s: the job table grew from %d to %d bytes: its statements are planned again",
            self.worker_id,
            self._smallest,
            size,
        )
        self._smallest = size
        return True

    @staticmethod
    def _size(cursor: psycopg.Cursor[Any]) -> int:
        cursor.execute(sql.plans.JOB_TABLE_SIZE)
        ((size,),) = cursor.fetchall()
        return int(size)
