"""When a cron expression ticks: cron parsing, timezones, and the ticks of a
:class:`Timetable`, as aware UTC datetimes.

Pure arithmetic on datetimes (croniter and zoneinfo, no database), used by the schedulers
(:mod:`django_jobq.scheduling`) and by the checks of declared schedules.

::

    from django_jobq.timetables import Timetable

    timetable = Timetable("30 2 * * *", "Europe/Paris")
    timetable.next_after(now)                   # the first tick after now (UTC)
    timetable.due(after, now, limit=3)          # the last 3 ticks in (after, now]

Daylight saving time follows the policy of docs/scheduling.md: a particular time of day
that a spring-forward skips fires once, at the first valid instant after the gap; one that
a fall-back repeats fires once, at its first occurrence; a schedule with ``*`` in its minute
or hour field follows the clock (as Vixie cron does).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterError, croniter

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
    fields, nth_weekdays = croniter.expand(normalized)[:2]
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
