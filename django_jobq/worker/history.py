"""The statistics history a worker writes: per-minute outcome rollups and queue samples.

Finished jobs are deleted by their ack, so what they did is kept here instead, for
:mod:`django_jobq.stats` (``jobq_stats``, the admin dashboard). Nothing is written per job:
:class:`OutcomeRollups` adds outcomes up in memory and writes them all with one statement
(``sql.stats.UPSERT_OUTCOME_ROLLUPS``); :func:`sample_queues` records every queue's depth for the
current minute, once per minute across all workers (``sql.stats.SAMPLE_QUEUES``). The worker's
:class:`~django_jobq.worker.observer.Observer` decides when (every :data:`FLUSH_INTERVAL` and
:data:`SAMPLE_INTERVAL` seconds).
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

from .. import sql
from ..db import Cursor
from ..metrics.buckets import DURATION_BUCKETS

#: Seconds between two flushes of a worker's outcome rollups (when it has outcomes).
FLUSH_INTERVAL = 5.0
#: Seconds between two of a worker's attempts to sample the queues: well under a minute, so
#: that even a lone worker's attempts, drifting against the clock, miss no minute (an
#: attempt in a minute already sampled costs one index probe).
SAMPLE_INTERVAL = 20.0


def _empty_buckets() -> list[int]:
    return [0] * (len(DURATION_BUCKETS) + 1)


@dataclass
class _Pending:
    succeeded: int = 0
    retried: int = 0
    dead_lettered: int = 0
    duration_sum: float = 0.0
    buckets: list[int] = field(default_factory=_empty_buckets)


class OutcomeRollups:
    """Outcome counts and duration histograms per (queue, kind), waiting for a flush.

    Used from one thread (the worker's main loop), so it has no lock.
    """

    def __init__(self) -> None:
        self._pending: dict[tuple[str, str], _Pending] = {}

    @property
    def pending(self) -> bool:
        """True if outcomes wait for a flush."""
        return bool(self._pending)

    def add(self, queue: str, kind: str, outcome: str, duration: float | None) -> None:
        """Count one recorded outcome (``"succeeded"``, ``"retried"`` or ``"dead_lettered"``)
        and, if the handler ran, its ``duration`` in seconds.

        Raises:
            ValueError: an unknown ``outcome``.
        """
        pending = self._pending.setdefault((queue, kind), _Pending())
        if outcome == "succeeded":
            pending.succeeded += 1
        elif outcome == "retried":
            pending.retried += 1
        elif outcome == "dead_lettered":
            pending.dead_lettered += 1
        else:
            raise ValueError(f"unknown outcome {outcome!r}")
        if duration is not None:
            pending.duration_sum += duration
            # A duration equal to a bound belongs to that bound's bucket (Prometheus's "le").
            pending.buckets[bisect_left(DURATION_BUCKETS, duration)] += 1

    def flush(self, cursor: Cursor) -> int:
        """Add the pending outcomes to the current minute's rollup rows with one statement;
        return how many (queue, kind) rows it wrote (0, and no statement, if none waited).

        Raises:
            psycopg.Error: the statement failed; the outcomes stay pending for the next flush.
        """
        if not self._pending:
            return 0
        taken, self._pending = self._pending, {}
        keys = sorted(taken)  # the statement's lock order (see UPSERT_OUTCOME_ROLLUPS)
        rows = [taken[key] for key in keys]
        try:
            cursor.execute(
                sql.stats.UPSERT_OUTCOME_ROLLUPS,
                {
                    "queue": [queue for queue, _ in keys],
                    "kind": [kind for _, kind in keys],
                    "succeeded": [row.succeeded for row in rows],
                    "retried": [row.retried for row in rows],
                    "dead_lettered": [row.dead_lettered for row in rows],
                    "duration_sum": [row.duration_sum for row in rows],
                    "buckets": [count for row in rows for count in row.buckets],
                    "bucket_count": len(DURATION_BUCKETS) + 1,
                },
            )
        except BaseException:
            for key, row in taken.items():  # keep them, merged with any added since
                self._merge(key, row)
            raise
        return len(keys)

    def _merge(self, key: tuple[str, str], row: _Pending) -> None:
        pending = self._pending.setdefault(key, _Pending())
        pending.succeeded += row.succeeded
        pending.retried += row.retried
        pending.dead_lettered += row.dead_lettered
        pending.duration_sum += row.duration_sum
        pending.buckets = [a + b for a, b in zip(pending.buckets, row.buckets, strict=True)]


def sample_queues(cursor: Cursor) -> int:
    """Sample every queue's depth and oldest ready age for the current minute, unless
    another worker already did; return the number of queues sampled (0: already done, or
    no live jobs)."""
    cursor.execute(sql.stats.QUEUES_SAMPLED_THIS_MINUTE)
    ((sampled,),) = cursor.fetchall()
    if sampled:
        return 0
    cursor.execute(sql.stats.SAMPLE_QUEUES)
    return len(cursor.fetchall())
