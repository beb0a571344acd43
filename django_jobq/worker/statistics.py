"""The job table's statistics, brought up to date when a backlog has outgrown them.

PostgreSQL plans each statement from the table's statistics, which ANALYZE writes
(autovacuum's, or anyone's). A queue's table is often analysed while it is nearly empty,
between two backlogs, and its statistics then count no row: PostgreSQL estimates each of
its partial indexes at one row however large the table has grown since, and a claim
planned so may read every index entry of a backlog and sort them to take one batch (a
bitmap scan of ``jobq_job_claim_all_idx``: 85,462 entries and 50 ms for a batch of 64,
where reading the index in claim order takes a fraction of a millisecond). Autovacuum
analyses the table again once enough rows have changed, which may take a minute, and with
autovacuum off never: until then the backlog drains at a fraction of its rate
(docs/performance.md, "A backlog the statistics do not know").

So, at most every :data:`CHECK_INTERVAL` seconds, the main loop reads what the statistics
count against what the table holds (``sql.plans.READ_JOB_TABLE_COUNTS``): its committed
rows by PostgreSQL's activity counters, which also see a backlog that filled the empty
pages of a table (up to about 10 s late), and its size on disk, which any insert shows at
once. When either is at least :data:`GROWTH_FACTOR` times what the statistics count, and
more by at least :data:`MIN_GROWTH_ROWS` rows or :data:`MIN_GROWTH_BYTES` bytes, it
analyses the table (``sql.plans.ANALYZE_JOB_TABLE``): every session's plans that read it
are then made again from the new statistics. Growth in bytes alone counts only once the
counters show more committed rows than the statistics: an ANALYZE while a large insert is
still open would count its rows as none, and write the very statistics this avoids. A
backlog growing from nothing to N rows costs about log2(N / :data:`MIN_GROWTH_ROWS`)
analyses, whichever workers make them; a table that stays within twice what its
statistics count costs one small statement a second.

An ANALYZE another session's lock made PostgreSQL skip (another worker's ANALYZE, a VACUUM,
``CREATE INDEX CONCURRENTLY``) is tried again at the next check. One that the connection's
``statement_timeout`` cancelled is tried again after a wait that doubles from
:data:`CANCELLED_RETRY` seconds. A user that may not analyse the table (not its owner nor
the database's, nor a superuser) does not try: a warning says so once, and the plans wait
for autovacuum.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from .. import sql
from .timers import Every

logger = logging.getLogger("django_jobq.worker")

#: The fewest seconds between two reads of the table's counts.
CHECK_INTERVAL = 1.0
#: How many times what the statistics count the table must hold for the worker to analyse
#: it.
GROWTH_FACTOR = 2
#: The fewest rows, and bytes, past what the statistics count that make the worker analyse
#: the table: below that, reading the whole of a partial index costs about as little as
#: reading a batch's entries (a millisecond or so).
MIN_GROWTH_ROWS = 1000
MIN_GROWTH_BYTES = 256 * 1024
#: Seconds before an ANALYZE that ``statement_timeout`` cancelled is tried again, doubling
#: with each cancellation up to :data:`MAX_CANCELLED_RETRY`.
CANCELLED_RETRY = 60.0
MAX_CANCELLED_RETRY = 3600.0


@dataclass(frozen=True)
class TableCounts:
    """One reading of ``sql.plans.READ_JOB_TABLE_COUNTS``: what the statistics of
    ``jobq_job`` count (``counted_rows``: -1 when it was never analysed nor vacuumed;
    ``counted_bytes``), how many ANALYZEs and VACUUMs wrote them (``counted_by``), what the
    table holds (``live_rows`` committed, ``bytes`` on disk), and whether this session may
    analyse it (``may_analyse``)."""

    counted_rows: float
    counted_bytes: int
    counted_by: int
    live_rows: int
    bytes: int
    may_analyse: bool

    def outgrown(self) -> bool:
        """Whether the table holds :data:`GROWTH_FACTOR` times the committed rows, or the
        bytes, its statistics count, and :data:`MIN_GROWTH_ROWS` rows or
        :data:`MIN_GROWTH_BYTES` bytes more; growth in bytes only once more rows than the
        statistics count are committed."""
        counted = max(self.counted_rows, 0.0)
        if _outgrew(self.live_rows, counted, MIN_GROWTH_ROWS):
            return True
        return self.live_rows > counted and _outgrew(
            self.bytes, self.counted_bytes, MIN_GROWTH_BYTES
        )


def _outgrew(now: float, counted: float, least: float) -> bool:
    return now >= GROWTH_FACTOR * counted and now - counted >= least


class StatisticsCheck:
    """Analyses ``jobq_job`` when a backlog has outgrown its statistics (see the module's
    docstring). Used by the main loop's thread only."""

    def __init__(self, *, worker_id: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.worker_id = worker_id
        self._clock = clock
        self._checks = Every(CHECK_INTERVAL, clock=clock)
        self._warned_may_not = False
        self._cancelled_retry = CANCELLED_RETRY
        self._not_before = 0.0  # clock(): after a cancelled ANALYZE

    def run_if_due(self, connection: psycopg.Connection[Any]) -> bool:
        """:meth:`run` if :data:`CHECK_INTERVAL` seconds have passed since the last time;
        whether it analysed the table."""
        return self._checks.due() and self.run(connection)

    def run(self, connection: psycopg.Connection[Any]) -> bool:
        """Read the table's counts and analyse it if it has outgrown its statistics (see
        the module's docstring).

        Args:
            connection: the main loop's autocommit connection to the queue database.

        Returns:
            Whether the statistics were written again: an ANALYZE ran (with ``track_counts``
            off, whether one was sent: nothing tells a skipped one then).

        Raises:
            psycopg.Error: a statement failed (a cancelled ANALYZE is not one: it is
                logged, and tried again later).
        """
        counts = self._read(connection)
        if not counts.outgrown() or self._clock() < self._not_before:
            return False
        if not counts.may_analyse:
            if not self._warned_may_not:
                self._warned_may_not = True
                logger.warning(
                    "worker %s: jobq_job holds %d rows where its statistics count %d, but "
                    "this database user may not analyse it (it is not the owner of the "
                    "table or the database): claims are planned from those statistics "
                    "until autovacuum analyses it",
                    self.worker_id,
                    counts.live_rows,
                    max(counts.counted_rows, 0),
                )
            return False
        try:
            connection.execute(sql.plans.ANALYZE_JOB_TABLE)
        except psycopg.errors.QueryCanceled:
            self._not_before = self._clock() + self._cancelled_retry
            logger.warning(
                "worker %s: the ANALYZE of jobq_job was cancelled (statement_timeout); "
                "it is tried again in %d s",
                self.worker_id,
                self._cancelled_retry,
            )
            self._cancelled_retry = min(self._cancelled_retry * 2, MAX_CANCELLED_RETRY)
            return False
        self._cancelled_retry = CANCELLED_RETRY
        after = self._read(connection)
        if after.counted_by == counts.counted_by and counts.counted_by:
            logger.debug(
                "worker %s: another session held jobq_job: its ANALYZE was skipped",
                self.worker_id,
            )
            return False
        logger.info(
            "worker %s: the statistics of jobq_job counted %d rows in %d kB where it holds "
            "%d live rows in %d kB: it analysed the table (now %d rows)",
            self.worker_id,
            max(counts.counted_rows, 0),
            counts.counted_bytes // 1024,
            counts.live_rows,
            counts.bytes // 1024,
            max(after.counted_rows, 0),
        )
        return True

    @staticmethod
    def _read(connection: psycopg.Connection[Any]) -> TableCounts:
        row = connection.execute(sql.plans.READ_JOB_TABLE_COUNTS).fetchone()
        assert row is not None
        return TableCounts(*row)
