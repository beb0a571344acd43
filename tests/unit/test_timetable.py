"""Schedule timetables: the ticks of a cron expression in a timezone, across daylight saving
time changes, missed ticks and catch-up; cron expressions compared by meaning; the checks on
a ``Schedule``'s arguments. Pure arithmetic on aware datetimes: no database, no clock."""

from __future__ import annotations

import itertools
from datetime import date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from django_jobq.schedules import Schedule
from django_jobq.timetables import (
    MAX_CRON_LENGTH,
    InvalidCron,
    InvalidTimezone,
    Timetable,
    cron_meaning,
    parse_cron,
    parse_timezone,
)
from tests.dst import DST_DAYS, local, utc, window

# -- ticks and daylight saving time --------------------------------------------------------


@pytest.mark.parametrize(("zone", "cron", "expected"), DST_DAYS)
def test_a_time_of_day_runs_once_on_dst_days(zone, cron, expected):
    start, end = window(zone, expected)
    assert local(Timetable(cron, zone).between(start, end), zone) == expected


@pytest.mark.parametrize(("zone", "cron", "expected"), DST_DAYS)
def test_utc_schedules_are_unaffected_by_dst(zone, cron, expected):
    start, end = window(zone, expected)
    ticks = Timetable("30 2 * * *", "UTC").between(start, end)
    assert [tick.strftime("%H:%M") for tick in ticks] == ["02:30"] * len(ticks)
    assert all(b - a == timedelta(days=1) for a, b in itertools.pairwise(ticks))


@pytest.mark.parametrize(
    ("zone", "day", "hours"),
    [
        ("America/New_York", date(2026, 3, 8), 23),
        ("America/New_York", date(2026, 11, 1), 25),
        ("Europe/Paris", date(2026, 3, 29), 23),
        ("Europe/Paris", date(2026, 10, 25), 25),
    ],
)
def test_a_schedule_with_a_wildcard_hour_follows_the_clock_through_dst(zone, day, hours):
    start = datetime.combine(day, time(0), ZoneInfo(zone))
    end = datetime.combine(day + timedelta(days=1), time(0), ZoneInfo(zone))
    ticks = Timetable("*/30 * * * *", zone).between(start, end)
    assert len(ticks) == hours * 2  # the 23- or 25-hour day, every half hour
    assert {b - a for a, b in itertools.pairwise(ticks)} == {timedelta(minutes=30)}


def test_times_skipped_together_run_once_at_the_end_of_the_gap():
    timetable = Timetable("0,30 2,3 * * *", "America/New_York")  # 02:00 02:30 03:00 03:30
    ticks = timetable.between(utc(2026, 3, 8, 5), utc(2026, 3, 8, 9))
    assert local(ticks, "America/New_York") == ["2026-03-08 03:00 EDT", "2026-03-08 03:30 EDT"]
    repeated = Timetable("0,30 1 * * *", "America/New_York")
    ticks = repeated.between(utc(2026, 11, 1, 4), utc(2026, 11, 1, 8))
    assert local(ticks, "America/New_York") == ["2026-11-01 01:00 EDT", "2026-11-01 01:30 EDT"]


def test_seconds_field_and_aliases():
    every_20_s = Timetable("* * * * * */20")
    assert every_20_s.between(utc(2026, 1, 1), utc(2026, 1, 1, 0, 1)) == [
        utc(2026, 1, 1, 0, 0, 20),
        utc(2026, 1, 1, 0, 0, 40),
        utc(2026, 1, 1, 0, 1, 0),
    ]
    assert Timetable("@daily", "Europe/Paris").next_after(utc(2026, 1, 1, 12)) == utc(
        2026, 1, 1, 23
    )
    assert Timetable("@hourly").follows_clock
    assert not Timetable("30 2 * * *").follows_clock


def test_next_after_is_strictly_after():
    timetable = Timetable("* * * * *")
    assert timetable.next_after(utc(2026, 1, 1, 12, 0)) == utc(2026, 1, 1, 12, 1)
    assert timetable.next_after(utc(2026, 1, 1, 11, 59, 59, 999999)) == utc(2026, 1, 1, 12, 0)


@pytest.mark.parametrize(
    "cron",
    ["61 * * * *", "* * * *", "* * * * * * *", "0 0 31 2 *", "H * * * *", "", "@fortnightly", 5],
)
def test_invalid_cron_expressions(cron):
    with pytest.raises(InvalidCron):
        Timetable(cron)


@pytest.mark.parametrize(
    "zone", ["Mars/Olympus", "America", "europe/paris", "", "../etc/passwd", None, "x" * 101]
)
def test_invalid_timezones(zone):
    with pytest.raises(InvalidTimezone):
        Timetable("* * * * *", zone)


# -- cron expressions compared by meaning ---------------------------------------------------


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ("@hourly", "0 * * * *"),
        ("@HOURLY", "0 * * * *"),
        (" @daily ", "0 0 * * *"),
        ("@midnight", "@daily"),
        ("0  *   * * *", "0 * * * *"),
        ("*/1 * * * *", "* * * * *"),
        ("0 */1 * * *", "0 * * * *"),
        ("0 0 * jan mon", "0 0 * 1 1"),
        ("0 0 * JAN MON", "0 0 * Jan Mon"),
        ("0 0 * * 7", "0 0 * * 0"),
        ("0 0 * * sun-sat", "0 0 * * *"),
        ("0 0 1-31 * *", "0 0 * * *"),
        ("5,0 0 * * *", "0,5 0 * * *"),
        ("0-10/5 0 * * *", "0,5,10 0 * * *"),
        ("0 * * * * 0", "0 * * * *"),  # seconds 0: the five-field form
        ("* * * * * */1", "* * * * * *"),
    ],
)
def test_crons_of_the_same_meaning_are_equal(one, other):
    assert cron_meaning(one) == cron_meaning(other)
    assert Timetable(one).same_ticks(other, "UTC")


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ("@hourly", "30 * * * *"),
        ("@daily", "0 0 * * 1"),
        ("0 0 * * 1", "0 0 * * 2"),
        ("0 0 1 * 1", "0 0 1 * *"),  # day of month OR day of week
        ("0 0 * * 1#2", "0 0 * * 1"),
        ("0 0 L * *", "0 0 * * *"),
        ("* * * * *", "* * * * * */2"),
        ("* * * * * 0", "* * * * * 30"),
        # Same minutes, but 0-23 names times of day, which a DST fall-back does not repeat.
        ("0 0-23 * * *", "0 * * * *"),
    ],
)
def test_crons_of_different_meanings_differ(one, other):
    assert cron_meaning(one) != cron_meaning(other)
    assert not Timetable(one).same_ticks(other, "UTC")


def test_same_ticks_compares_the_timezone_and_survives_an_invalid_cron():
    assert not Timetable("@hourly", "UTC").same_ticks("0 * * * *", "Europe/Paris")
    assert not Timetable("@hourly").same_ticks("not a cron", "UTC")
    with pytest.raises(InvalidCron):
        cron_meaning("not a cron")


# -- parsing -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cron", "parsed"),
    [
        ("@daily", "0 0 * * *"),
        (" @HOURLY ", "0 * * * *"),
        ("@weekly", "0 0 * * 0"),
        ("0  *   * * *", "0 * * * *"),
        ("* * * * * */20", "* * * * * */20"),
    ],
)
def test_parse_cron_expands_aliases_and_normalises_spaces(cron: str, parsed: str) -> None:
    assert parse_cron(cron) == parsed


def test_a_cron_expression_is_at_most_so_long() -> None:
    with pytest.raises(InvalidCron, match=f"at most {MAX_CRON_LENGTH} characters"):
        parse_cron("* " * MAX_CRON_LENGTH)


def test_parse_timezone_gives_the_zone() -> None:
    assert parse_timezone("Europe/Paris") == ZoneInfo("Europe/Paris")


# -- missed ticks: due() -------------------------------------------------------------------


def test_due_gives_the_last_ticks_up_to_now_oldest_first() -> None:
    every_five = Timetable("*/5 * * * *")
    after, now = utc(2026, 5, 1, 12, 0, 1), utc(2026, 5, 1, 13, 2)  # 12 ticks were missed
    assert every_five.due(after, now, limit=3) == [
        utc(2026, 5, 1, 12, 50),
        utc(2026, 5, 1, 12, 55),
        utc(2026, 5, 1, 13, 0),
    ]
    assert every_five.due(after, now, limit=1000) == every_five.between(after, now)
    assert len(every_five.due(after, now, limit=1000)) == 12


def test_due_excludes_after_and_includes_now() -> None:
    hourly = Timetable("@hourly")
    assert hourly.due(utc(2026, 5, 1, 12), utc(2026, 5, 1, 13), limit=5) == [utc(2026, 5, 1, 13)]
    assert hourly.due(utc(2026, 5, 1, 12), utc(2026, 5, 1, 12, 59, 59), limit=5) == []


def test_due_after_months_of_missed_ticks_looks_back_only_as_far_as_it_needs() -> None:
    every_minute = Timetable("* * * * *")
    now = utc(2026, 5, 1, 12, 0, 30)
    ticks = every_minute.due(now - timedelta(days=365), now, limit=2)
    assert ticks == [utc(2026, 5, 1, 11, 59), utc(2026, 5, 1, 12, 0)]


def test_between_is_open_at_its_start_and_closed_at_its_end() -> None:
    hourly = Timetable("@hourly")
    assert hourly.between(utc(2026, 5, 1, 12), utc(2026, 5, 1, 14)) == [
        utc(2026, 5, 1, 13),
        utc(2026, 5, 1, 14),
    ]
    assert hourly.between(utc(2026, 5, 1, 12), utc(2026, 5, 1, 12)) == []


def test_ticks_are_whole_seconds_in_utc_whatever_the_moment_given() -> None:
    paris = Timetable("0 9 * * *", "Europe/Paris")
    moment = datetime(2026, 7, 1, 8, 59, 59, 999999, tzinfo=ZoneInfo("Europe/Paris"))
    tick = paris.next_after(moment)
    assert tick == utc(2026, 7, 1, 7)  # 09:00 CEST
    assert tick.tzinfo is not None and tick.utcoffset() == timedelta(0)
    assert tick.microsecond == 0


# -- Schedule's arguments --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ({"cron": 5}, TypeError),
        ({"cron": "* * * * *", "catch_up": 0}, ValueError),
        ({"cron": "* * * * *", "catch_up": 1001}, ValueError),
        ({"cron": "* * * * *", "name": "has space"}, ValueError),
        ({"cron": "* * * * *", "payload": {"when": object()}}, TypeError),
        ({"cron": "* * * * *", "payload": None}, TypeError),
    ],
)
def test_schedule_validates_its_arguments(arguments: dict[str, Any], error: type) -> None:
    with pytest.raises(error):
        Schedule(**arguments)
