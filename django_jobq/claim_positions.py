"""Where a worker's next claim starts reading the jobs table: its claim positions.

Every claim and every ack leaves a dead row version behind, with its index entries. While
the xmin horizon is held back (a ``pg_dump`` or a report holding one snapshot for minutes,
autovacuum off or far behind), nothing can remove them, and the index entries of the jobs
already claimed pile up at the front of the claim order. A claim that reads the queue from
the start of its index walks all of them, one heap visit each, to find the first live job:
its cost grows with every job claimed since the table was last cleaned, and a large backlog
drains slower and slower (docs/performance.md, "Large backlogs", has the figures).

So each worker process remembers where it has read up to, and its claims start there:

- per priority level, a position in the claim order, ``(run_at, id)``: the claim reads that
  level only after it. The position moves past the jobs the claim leased and up to the first
  job the claim saw at that level (its front), never past a job it could still have taken.
  Levels above the highest and below the lowest with a position are read from their start
  (a new, higher priority is claimed at once); a level between two with a position is found
  by the probe (below). At most :data:`LEVELS` positions are kept;
- for lapsed leases, the database time of the claim that last looked at them all: the next
  claim looks only at leases that lapsed since.

A position never moves past ``now() -`` :data:`COMMIT_LAG` seconds: a job's ``run_at`` is
the time of its insert, and a transaction that commits later than jobs enqueued after it
puts a job *behind* a position that has already moved on. Within the lag, claims find it.

A row can still come to sort before a position: a job whose enqueueing transaction stayed
open longer than the lag, a job enqueued with a past ``run_at``, a row another
transaction's lock hid from a claim (the claim skips locked rows), a lease that lapsed
while locked. The **probe** (``sql.claims.PROBE_CLAIM_POSITIONS_*``, run by
:func:`django_jobq.claims.probe_claim_positions`) finds them: it reads the worker's first
claimable job and earliest lapsed lease from the start of the claim order, and
:meth:`ClaimPositions.lower` moves a position back to it. The probe pays the walk the claim
avoids, so the worker runs it only every :meth:`ClaimPositions.probe_interval` seconds
(:data:`PROBE_COST_FACTOR` times the last probe's duration, at least
:data:`MIN_PROBE_INTERVAL`, at most :data:`MAX_PROBE_INTERVAL`), never inside the claim; a
worker whose claim came back empty waits at most until the probe is due, and a burst worker
probes before it stops. Such a row waits at most that long beyond its turn.

Limited claims (:mod:`django_jobq.limited_claims`) keep positions too, one set per set of
limits they claim under, kept only while their claims take all they ask for (a backlog),
and instead of probing read from the start: when their probe would be due, and at once
when a claim from positions finds nothing.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

#: The integer range of ``priority``.
MAX_PRIORITY = 2**31 - 1
MIN_PRIORITY = -(2**31)

#: Stands for ``'-infinity'`` in a position (no finite time is earlier); sent as NULL.
NEGATIVE_INFINITY = datetime.min.replace(tzinfo=UTC)

#: Seconds a position stays behind the database's ``now()``: jobs enqueued in transactions
#: that commit within this long of their insert are found by the claim itself, not only by
#: the probe. While the horizon is held back, each claim walks the entries of about this
#: many seconds of claims at its level.
COMMIT_LAG = 1.0

#: Priority levels a worker keeps a position for (the most recently moved ones).
LEVELS = 8

#: The probe runs at most once per this many times its own last duration: at most 1/20 of
#: a claiming connection's time goes to it, however long the walk it pays.
PROBE_COST_FACTOR = 20.0
#: Seconds between probes at least (a straggler waits at most about this long when the
#: probe is cheap) and at most (however slow the probe).
MIN_PROBE_INTERVAL = 1.0
MAX_PROBE_INTERVAL = 30.0


@dataclass(frozen=True, order=True)
class Position:
    """A place in one priority level's claim order: the claim reads rows with
    ``(run_at, id)`` after it. ``run_at`` is :data:`NEGATIVE_INFINITY` for ``'-infinity'``."""

    run_at: datetime
    id: int

    @classmethod
    def before(cls, run_at: datetime | None, job_id: int) -> Position:
        """The position just before the row ``(run_at, job_id)`` (``None``: ``'-infinity'``)."""
        return cls(NEGATIVE_INFINITY if run_at is None else run_at, job_id - 1)


#: The claim parameters of "read everything": every priority above the lowest, from the
#: start; no level; no lapse time.
FROM_THE_START: dict[str, Any] = {
    "above": MIN_PRIORITY - 1,
    "level_priorities": [],
    "level_after_run_ats": [],
    "level_after_ids": [],
    "below": MIN_PRIORITY,
    "lapsed_from": None,
}


@dataclass(frozen=True)
class Probe:
    """What the probe found: the worker's first claimable ready job (``ready``: its
    ``(priority, run_at, id)``, ``run_at`` ``None`` for ``'-infinity'``; ``None`` when there is
    none) and whether a lapsed lease exists (``lapsed``), lapsed since ``lapsed_since``
    (``None`` for ``'-infinity'``)."""

    ready: tuple[int, datetime | None, int] | None
    lapsed: bool
    lapsed_since: datetime | None


class ClaimPositions:
    """One worker process's claim positions (see the module docstring). Not thread-safe:
    the worker's main loop owns it."""

    def __init__(self) -> None:
        self._levels: dict[int, Position] = {}  # insertion order: least recently moved first
        self._lapsed_from: datetime | None = None  # None: from '-infinity'
        self._probed_at = time.monotonic()
        self._probe_seconds = 0.0

    @property
    def levels(self) -> dict[int, Position]:
        """``{priority: position}`` for the levels with a position (a copy)."""
        return dict(self._levels)

    @property
    def lapsed_from(self) -> datetime | None:
        """The claim looks at leases that lapsed at or after this time (``None``: all)."""
        return self._lapsed_from

    def is_set(self) -> bool:
        """Whether a claim reads less than everything (so stragglers can hide)."""
        return bool(self._levels) or self._lapsed_from is not None

    def params(self) -> dict[str, Any]:
        """The claim statement's parameters: ``above`` and ``below`` (the claim reads every
        level above the highest with a position, and below the lowest, from their start),
        ``level_*`` (each level with a position, read after it) and ``lapsed_from``.

        Levels between two with a position are not read: the probe finds a job there and
        gives its level a position (:meth:`lower`)."""
        if not self._levels:
            return {**FROM_THE_START, "lapsed_from": self._lapsed_from}
        levels = sorted(self._levels.items(), reverse=True)
        return {
            "above": levels[0][0],
            "level_priorities": [priority for priority, _ in levels],
            "level_after_run_ats": [
                None if position.run_at == NEGATIVE_INFINITY else position.run_at
                for _, position in levels
            ],
            "level_after_ids": [position.id for _, position in levels],
            "below": levels[-1][0],
            "lapsed_from": self._lapsed_from,
        }

    def advance(
        self,
        *,
        claimed_at: datetime,
        seen: Iterable[tuple[int, datetime | None, int]],
        lapsed_seen_all: bool,
    ) -> bool:
        """Move the positions after a claim.

        Args:
            claimed_at: the claim's ``now()`` (database time).
            seen: ``(priority, run_at, id)`` per level the claim's front read: the position
                up to which it took or passed every job it could (after the last job it
                leased there, else just before the first job it saw; ``run_at`` ``None``:
                from the level's start).
            lapsed_seen_all: whether the claim took fewer lapsed leases than it could, so
                it saw every lease that had lapsed by ``claimed_at``.

        Returns:
            Whether a level's position moved past the rows this claim read (a claim from
            the new positions reads other rows).
        """
        cap = Position(claimed_at - timedelta(seconds=COMMIT_LAG), 0)
        moved = False
        for priority, run_at, job_id in seen:
            candidate = Position(NEGATIVE_INFINITY if run_at is None else run_at, job_id)
            old = self._levels.pop(priority, None)
            self._levels[priority] = min(candidate if old is None else max(old, candidate), cap)
            # Moved past what this claim read only where the commit lag does not hold it back.
            moved = moved or (candidate <= cap and (old is None or candidate > old))
        while len(self._levels) > LEVELS:
            del self._levels[next(iter(self._levels))]
        if lapsed_seen_all:
            self._lapsed_from = claimed_at
        return moved

    def probe_interval(self) -> float:
        """Seconds between probes: :data:`PROBE_COST_FACTOR` times the last probe's
        duration, within :data:`MIN_PROBE_INTERVAL` and :data:`MAX_PROBE_INTERVAL`."""
        return min(
            max(PROBE_COST_FACTOR * self._probe_seconds, MIN_PROBE_INTERVAL), MAX_PROBE_INTERVAL
        )

    def seconds_until_probe(self) -> float:
        """Seconds until the probe is due (0 when due; ``math.inf`` when nothing is set)."""
        if not self.is_set():
            return float("inf")
        return max(self._probed_at + self.probe_interval() - time.monotonic(), 0.0)

    def lower(self, probe: Probe, *, seconds: float) -> bool:
        """Move positions back to what the probe found before them.

        Args:
            probe: the probe's result.
            seconds: how long the probe took (sets the next interval).

        Returns:
            Whether a position moved back (a straggler waits: claim again at once).
        """
        self._probed_at = time.monotonic()
        self._probe_seconds = seconds
        lowered = False
        if probe.ready is not None:
            priority, run_at, job_id = probe.ready
            found = Position.before(run_at, job_id)
            current = self._levels.get(priority)
            if current is None and self._levels:  # a level claims do not read, or not yet
                lowered = min(self._levels) < priority < max(self._levels)
                self._levels[priority] = found
            elif current is not None and found < current:
                self._levels[priority] = found
                lowered = True
        if probe.lapsed and self._lapsed_from is not None:
            since = probe.lapsed_since
            if since is None or since < self._lapsed_from:
                self._lapsed_from = since
                lowered = True
        return lowered
