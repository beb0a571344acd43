"""Recurring jobs: schedules, their ticks, and the enqueuer that fires each tick once.

Declare schedules on a job, or in settings::

    from django_jobq import Schedule, job


    @job(schedule="*/5 * * * *")  # every 5 minutes (UTC)
    def refresh_rates() -> None: ...


    @job(
        schedule=[
            Schedule("30 2 * * *", name="report-eu", payload={"region": "eu"}),
            Schedule("0 6 * * 1-5", name="report-us", payload={"region": "us"},
                     timezone="America/New_York"),
        ],
        timezone="Europe/Paris",  # for the schedules that name none
    )
    def nightly_report(region: str) -> None: ...


    JOBQ = {"SCHEDULES": {"cleanup": {"kind": "shop.jobs.cleanup", "cron": "0 4 * * *"}}}

Every worker runs a scheduler (:mod:`django_jobq.worker.scheduler`) that calls
:func:`enqueue_due`. Each schedule has a row in ``jobq_schedule`` holding the last tick
enqueued for it; a scheduler advances that row by compare-and-set in the transaction that
inserts the tick's job, so however many schedulers run, each tick yields exactly one job.

In a rolling deploy two definitions of one schedule name can be live at once (old and new
workers). Each scheduler fires its own definition's ticks; the compare-and-set on the row's
``last_tick`` (which only moves forward) lets each tick instant be enqueued once per schedule
name, whichever definition has it: the schedule runs at the union of the live definitions'
ticks, an instant they share once, and no definition stops the other firing. Whether two
definitions differ is decided on what the cron expressions mean (:func:`cron_meaning`),
not on their text. docs/scheduling.md ("Rolling deploys") has the rules.

Ticks are computed by :class:`Timetable`, which applies the daylight-saving-time policy of
docs/scheduling.md: a particular time of day that a spring-forward skips fires once, at the
first valid instant after the gap; one that a fall-back repeats fires once, at its first
occurrence; a schedule with ``*`` in its minute or hour field follows the clock (as Vixie
cron does).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterError, croniter
from django.core.exceptions import ImproperlyConfigured
from django.db import connections, transaction

from . import enqueueing, registry, sql
from .conf import KIND_NAME_RE, MAX_CATCH_UP, get_settings
from .models import Job

#: Cron's nicknames and the expressions they stand for.
ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
#: Longest cron expression and timezone name (the ``jobq_schedule`` columns' lengths).
MAX_CRON_LENGTH = 200
MAX_TIMEZONE_LENGTH = 100

_SECOND = timedelta(seconds=1)
#: How far back :meth:`Timetable.due` looks first; it doubles the distance until it has enough.
_FIRST_LOOK_BACK = timedelta(minutes=1)
#: How far apart :meth:`Timetable._offset_change` probes for a change of UTC offset. No zone
#: changes its offset twice within a day.
_PROBE = timedelta(days=1)


class InvalidCron(ValueError):
    """A cron expression croniter cannot parse, or one that never matches."""


class InvalidTimezone(ValueError):
    """A timezone name that is not in the IANA database."""


def parse_cron(expression: str) -> str:
    """Return ``expression`` as five or six cron fields (aliases such as ``@daily`` expanded).

    Five fields are minute, hour, day of month, month, day of week; a sixth, optional, is
    the second (croniter's order). Day of month and day of week combine with OR when both
    are restricted, as in cron.

    Raises:
        InvalidCron: not a str, not 5 or 6 fields, a field croniter rejects, or an
            expression that matches no date (``0 0 31 2 *``).
    """
    if not isinstance(expression, str) or len(expression) > MAX_CRON_LENGTH:
        raise InvalidCron(f"a cron expression is a str of at most {MAX_CRON_LENGTH} characters.")
    normalized = " ".join(ALIASES.get(expression.strip().lower(), expression).split())
    if len(normalized.split()) not in (5, 6):
        raise InvalidCron(
            f"{expression!r} has {len(normalized.split())} fields; expected 5 (minute hour "
            f"day-of-month month day-of-week), 6 (the same plus seconds) or an alias "
            f"({', '.join(ALIASES)})."
        )
    try:
        croniter(normalized, datetime(2000, 1, 1)).get_next(datetime)
    except CroniterError as exc:
        problem = str(exc).rstrip(".")
        raise InvalidCron(f"{expression!r} is not a valid cron expression: {problem}.") from None
    return normalized


def _follows_clock(expression: str) -> bool:
    """Whether a parsed expression's minute or hour field is a ``*`` one (the DST policy of
    :class:`Timetable`)."""
    minute, hour = expression.split()[:2]
    return minute.startswith("*") or hour.startswith("*")


def cron_meaning(expression: str) -> tuple[object, ...]:
    """What ``expression`` means, as a value to compare: two expressions with equal meanings
    have the same ticks in every timezone.

    It is the set of values each field matches as croniter expands it (so names and numbers,
    case, ranges, steps, ``*/1``, a range covering the whole field and ``*``, and 7 and 0 for
    Sunday compare equal), the seconds field (``0`` when there are five fields), the ``#``
    and ``L`` days, and whether the expression follows the clock through DST
    (:class:`Timetable`: ``0 * * * *`` does, ``0 0-23 * * *`` names 24 times of day, so the
    two differ in the hour a fall-back repeats). ``@hourly`` and ``0 * * * *`` are equal.

    Raises:
        InvalidCron: as :func:`parse_cron`.
    """
    normalized = parse_cron(expression)
    # croniter's inline annotations do not declare the public ``expand`` classmethod.
    fields, nth_weekdays = croniter.expand(normalized)[:2]  # type: ignore[attr-defined]
    if len(fields) == 5:
        fields = [*fields, [0]]
    return (
        tuple(tuple(values) for values in fields),
        frozenset((day, frozenset(nth)) for day, nth in nth_weekdays.items()),
        _follows_clock(normalized),
    )


def parse_timezone(name: str) -> ZoneInfo:
    """Return the IANA timezone ``name`` (``"Europe/Paris"``, ``"UTC"``).

    Raises:
        InvalidTimezone: not a str, or not a zone in the IANA database.
    """
    if not isinstance(name, str) or not 0 < len(name) <= MAX_TIMEZONE_LENGTH:
        raise InvalidTimezone(
            f"a timezone is a non-empty str of at most {MAX_TIMEZONE_LENGTH} characters, "
            f"not {name!r}."
        )
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: "America" is a directory
        raise InvalidTimezone(
            f"{name!r} is not an IANA timezone (such as 'UTC' or 'Europe/Paris')."
        ) from None


class Timetable:
    """The ticks of a cron expression in a timezone: aware UTC datetimes, whole seconds.

    The cron fields match local wall-clock time. Daylight saving time:

    - a schedule with ``*`` in its minute or hour field (``*/5 * * * *``, ``0 * * * *``)
      follows the clock: it ticks at every instant whose local time matches, so it has no
      tick in the hour a spring-forward skips and ticks twice in the hour a fall-back repeats;
    - any other schedule names particular times of day: one that a spring-forward skips
      ticks once, at the first valid instant after the gap (02:30 becomes 03:00), and one
      that a fall-back repeats ticks at its first occurrence only.

    Raises:
        InvalidCron, InvalidTimezone: on construction.
    """

    def __init__(self, cron: str, timezone: str = "UTC") -> None:
        self.cron = cron
        self.timezone = timezone
        self.zone = parse_timezone(timezone)
        self._expression = parse_cron(cron)
        self.follows_clock = _follows_clock(self._expression)
        self.meaning = (cron_meaning(cron), timezone)

    def __repr__(self) -> str:
        return f"Timetable({self.cron!r}, {self.timezone!r})"

    def same_ticks(self, cron: str, timezone: str) -> bool:
        """Whether ``cron`` in ``timezone`` means this timetable: equal
        :func:`cron_meaning` and the same timezone name. An invalid ``cron`` (a row written
        by another release, say) is not the same."""
        try:
            return (cron_meaning(cron), timezone) == self.meaning
        except InvalidCron:
            return False

    def _offset(self, instant: datetime) -> timedelta:
        # A ZoneInfo always has an offset; `or` only satisfies the type (None -> zero).
        return instant.astimezone(self.zone).utcoffset() or timedelta(0)

    def _first_match(self, wall: datetime) -> datetime:
        """The first naive wall-clock time at or after ``wall`` (whole seconds) that the
        expression matches."""
        return croniter(self._expression, wall - _SECOND).get_next(datetime)

    def _offset_change(self, start: datetime, end: datetime, offset: timedelta) -> datetime | None:
        """The first instant in ``(start, end]`` (whole seconds) whose UTC offset is not
        ``offset``, or ``None``."""
        low = start
        while low < end:
            high = min(low + _PROBE, end)
            if self._offset(high) != offset:
                while high - low > _SECOND:
                    middle = low + ((high - low) // _SECOND // 2) * _SECOND
                    if self._offset(middle) == offset:
                        low = middle
                    else:
                        high = middle
                return high
            low = high
        return None

    def next_after(self, moment: datetime) -> datetime:
        """The first tick strictly after ``moment`` (an aware datetime), in UTC."""
        start = moment.astimezone(UTC).replace(microsecond=0) + _SECOND  # ticks are >= start
        while True:
            offset = self._offset(start)
            wall = self._first_match(_naive(start + offset))
            tick = (wall - offset).replace(tzinfo=UTC)
            change = self._offset_change(start, tick, offset)
            if change is None:
                if self.follows_clock or tick.astimezone(self.zone).fold == 0:
                    return tick
                start = tick + _SECOND  # a repeated time's second occurrence: not a tick
                continue
            new_offset = self._offset(change)
            skipped = new_offset > offset and wall < _naive(change + new_offset)
            if skipped and not self.follows_clock:
                return change  # the first match is in the hour skipped: the gap's end
            start = change  # compute again with the new offset

    def between(self, start: datetime, end: datetime) -> list[datetime]:
        """The ticks in ``(start, end]``, in order."""
        ticks: list[datetime] = []
        tick = self.next_after(start)
        while tick <= end:
            ticks.append(tick)
            tick = self.next_after(tick)
        return ticks

    def due(self, after: datetime, now: datetime, limit: int) -> list[datetime]:
        """The last ``limit`` ticks in ``(after, now]``, oldest first (older ones are skipped).

        Looks back from ``now`` over windows that double in length, so the cost follows the
        ticks returned, not the ticks missed since ``after`` (which may be months of them).
        """
        ticks: list[datetime] = []
        end, span = now, _FIRST_LOOK_BACK
        while len(ticks) < limit and end > after:
            start = max(after, end - span)
            ticks = self.between(start, end) + ticks
            end, span = start, span * 2
        return ticks[-limit:]


def _naive(instant: datetime) -> datetime:
    return instant.replace(tzinfo=None)


@dataclass(frozen=True)
class Schedule:
    """A recurring run of a job, for ``@job(schedule=Schedule(...))``.

    Args:
        cron: 5 fields (minute hour day-of-month month day-of-week), optionally a 6th for
            seconds, or an alias such as ``@daily``; checked by ``manage.py check``
            (``django_jobq.E007``).
        timezone: IANA name the cron fields are read in; default the ``@job``'s
            ``timezone``, then ``"UTC"`` (``django_jobq.E008`` if unknown).
        payload: the handler's keyword arguments for every tick's job (JSON values).
        name: unique among all schedules; default the job's kind. Give each of several
            schedules of one job a name.
        catch_up: after workers were down, at most this many missed ticks are enqueued,
            the most recent ones (1 to 1000; default 1: the latest missed tick only).

    Raises:
        TypeError: a value of the wrong type, or a payload JSON cannot hold.
        ValueError: an invalid name or ``catch_up``.
    """

    cron: str
    timezone: str | None = None
    payload: dict[str, Any] = field(default_factory=dict)
    name: str | None = None
    catch_up: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.cron, str):
            raise TypeError(f"cron must be a str, not {self.cron!r}.")
        if self.timezone is not None and not isinstance(self.timezone, str):
            raise TypeError(f"timezone must be a str, not {self.timezone!r}.")
        if self.name is not None and (
            not isinstance(self.name, str) or not KIND_NAME_RE.match(self.name)
        ):
            raise ValueError(
                f"invalid schedule name {self.name!r}: expected {KIND_NAME_RE.pattern}."
            )
        catch_up = self.catch_up
        if not isinstance(catch_up, int) or isinstance(catch_up, bool):
            raise TypeError(f"catch_up must be an int, not {catch_up!r}.")
        if not 1 <= catch_up <= MAX_CATCH_UP:
            raise ValueError(f"catch_up must be 1 to {MAX_CATCH_UP}, not {catch_up}.")
        enqueueing.encode_payload(self.payload)


def from_job_options(schedule: object, timezone: object) -> tuple[Schedule, ...]:
    """The schedules that ``@job(schedule=..., timezone=...)`` declares.

    ``schedule`` is a cron string, a :class:`Schedule`, or a list or tuple of them;
    ``timezone`` fills in the schedules that name none.

    Raises:
        TypeError: ``schedule`` or ``timezone`` has the wrong type, or ``timezone`` is given
            without ``schedule``.
    """
    if timezone is not None and not isinstance(timezone, str):
        raise TypeError(f"timezone must be an IANA timezone name (str), not {timezone!r}.")
    if schedule is None:
        if timezone is not None:
            raise TypeError("timezone is the timezone of schedule=; give a schedule too.")
        return ()
    items = list(schedule) if isinstance(schedule, list | tuple) else [schedule]
    schedules = []
    for item in items:
        if isinstance(item, str):
            item = Schedule(item)
        if not isinstance(item, Schedule):
            raise TypeError(
                f"schedule must be a cron str, a Schedule, or a list of them; not {item!r}."
            )
        if item.timezone is None and timezone is not None:
            item = dataclasses.replace(item, timezone=timezone)
        schedules.append(item)
    return tuple(schedules)


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
    enqueueing.validate_options(kind=kind)  # settings may hold anything
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
    """A ``jobq_schedule`` row as :data:`sql.SELECT_SCHEDULES` returns it."""

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
        cursor.execute(sql.SELECT_SCHEDULES, {"names": list(names)})
        return {row[0]: _Row(*row) for row in cursor.fetchall()}


def _sync(alias: str, stale: Sequence[tuple[ScheduledJob, datetime]]) -> None:
    """Record each ``(schedule, defined_at)``'s definition in its row (created if absent)."""
    ordered = sorted(stale, key=lambda item: item[0].name)
    with connections[alias].cursor() as cursor:
        cursor.execute(
            sql.SYNC_SCHEDULES,
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
                sql.ADVANCE_SCHEDULE,
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
