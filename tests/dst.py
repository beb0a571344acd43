"""Schedules around daylight saving time changes: the ticks a time-of-day cron has on the
days a clock springs forward or falls back, shared by the timetable's unit tests
(tests/unit/test_timetable.py) and the schedulers' database tests (tests/test_schedules.py)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

import pytest

DST_DAYS = [
    pytest.param(
        "America/New_York",
        "30 2 * * *",
        ["2026-03-07 02:30 EST", "2026-03-08 03:00 EDT", "2026-03-09 02:30 EDT"],
        id="New York spring forward: 02:30 runs at 03:00",
    ),
    pytest.param(
        "America/New_York",
        "30 1 * * *",
        ["2026-10-31 01:30 EDT", "2026-11-01 01:30 EDT", "2026-11-02 01:30 EST"],
        id="New York fall back: the first 01:30 only",
    ),
    pytest.param(
        "Europe/Paris",
        "30 2 * * *",
        ["2026-03-28 02:30 CET", "2026-03-29 03:00 CEST", "2026-03-30 02:30 CEST"],
        id="Paris spring forward: 02:30 runs at 03:00",
    ),
    pytest.param(
        "Europe/Paris",
        "30 2 * * *",
        ["2026-10-24 02:30 CEST", "2026-10-25 02:30 CEST", "2026-10-26 02:30 CET"],
        id="Paris fall back: the first 02:30 only",
    ),
]


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0, us: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, us, tzinfo=UTC)


def local(ticks: Sequence[datetime], zone: str) -> list[str]:
    """``ticks`` as local times in ``zone``, the way :data:`DST_DAYS` writes them."""
    return [tick.astimezone(ZoneInfo(zone)).strftime("%Y-%m-%d %H:%M %Z") for tick in ticks]


def window(zone: str, expected: Sequence[str]) -> tuple[datetime, datetime]:
    """From the first expected day's local midnight to the last one's end."""
    first, last = (date.fromisoformat(day[:10]) for day in (expected[0], expected[-1]))
    zoneinfo = ZoneInfo(zone)
    return (
        datetime.combine(first, time(0), zoneinfo),
        datetime.combine(last + timedelta(days=1), time(0), zoneinfo),
    )
