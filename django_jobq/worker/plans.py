"""The main loop's prepared statements, planned again once the job table has grown.

The main loop's connection prepares its statements (``worker.PREPARE_THRESHOLD``), and
PostgreSQL keeps a prepared statement's generic plan until the table's statistics change,
however much the table grows meanwhile (``sql.plans``). A worker that waited on an empty,
analysed queue then reads the whole table in every claim and ack once a backlog arrives:
with autovacuum off for the table, a worker running ``--concurrency 32`` ran 26,336 of
100,000 no-op jobs in 120 s, where a worker started after they were enqueued ran them all
in about 17 s (docs/performance.md, "A backlog that arrives at an idle worker").

Every claim's first statement returns the table's size (``job_table_size``), which the
connection keeps (:meth:`django_jobq.db.WatchedConnection.saw_job_table_size`): the plans
in use were made at one of the sizes the claims read since the last discard, or larger (a
statement is planned when it runs, and every turn of the main loop with room to claim runs
a claim). After each turn, :class:`PlanRefresh` compares the latest size with the smallest
read since the plans were last discarded (or since the connection opened): once the table
has grown to :data:`GROWTH_FACTOR` times that, by at least :data:`MIN_GROWTH` bytes, it
discards them (``sql.plans.DISCARD_PLANS``): each statement is planned again at its next
run, for the table as it is then. Nothing is sent otherwise. A table that grows from empty
to N bytes costs about log2(N / MIN_GROWTH) discards, each a few plannings of every
statement (a claim's takes about a millisecond).

Plans made from statistics that say the table is empty (an ANALYZE or VACUUM of the
emptied table) may still read a claim index whole, however often they are made again:
:mod:`django_jobq.worker.statistics` analyses the table when a backlog has outgrown its
statistics.
"""

from __future__ import annotations

import logging

from .. import db, sql

logger = logging.getLogger("django_jobq.worker")

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

    def __init__(self, *, worker_id: str) -> None:
        self.worker_id = worker_id
        self._connection: db.WatchedConnection | None = None
        self._smallest = 0

    def refresh(self, connection: db.WatchedConnection) -> bool:
        """Discard ``connection``'s plans if the job table has grown enough since the
        smallest size its claims read (see the module's docstring); return whether it did.

        Raises:
            psycopg.Error: the statement failed (the plans are kept, and the growth is
                looked at again after the next claim).
        """
        seen = connection.take_job_table_sizes()
        if seen is None:
            return False
        smallest, latest = seen
        if connection is not self._connection:
            # A new connection: its plans were made since it opened, at sizes its claims read.
            self._connection = connection
            self._smallest = smallest
        else:
            self._smallest = min(self._smallest, smallest)
        if latest < GROWTH_FACTOR * self._smallest or latest - self._smallest < MIN_GROWTH:
            return False
        connection.execute(sql.plans.DISCARD_PLANS)
        logger.debug(
            "worker %s: the job table grew from %d to %d bytes: its statements are planned again",
            self.worker_id,
            self._smallest,
            latest,
        )
        self._smallest = latest
        return True
