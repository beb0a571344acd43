"""The job table's statistics, brought up to date when a backlog has outgrown them.

PostgreSQL plans each statement from the table's statistics, which ANALYZE writes
(autovacuum's, or anyone's). A queue's table is often analysed while it is nearly empty,
between two backlogs, and its statistics then count no row: PostgreSQL estimates each of
its partial indexes at one row however large the table has grown since, and a claim
planned so may read every index entry of a backlog and sort them to take one batch (a
bitmap scan of ``jobq_job_claim_all_idx``: 85,462 entries and 50 ms for a batch of 128,
where reading the index in claim order takes a fraction of a millisecond). Autovacuum
analyses the table again once enough rows have changed, which may take a minute, and with
autovacuum off never: until then the backlog drains at a fraction of its rate
(docs/performance.md, "A backlog the statistics do not know").

So, at most every :data:`CHECK_INTERVAL` seconds, the main loop reads what the statistics
count against what the table holds (``sql.plans.READ_JOB_TABLE_COUNTS``): its size on
disk, which any write shows at once, and its live rows by PostgreSQL's activity counters,
which also see a backlog that filled the empty pages of a table (up to about 10 s late).
When either is at least :data:`GROWTH_FACTOR` times what the statistics count, and more by
at least :data:`MIN_GROWTH_ROWS` rows or :data:`MIN_GROWTH_BYTES` bytes, it analyses the
table (``sql.plans.ANALYZE_JOB_TABLE``): every session's plans that read it are then made
again from the new statistics. A backlog growing from nothing to N rows costs about
log2(N / :data:`MIN_GROWTH_ROWS`) analyses, whichever workers make them; a table that stays
within twice what its statistics count costs one small statement a second.

An ANALYZE that did not change the statistics (the worker's database user does not own
the table, so PostgreSQL skipped it with a warning; another ANALYZE or a VACUUM held the
table) is tried again only once the table has doubled again since.
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


@dataclass(frozen=True)
class TableCounts:
    """What the statistics of ``jobq_job`` count (``counted_rows``: -1 when it was never
    analysed nor vacuumed; ``counted_bytes``), how many ANALYZEs and VACUUMs wrote them
    (``counted_by``), and what the table holds (``live_rows``, ``bytes``):
    ``sql.plans.READ_JOB_TABLE_COUNTS``."""

    counted_rows: float
    counted_bytes: int
    counted_by: int
    live_rows: int
    bytes: int

    def outgrew(self, rows: float, size: int) -> bool:
        """Whether the table holds :data:`GROWTH_FACTOR` times ``rows`` rows or ``size``
        bytes, and at least :data:`MIN_GROWTH_ROWS` rows or :data:`MIN_GROWTH_BYTES` bytes
        more."""
        return _outgrew(self.live_rows, rows, MIN_GROWTH_ROWS) or _outgrew(
            self.bytes, size, MIN_GROWTH_BYTES
        )


def _outgrew(now: float, counted: float, least: float) -> bool:
    return now >= GROWTH_FACTOR * counted and now - counted >= least


class StatisticsCheck:
    """Analyses ``jobq_job`` when a backlog has outgrown its statistics (see the module's
    docstring). Used by the main loop's thread only."""

    def __init__(self, *, worker_id: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.worker_id = worker_id
        self._checks = Every(CHECK_INTERVAL, clock=clock)
        #: The counts read when this worker last analysed the table (``None``: not yet).
        self._tried: TableCounts | None = None

    def run_if_due(self, connection: psycopg.Connection[Any]) -> bool:
        """:meth:`run` if :data:`CHECK_INTERVAL` seconds have passed since the last time;
        whether it analysed the table."""
        return self._checks.due() and self.run(connection)

    def run(self, connection: psycopg.Connection[Any]) -> bool:
        """Read the table's counts and analyse it if it has outgrown its statistics (see
        the module's docstring); whether it analysed it.

        Args:
            connection: the main loop's autocommit connection to the queue database.

        Raises:
            psycopg.Error: a statement failed (the ANALYZE too, e.g. cancelled by the
                connection's ``statement_timeout``: it is tried again only once the table
                has doubled again).
        """
        row = connection.execute(sql.plans.READ_JOB_TABLE_COUNTS).fetchone()
        assert row is not None
        counts = TableCounts(*row)
        rows, size = counts.counted_rows, counts.counted_bytes
        tried = self._tried
        if tried is not None and tried.counted_by == counts.counted_by:
            # No ANALYZE nor VACUUM since the worker's (skipped): count from what the table
            # held then.
            rows, size = max(rows, tried.live_rows), max(size, tried.bytes)
        if not counts.outgrew(rows, size):
            return False
        self._tried = counts
        connection.execute(sql.plans.ANALYZE_JOB_TABLE)
        logger.info(
            "worker %s: the statistics of jobq_job counted %d rows in %d kB where it holds "
            "%d live rows in %d kB: it analysed the table",
            self.worker_id,
            max(counts.counted_rows, 0),
            counts.counted_bytes // 1024,
            counts.live_rows,
            counts.bytes // 1024,
        )
        return True
