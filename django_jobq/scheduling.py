"""The schedules in force and the enqueuer that fires each of their ticks once.

:func:`declared` binds every schedule declared in code (``@job(schedule=...)``, see
:mod:`django_jobq.schedules`) and in ``JOBQ['SCHEDULES']`` to its kind and checks it (the
system checks ``django_jobq.E006``-``E009`` and ``W001``); :func:`collect` returns them for a
scheduler. Every worker runs a scheduler (:mod:`django_jobq.worker.scheduler`) that calls
:func:`enqueue_due`. Each schedule has a row in ``jobq_schedule`` holding the last tick
enqueued for it; a scheduler advances that row by compare-and-set in the transaction that
inserts the tick's job, so however many schedulers run, each tick yields exactly one job.

In a rolling deploy two definitions of one schedule name can be live at once (old and new
workers). Each scheduler fires its own definition's ticks; the compare-and-set on the row's
``last_tick`` (which only moves forward) lets each tick instant be enqueued once per schedule
name, whichever definition has it: the schedule runs at the union of the live definitions'
ticks, an instant they share once, and no definition stops the other firing. Whether two
definitions differ is decided on what the cron expressions mean
(:func:`~django_jobq.timetables.cron_meaning`), not on their text. docs/scheduling.md
("Rolling deploys") has the rules.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import connections, transaction
from psycopg.rows import class_row

from . import enqueueing, registry, sql
from .conf import get_settings
from .models import Job
from .schedules import Schedule
from .timetables import InvalidCron, InvalidTimezone, Timetable
from .validation import validate_options


@dataclass(frozen=True)
class ScheduledJob:
    """A declared schedule bound to its job: what a scheduler enqueues at each tick.

    ``origin`` says where it was declared, for messages. Build them with :func:`declared`.
    """

    name: str
    kind: str
    timetable: Timetable
    payload: dict[str, Any]
    catch_up: int
    origin: str

    def prepare(self, tick: datetime) -> enqueueing.PreparedJob:
        """The job for ``tick``: the kind's defaults, this payload, ``run_at`` the tick.

        A kind not registered here is enqueued all the same (another service's workers may
        run it): ``manage.py check`` warned of it (``django_jobq.W001``)."""
        return enqueueing.prepare_job(self.kind, self.payload, run_at=tick, allow_unregistered=True)


def _bind(origin: str, kind: Any, schedule: Schedule) -> ScheduledJob:
    """Raises InvalidCron, InvalidTimezone, or ValueError/TypeError for anything else."""
    timetable = Timetable(schedule.cron, schedule.timezone or "UTC")
    validate_options(kind=kind)  # settings may hold anything
    definition = registry.get(kind)
    if definition is not None:
        definition.check_payload(schedule.payload)  # TypeError if the handler cannot take it
    return ScheduledJob(
        name=schedule.name or kind,
        kind=kind,
        timetable=timetable,
        payload=dict(schedule.payload),
        catch_up=schedule.catch_up,
        origin=origin,
    )


def _declarations() -> list[tuple[str, Any, Any]]:
    """``(origin, kind, Schedule or settings dict)`` for every declared schedule; settings
    values are unchecked."""
    found: list[tuple[str, Any, Any]] = []
    for definition in registry.definitions():
        found += [(f"@job {definition.kind}", definition.kind, s) for s in definition.schedules]
    for name, spec in get_settings().SCHEDULES.items():
        found.append((f"JOBQ['SCHEDULES'][{name!r}]", spec["kind"], {**spec, "name": name}))
    return found


def declared() -> tuple[list[ScheduledJob], list[tuple[str, str]]]:
    """Every schedule declared in code and settings, and the problems found.

    Returns:
        The valid schedules, and ``(check id, message)`` for the others: ``E006`` invalid
        value (name, kind, payload, catch_up), ``E007`` cron, ``E008`` timezone, ``E009``
        a name used twice; ``W001`` a settings schedule whose kind no handler in this
        process has (it is still enqueued).

    Raises:
        ImproperlyConfigured: the ``JOBQ`` setting itself is invalid.
    """
    schedules: list[ScheduledJob] = []
    names: set[str] = set()
    problems: list[tuple[str, str]] = []
    for origin, kind, spec in _declarations():
        try:
            if isinstance(spec, dict):
                fields = {key: value for key, value in spec.items() if key != "kind"}
                spec = Schedule(**fields)
            bound = _bind(origin, kind, spec)
        except InvalidCron as exc:
            problems.append(("django_jobq.E007", f"{origin}: {exc}"))
        except InvalidTimezone as exc:
            problems.append(("django_jobq.E008", f"{origin}: {exc}"))
        except (TypeError, ValueError) as exc:
            problems.append(("django_jobq.E006", f"{origin}: {exc}"))
        else:
            if registry.get(kind) is None:
                problems.append(
                    (
                        "django_jobq.W001",
                        f"{origin}: no handler of kind {kind!r} is registered in this process; "
                        "its jobs wait for a worker that has it, then become 'unknown kind' "
                        "dead letters after JOBQ['UNKNOWN_KIND_GRACE'].",
                    )
                )
            if bound.name in names:
                problems.append(
                    (
                        "django_jobq.E009",
                        f"{origin}: another schedule is named {bound.name!r}; give each "
                        f"schedule its own name (Schedule(name=...) or the settings key).",
                    )
                )
            else:
                names.add(bound.name)
                schedules.append(bound)
    return schedules, problems


def collect() -> list[ScheduledJob]:
    """Every schedule declared in code and settings, as a scheduler runs them.

    Raises:
        ImproperlyConfigured: a schedule is invalid (the messages are the system checks').
    """
    schedules, problems = declared()
    errors = [(check_id, msg) for check_id, msg in problems if ".E" in check_id]
    if errors:
        raise ImproperlyConfigured("; ".join(f"{msg} ({check_id})" for check_id, msg in errors))
    return schedules


# -- the enqueuer --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Row:
    """A ``jobq_schedule`` row as :data:`sql.schedules.SELECT_SCHEDULES` returns it."""

    name: str
    kind: str
    cron: str
    timezone: str
    defined_at: datetime
    last_tick: datetime | None

    @property
    def after(self) -> datetime:
        """Ticks after this instant are not enqueued yet (by a scheduler of its definition)."""
        return max(self.defined_at, self.last_tick or self.defined_at)

    def same_ticks(self, schedule: ScheduledJob) -> bool:
        """The row's cron and timezone mean ``schedule``'s (compared by meaning)."""
        return schedule.timetable.same_ticks(self.cron, self.timezone)

    def describes(self, schedule: ScheduledJob) -> bool:
        """The row holds ``schedule``'s definition: the same ticks and the same handler (a
        kind and its alias are the same handler)."""
        return self.same_ticks(schedule) and _handler(self.kind) == _handler(schedule.kind)


def _handler(kind: str) -> str:
    """The kind of the handler that runs jobs of ``kind`` here (an alias's new name)."""
    definition = registry.get(kind)
    return kind if definition is None else definition.kind


@dataclass(frozen=True)
class Enqueued:
    """A tick's job, as :func:`enqueue_due` enqueued it."""

    schedule: str
    tick: datetime
    job: Job


@dataclass(frozen=True)
class Round:
    """What one :func:`enqueue_due` call did.

    ``next_due`` is the earliest instant at which another call may have work: the next tick
    of any schedule, or the round's ``now`` when another scheduler advanced a schedule
    under this one (look again at once); ``None`` without schedules.
    """

    enqueued: list[Enqueued]
    next_due: datetime | None


def _read_rows(alias: str, names: Sequence[str]) -> dict[str, _Row]:
    with connections[alias].cursor() as cursor:
        cursor.cursor.row_factory = class_row(_Row)  # the psycopg cursor Django wraps
        cursor.execute(sql.schedules.SELECT_SCHEDULES, {"names": list(names)})
        rows: list[_Row] = cursor.fetchall()
    return {row.name: row for row in rows}


def _sync(alias: str, stale: Sequence[tuple[ScheduledJob, datetime]]) -> None:
    """Record each ``(schedule, defined_at)``'s definition in its row (created if absent)."""
    ordered = sorted(stale, key=lambda item: item[0].name)
    with connections[alias].cursor() as cursor:
        cursor.execute(
            sql.schedules.SYNC_SCHEDULES,
            {
                "name": [schedule.name for schedule, _ in ordered],
                "kind": [schedule.kind for schedule, _ in ordered],
                "cron": [schedule.timetable.cron for schedule, _ in ordered],
                "timezone": [schedule.timetable.timezone for schedule, _ in ordered],
                "defined_at": [defined_at for _, defined_at in ordered],
            },
        )


def _first_round(
    alias: str, schedules: Sequence[ScheduledJob], rows: dict[str, _Row], now: datetime
) -> dict[str, datetime]:
    """The floor of each schedule a scheduler runs for the first time: the instant after
    which it enqueues ticks. Its row's ``after`` when the row already has its timetable (so
    missed ticks are caught up after an outage); ``now`` when the row is new or has another
    timetable (a changed cron takes effect at its next tick). A row that does not hold the
    schedule's definition is given it (``defined_at`` moved to ``now`` if the timetable
    differs): it then shows the definition most recently started."""
    floors: dict[str, datetime] = {}
    stale: list[tuple[ScheduledJob, datetime]] = []
    for schedule in schedules:
        row = rows.get(schedule.name)
        if row is not None and row.same_ticks(schedule):
            floors[schedule.name] = row.after
            if not row.describes(schedule):
                stale.append((schedule, row.defined_at))
        else:
            floors[schedule.name] = now
            stale.append((schedule, now))
    if stale:
        _sync(alias, stale)
    return floors


def _enqueue_ticks(
    alias: str, schedule: ScheduledJob, last_tick: datetime | None, ticks: Sequence[datetime]
) -> list[Job] | None:
    """Enqueue the ticks' jobs and advance the row from ``last_tick``, in one transaction;
    ``None`` (and nothing written) if another scheduler advanced the row first."""
    prepared = [schedule.prepare(tick) for tick in ticks]
    with transaction.atomic(using=alias):
        with connections[alias].cursor() as cursor:
            cursor.execute(
                sql.schedules.ADVANCE_SCHEDULE,
                {"name": schedule.name, "tick": ticks[-1], "last_tick": last_tick},
            )
            if not cursor.fetchall():
                return None
        return enqueueing.enqueue_many(prepared)


def enqueue_due(
    schedules: Sequence[ScheduledJob],
    *,
    now: datetime,
    floors: dict[str, datetime] | None = None,
) -> Round:
    """Enqueue the job of every due tick of ``schedules``, each tick exactly once however
    many schedulers call this concurrently, with one definition of a schedule or several.

    A schedule first seen (no row yet, or a row with another cron or timezone, compared by
    meaning) fires from its next tick after ``now``. A tick is due once ``now`` reaches it;
    of several due ticks (the schedulers were down) the last ``catch_up`` are enqueued, each
    job with ``run_at`` its tick. Each schedule's jobs and its row's new ``last_tick`` commit
    together, the row advanced by compare-and-set on the ``last_tick`` this call read: a
    scheduler that loses the race writes nothing. ``last_tick`` only moves forward, so no
    instant at or before it is enqueued again, by this definition or another one.

    Args:
        schedules: from :func:`collect` (names unique).
        now: this scheduler's clock, an aware datetime (tests pass simulated times).
        floors: this scheduler's memory, schedule name -> the instant after which it
            enqueues ticks; filled in on its first round of each schedule (see
            :func:`_first_round`), or when the schedule's row was deleted, and read on the
            next ones. Pass the
            same dict to every call of one scheduler (:class:`~.worker.scheduler.Scheduler`
            does). ``None``: a new dict, so this call is a scheduler's first round.

    Returns:
        The jobs enqueued, and when to call again (:class:`Round`).

    Raises:
        ValueError: ``now`` is naive.
    """
    if now.utcoffset() is None:
        raise ValueError("now must be an aware datetime.")
    if not schedules:
        return Round([], None)
    floors = {} if floors is None else floors
    alias = get_settings().DATABASE
    rows = _read_rows(alias, [schedule.name for schedule in schedules])
    # A row deleted under a running scheduler (safe, see the model) starts afresh too.
    first = [s for s in schedules if s.name not in floors or s.name not in rows]
    if first:
        floors.update(_first_round(alias, first, rows, now))
    enqueued: list[Enqueued] = []
    next_due: list[datetime] = []
    for schedule in schedules:
        row = rows.get(schedule.name)
        last_tick = row.last_tick if row is not None else None
        after = max(floors[schedule.name], last_tick or floors[schedule.name])
        ticks = schedule.timetable.due(after, now, schedule.catch_up)
        if ticks:
            jobs = _enqueue_ticks(alias, schedule, last_tick, ticks)
            if jobs is None:
                next_due.append(now)
                continue
            enqueued += [Enqueued(schedule.name, t, j) for t, j in zip(ticks, jobs, strict=True)]
            after = ticks[-1]
        next_due.append(schedule.timetable.next_after(max(after, now)))
    return Round(enqueued, min(next_due))
