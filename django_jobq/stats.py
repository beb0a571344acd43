"""What the queue holds now and what it did lately: the numbers behind ``jobq_stats``, the
admin dashboard and the database gauges of :mod:`django_jobq.metrics`.

::

    from django_jobq import stats

    now = stats.snapshot()                    # -> Snapshot (a few statements)
    for queue in now.queues:                  # QueueState, by queue name
        print(queue.queue, queue.ready, queue.oldest_ready_age)   # jobs, seconds
    now.activity["default"].last_hour.succeeded                   # from the rollups

History: finished jobs are deleted by their ack, so throughput and durations come from
``OutcomeRollup`` rows (per minute, queue and kind), which workers write every few seconds,
and the depth charts from ``QueueSample`` rows (per minute and queue). Windows are whole
minutes on the database clock, UTC: "the last minute" is the minute before the current one,
"the last hour" the 60 minutes before the current one. The current, unfinished minute is
left out, so a window's numbers do not grow while you look at them; they lag by up to a
minute plus a worker's flush interval (5 s).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction
from django.db.models import Count
from django.utils import timezone
from psycopg.rows import dict_row

from . import flow_control, sql
from .conf import get_settings
from .metrics.buckets import DURATION_BUCKETS
from .models import WORKER_STALE_AFTER, DeadLetter, OutcomeRollup, QueueSample, WorkerProcess

#: Seconds after its last beat (``WorkerProcess.last_seen``) that a worker counts as stale
#: (:data:`django_jobq.models.WORKER_STALE_AFTER`).
STALE_AFTER = WORKER_STALE_AFTER
#: Minutes of history the dashboard charts and ``jobq_stats`` read ("the last hour").
HISTORY_MINUTES = 60
#: The most (queue, kind) groups of dead letters a snapshot with a ``count_cap`` reads.
CAPPED_GROUPS = 100


@dataclass(frozen=True)
class QueueState:
    """A queue's live jobs now: ``ready`` (due), ``scheduled`` (``run_at`` in the future),
    ``running`` (leased); ``oldest_ready_age`` is the seconds the longest-waiting due job
    has waited since it became claimable, ``GREATEST(run_at, created_at)`` (0.0: none)."""

    queue: str
    ready: int
    scheduled: int
    running: int
    oldest_ready_age: float


@dataclass(frozen=True)
class DeadLetterGroup:
    """How many dead letters one kind has on one queue."""

    queue: str
    kind: str
    count: int


@dataclass(frozen=True)
class WaitingKind:
    """Due jobs of one kind on one queue that wait for a worker that can run them: live
    workers serve the queue, none has registered the kind
    (``sql.maintenance.WAITING_FOR_A_WORKER``). ``oldest_age`` is the seconds the
    longest-waiting one has waited since it became due;
    ``known`` the kinds the live workers serving the queue have, sorted. After
    ``JOBQ['UNKNOWN_KIND_GRACE']`` they become "unknown kind" dead letters."""

    queue: str
    kind: str
    jobs: int
    oldest_age: float
    known: list[str]


def waiting_kinds(cursor: Any, count_cap: int | None = None) -> list[WaitingKind]:
    """The jobs waiting for a worker that can run them, by queue and kind, read on
    ``cursor`` (a Django or psycopg cursor on the queue database; one statement): all of
    each pair's jobs, or with ``count_cap`` the first ``count_cap + 1`` in claim order (a
    ``jobs`` above ``count_cap`` means "more than"; ``oldest_age`` is among those,
    ``sql.maintenance.WAITING_FOR_A_WORKER_CAPPED``)."""
    if count_cap is None:
        cursor.execute(sql.maintenance.WAITING_FOR_A_WORKER, {"stale_after": STALE_AFTER})
    else:
        params = {"stale_after": STALE_AFTER, "cap": count_cap}
        cursor.execute(sql.maintenance.WAITING_FOR_A_WORKER_CAPPED, params)
    return [
        # Django's cursor leaves jsonb as text; a plain psycopg one decodes it.
        WaitingKind(
            queue, kind, jobs, age or 0.0, json.loads(known) if isinstance(known, str) else known
        )
        for queue, kind, jobs, age, known in cursor.fetchall()
    ]


@dataclass(frozen=True)
class WorkerState:
    """A registered worker process. ``seen_ago`` is the seconds since its last beat;
    ``stale`` means more than :data:`STALE_AFTER` (crashed, hung, or cut off from the
    database). ``queues`` is ``None`` for a worker of every queue; ``kinds`` are the kinds it
    claims (sorted) and ``kinds_fingerprint`` their short hash (the same for workers with the
    same registry, see :func:`django_jobq.registry.kinds_fingerprint`)."""

    worker_id: str
    host: str
    pid: int
    queues: list[str] | None
    concurrency: int
    kinds: list[str]
    kinds_fingerprint: str
    started_at: datetime
    last_seen: datetime
    seen_ago: float
    stale: bool


@dataclass(frozen=True)
class Outcomes:
    """Outcome counts over a window."""

    succeeded: int = 0
    retried: int = 0
    dead_lettered: int = 0

    @property
    def failed(self) -> int:
        """Failed attempts: retried or dead-lettered."""
        return self.retried + self.dead_lettered

    def __add__(self, other: Outcomes) -> Outcomes:
        return Outcomes(
            self.succeeded + other.succeeded,
            self.retried + other.retried,
            self.dead_lettered + other.dead_lettered,
        )


@dataclass(frozen=True)
class QueueActivity:
    """What a queue's workers did: outcomes over the last minute and the last hour, and the
    estimated median and 99th percentile of the last hour's handler durations (seconds;
    ``None`` without runs), from the rollups' buckets (see :func:`quantile`)."""

    queue: str
    last_minute: Outcomes
    last_hour: Outcomes
    duration_p50: float | None
    duration_p99: float | None


@dataclass(frozen=True)
class QueueHistory:
    """A queue's last hour, minute by minute (oldest first, :data:`HISTORY_MINUTES` long):
    outcomes from the rollups (0 for a minute without any), and the sampled ``ready`` depth
    and oldest ready age (``None`` for a minute no worker sampled)."""

    queue: str
    minutes: list[datetime]
    succeeded: list[int]
    failed: list[int]
    ready: list[int | None]
    oldest_ready_age: list[float | None]


@dataclass(frozen=True)
class Snapshot:
    """Everything :func:`snapshot` read. ``taken_at`` is the database's ``now()``;
    ``activity`` and ``history`` are keyed by queue and empty for ``history=False``."""

    taken_at: datetime
    queues: list[QueueState]
    dead_letters: list[DeadLetterGroup]
    workers: list[WorkerState]
    waiting: list[WaitingKind] = field(default_factory=list)
    activity: dict[str, QueueActivity] = field(default_factory=dict)
    history: dict[str, QueueHistory] = field(default_factory=dict)
    #: Every known queue's pause and limits (:func:`django_jobq.flow_control.queue_states`).
    controls: dict[str, flow_control.QueueControl] = field(default_factory=dict)

    @property
    def queue_names(self) -> list[str]:
        """Every queue with live jobs, dead letters or recent outcomes, or paused, sorted."""
        names = {queue.queue for queue in self.queues}
        names.update(group.queue for group in self.dead_letters)
        names.update(self.activity)
        names.update(name for name, control in self.controls.items() if control.paused)
        return sorted(names)

    def pause(self, name: str) -> flow_control.QueueControl | None:
        """Queue ``name``'s controls if it is paused now, else ``None``."""
        control = self.controls.get(name)
        return control if control is not None and control.paused else None

    def queue(self, name: str) -> QueueState:
        """The state of queue ``name`` (all zero if it holds no live job)."""
        for queue in self.queues:
            if queue.queue == name:
                return queue
        return QueueState(name, 0, 0, 0, 0.0)


def local_time(moment: datetime | None) -> str:
    """A time for people, in the current time zone, to the second:
    ``"2026-12-03T10:00:00+01:00"``; ``"-"`` for ``None``."""
    if moment is None:
        return "-"
    return timezone.localtime(moment).isoformat(timespec="seconds")


def paused_cell(control: flow_control.QueueControl | None) -> str:
    """A table's PAUSED cell for a queue's controls: ``"-"`` (not paused, or ``None``),
    ``"yes"`` (until resumed) or ``"until <local time>"``."""
    if control is None or not control.paused:
        return "-"
    return "yes" if control.paused_until is None else f"until {local_time(control.paused_until)}"


def pause_text(control: flow_control.QueueControl) -> str:
    """Why a paused queue's ready jobs wait, for people: ``"the queue is paused (since
    2026-12-03T09:00:00+00:00, until resumed)"`` (times in the current time zone)."""
    until = (
        "until resumed"
        if control.paused_until is None
        else f"until {local_time(control.paused_until)}"
    )
    return f"the queue is paused (since {local_time(control.paused_at)}, {until})"


def format_seconds(seconds: float | None) -> str:
    """A duration for people: ``"38 ms"``, ``"4.2 s"``, ``"12 min"``, ``"3.5 h"``; ``"-"``
    for ``None``."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def quantile(
    q: float, counts: Sequence[int], bounds: Sequence[float] = DURATION_BUCKETS
) -> float | None:
    """Estimate the ``q`` quantile (0 < q <= 1) of a histogram, as Prometheus's
    ``histogram_quantile`` does: find the bucket holding the rank ``q * total`` and
    interpolate linearly inside it (the first bucket starts at 0).

    ``counts[i]`` is the number of values at most ``bounds[i]`` and above ``bounds[i - 1]``;
    ``counts[len(bounds)]`` the values above the last bound. A rank in that last bucket
    gives the last bound (the estimate cannot say how far above it). Returns ``None`` for an
    empty histogram.

    Raises:
        ValueError: ``q`` out of range, or ``counts`` not one longer than ``bounds``.
    """
    if not 0 < q <= 1:
        raise ValueError(f"q must be more than 0 and at most 1, not {q}")
    if len(counts) != len(bounds) + 1:
        raise ValueError(f"expected {len(bounds) + 1} bucket counts, got {len(counts)}")
    total = sum(counts)
    if total == 0:
        return None
    rank = q * total
    below = 0
    for index, count in enumerate(counts):
        if count and below + count >= rank:
            if index == len(bounds):
                return float(bounds[-1])
            lower = bounds[index - 1] if index else 0.0
            return float(lower + (bounds[index] - lower) * (rank - below) / count)
        below += count
    return float(bounds[-1])  # unreachable: the ranks above are covered by the loop


def queue_states(count_cap: int | None = None) -> list[QueueState]:
    """Every queue holding live jobs, by name (one statement): counted exactly
    (``sql.stats.QUEUE_STATES``, which reads every live row), or with ``count_cap`` up to
    ``count_cap + 1`` ready and scheduled jobs per queue (``sql.stats.QUEUE_STATES_CAPPED``: a
    count above ``count_cap`` means "more than ``count_cap``")."""
    with connections[get_settings().DATABASE].cursor() as cursor:
        cursor.cursor.row_factory = dict_row  # the psycopg cursor Django wraps
        if count_cap is None:
            cursor.execute(sql.stats.QUEUE_STATES)
        else:
            cursor.execute(sql.stats.QUEUE_STATES_CAPPED, {"cap": count_cap})
        rows: list[dict[str, Any]] = cursor.fetchall()
    return [
        QueueState(
            queue=row["queue"],
            ready=row["ready"],
            scheduled=row["scheduled"],
            running=row["running"],
            oldest_ready_age=row["oldest_ready_age"] or 0.0,
        )
        for row in rows
    ]


def dead_letter_groups(count_cap: int | None = None) -> list[DeadLetterGroup]:
    """Dead letters counted by queue and kind, sorted: every group counted exactly (reads
    every dead letter), or with ``count_cap`` the first :data:`CAPPED_GROUPS` groups, each
    counted up to ``count_cap + 1`` (``sql.stats.DEAD_LETTER_GROUPS_CAPPED``)."""
    if count_cap is not None:
        with connections[get_settings().DATABASE].cursor() as cursor:
            cursor.cursor.row_factory = dict_row  # the psycopg cursor Django wraps
            cursor.execute(
                sql.stats.DEAD_LETTER_GROUPS_CAPPED, {"cap": count_cap, "groups": CAPPED_GROUPS}
            )
            capped: list[dict[str, Any]] = cursor.fetchall()
        return [DeadLetterGroup(row["queue"], row["kind"], row["dead_letters"]) for row in capped]
    rows = (
        DeadLetter.objects.using(get_settings().DATABASE)
        .values("queue", "kind")
        .annotate(count=Count("id"))
        .order_by("queue", "kind")
    )
    return [DeadLetterGroup(row["queue"], row["kind"], row["count"]) for row in rows]


def workers(now: datetime) -> list[WorkerState]:
    """The registered workers, by host and pid; ``now`` is the database's clock."""
    states = []
    for row in WorkerProcess.objects.using(get_settings().DATABASE).order_by("host", "pid", "id"):
        seen_ago = max((now - row.last_seen).total_seconds(), 0.0)
        states.append(
            WorkerState(
                worker_id=row.worker_id,
                host=row.host,
                pid=row.pid,
                queues=row.queues,
                concurrency=row.concurrency,
                kinds=row.kinds if isinstance(row.kinds, list) else [],
                kinds_fingerprint=row.kinds_fingerprint,
                started_at=row.started_at,
                last_seen=row.last_seen,
                seen_ago=seen_ago,
                stale=seen_ago > STALE_AFTER,
            )
        )
    return states


def _database_now() -> datetime:
    with connections[get_settings().DATABASE].cursor() as cursor:
        cursor.execute(sql.clock.DATABASE_NOW)
        now: datetime = cursor.fetchone()[0]
    return now


def current_minute(now: datetime) -> datetime:
    """The start of the minute ``now`` falls in (seconds and microseconds dropped)."""
    return now.replace(second=0, microsecond=0)


def _activity_and_history(
    now: datetime,
) -> tuple[dict[str, QueueActivity], dict[str, QueueHistory]]:
    alias = get_settings().DATABASE
    end = current_minute(now)
    start = end - timedelta(minutes=HISTORY_MINUTES)
    minutes = [start + timedelta(minutes=n) for n in range(HISTORY_MINUTES)]
    last_minute = minutes[-1]
    hour: dict[str, Outcomes] = defaultdict(Outcomes)
    minute: dict[str, Outcomes] = defaultdict(Outcomes)
    buckets: dict[str, list[int]] = defaultdict(lambda: [0] * (len(DURATION_BUCKETS) + 1))
    per_minute: dict[str, dict[datetime, Outcomes]] = defaultdict(lambda: defaultdict(Outcomes))
    for row in OutcomeRollup.objects.using(alias).filter(minute__gte=start, minute__lt=end):
        outcomes = Outcomes(row.succeeded, row.retried, row.dead_lettered)
        hour[row.queue] += outcomes
        per_minute[row.queue][row.minute] += outcomes
        if row.minute == last_minute:
            minute[row.queue] += outcomes
        if len(row.duration_buckets) == len(DURATION_BUCKETS) + 1:
            queue_buckets = buckets[row.queue]
            for index, count in enumerate(row.duration_buckets):
                queue_buckets[index] += count
    samples: dict[str, dict[datetime, QueueSample]] = defaultdict(dict)
    for sample in QueueSample.objects.using(alias).filter(minute__gte=start, minute__lt=end):
        samples[sample.queue][sample.minute] = sample
    activity = {
        queue: QueueActivity(
            queue=queue,
            last_minute=minute[queue],
            last_hour=hour[queue],
            duration_p50=quantile(0.5, buckets[queue]),
            duration_p99=quantile(0.99, buckets[queue]),
        )
        for queue in sorted(hour)
    }
    history = {}
    for queue in sorted(set(per_minute) | set(samples)):
        counted = [per_minute[queue].get(moment, Outcomes()) for moment in minutes]
        sampled = [samples[queue].get(moment) for moment in minutes]
        history[queue] = QueueHistory(
            queue=queue,
            minutes=minutes,
            succeeded=[o.succeeded for o in counted],
            failed=[o.failed for o in counted],
            ready=[s.ready if s else None for s in sampled],
            oldest_ready_age=[s.oldest_ready_age if s else None for s in sampled],
        )
    return activity, history


def snapshot(*, history: bool = True, count_cap: int | None = None) -> Snapshot:
    """Read the queue's state now: queue depths and oldest ready ages, dead letters by
    queue and kind, registered workers, jobs waiting for a worker that can run them, every
    known queue's pause and limits (one read of ``jobq_queue``); with
    ``history``, also the last hour's activity and per-minute history per queue (from the
    rollups and samples).

    With ``count_cap`` (the admin dashboard's), the reads are bounded however many jobs and
    dead letters there are: each queue's ready and scheduled jobs, each (queue, kind)'s
    dead letters and jobs waiting for a worker are counted up to ``count_cap + 1`` (a count
    above ``count_cap`` means "more than ``count_cap``"), only the first
    :data:`CAPPED_GROUPS` (queue, kind) groups of dead letters are read, and the statements
    run in one transaction without JIT compilation (``sql.stats.DISABLE_JIT``). Without it every
    count is exact (``jobq_stats``, the metrics).

    Raises:
        django.db.DatabaseError: the queue database cannot be read.
    """
    if count_cap is None:
        return _snapshot(history, None)
    with transaction.atomic(using=get_settings().DATABASE):
        with connections[get_settings().DATABASE].cursor() as cursor:
            cursor.execute(sql.stats.DISABLE_JIT)
        return _snapshot(history, count_cap)


def _snapshot(history: bool, count_cap: int | None) -> Snapshot:
    now = _database_now()
    queues = queue_states(count_cap)
    dead_letters = dead_letter_groups(count_cap)
    registered = workers(now)
    with connections[get_settings().DATABASE].cursor() as cursor:
        waiting = waiting_kinds(cursor, count_cap)
    controls = {control.name: control for control in flow_control.queue_states()}
    if not history:
        return Snapshot(now, queues, dead_letters, registered, waiting, controls=controls)
    activity, per_minute = _activity_and_history(now)
    return Snapshot(now, queues, dead_letters, registered, waiting, activity, per_minute, controls)
