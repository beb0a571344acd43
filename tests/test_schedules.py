"""Scheduling: delayed jobs wake an idle worker on time; recurring schedules tick by the DST
policy and yield exactly one job per tick however many schedulers run; missed, changed and
removed schedules; declarations, checks and ``jobq_schedules``.

Schedulers run on a simulated clock (``enqueue_due(now=...)``, ``Scheduler(clock=...)``), so
no test waits for a tick, except the two that prove a real worker wakes up for one.
"""

import json
import re
import threading
from collections import Counter
from datetime import UTC, datetime, time, timedelta
from io import StringIO
from types import SimpleNamespace
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connection, connections
from django.test.utils import override_settings
from django.utils import timezone

from django_jobq import Schedule, claims, enqueue, enqueueing, job, registry, sql
from django_jobq.checks import check_schedules, check_settings
from django_jobq.conf import get_settings
from django_jobq.models import Job
from django_jobq.models import Schedule as ScheduleRow
from django_jobq.scheduling import ScheduledJob, collect, enqueue_due
from django_jobq.timetables import Timetable
from django_jobq.worker import Worker
from django_jobq.worker.scheduler import Scheduler
from tests.conftest import REPO_ROOT, wait_until
from tests.dst import DST_DAYS, local, utc, window
from tests.testapp.jobs import record
from tests.testapp.models import Effect

RECORD = "tests.testapp.jobs.record"


def scheduled(cron, zone="UTC", *, name="every", catch_up=1):
    """A schedule of ``record`` whose jobs carry ``label=name``."""
    return ScheduledJob(
        name=name,
        kind=RECORD,
        timetable=Timetable(cron, zone),
        payload={"label": name},
        catch_up=catch_up,
        origin="test",
    )


def enqueued_ticks():
    """``(label, run_at)`` of every job, in run_at order."""
    return list(Job.objects.order_by("run_at", "id").values_list("payload__label", "run_at"))


def noop() -> None:
    """A handler without parameters, for schedules without a payload."""


@pytest.fixture
def temp_registry():
    """Handlers registered during the test are forgotten after it."""
    with registry.isolated():
        yield


# -- the enqueuer: one job per tick ----------------------------------------------------------

needs_db = pytest.mark.django_db(transaction=True)


@needs_db
def test_a_new_schedule_fires_from_its_next_tick():
    every_minute = scheduled("* * * * *")
    first = enqueue_due([every_minute], now=utc(2026, 5, 1, 12, 0, 30))
    assert (first.enqueued, first.next_due) == ([], utc(2026, 5, 1, 12, 1))
    due = enqueue_due([every_minute], now=utc(2026, 5, 1, 12, 1, 0, 500))
    assert [(e.schedule, e.tick, e.job.pk) for e in due.enqueued] == [
        ("every", utc(2026, 5, 1, 12, 1), Job.objects.get().pk)
    ]
    assert due.next_due == utc(2026, 5, 1, 12, 2)
    job = Job.objects.get()
    assert (job.kind, job.payload, job.run_at, job.queue, job.status) == (
        RECORD,
        {"label": "every"},
        utc(2026, 5, 1, 12, 1),
        "default",
        "ready",
    )
    row = ScheduleRow.objects.get()
    assert (row.name, row.kind, row.cron, row.timezone) == ("every", RECORD, "* * * * *", "UTC")
    assert (row.defined_at, row.last_tick) == (utc(2026, 5, 1, 12, 0, 30), utc(2026, 5, 1, 12, 1))
    assert enqueue_due([every_minute], now=utc(2026, 5, 1, 12, 1, 59)).enqueued == []
    assert Job.objects.count() == 1


@needs_db
@pytest.mark.parametrize(
    ("catch_up", "expected_minutes"),
    [(1, [60]), (3, [50, 55, 60]), (100, list(range(5, 65, 5)))],
)
def test_missed_ticks_enqueue_the_latest_catch_up_of_them(catch_up, expected_minutes):
    five = scheduled("*/5 * * * *", catch_up=catch_up)
    enqueue_due([five], now=utc(2026, 5, 1, 12, 0, 1))
    # Every worker was down for an hour: 12 ticks were missed.
    result = enqueue_due([five], now=utc(2026, 5, 1, 13, 2))
    expected = [utc(2026, 5, 1, 12) + timedelta(minutes=m) for m in expected_minutes]
    assert [e.tick for e in result.enqueued] == expected
    assert enqueued_ticks() == [("every", tick) for tick in expected]
    assert ScheduleRow.objects.get().last_tick == utc(2026, 5, 1, 13)
    assert enqueue_due([five], now=utc(2026, 5, 1, 13, 4)).enqueued == []


@needs_db
def test_a_changed_cron_takes_effect_at_its_next_tick():
    at_three = scheduled("0 3 * * *", name="report")
    enqueue_due([at_three], now=utc(2026, 5, 1, 0, 0))
    enqueue_due([at_three], now=utc(2026, 5, 1, 3, 0, 1))
    # Deployed at 02:30 with a new cron: today's 02:00 was before the change, and 03:00 is
    # no longer a tick.
    at_two = scheduled("0 2 * * *", name="report")
    result = enqueue_due([at_two], now=utc(2026, 5, 2, 2, 30))
    assert (result.enqueued, result.next_due) == ([], utc(2026, 5, 3, 2))
    assert enqueue_due([at_two], now=utc(2026, 5, 2, 3, 30)).enqueued == []
    assert [e.tick for e in enqueue_due([at_two], now=utc(2026, 5, 3, 2)).enqueued] == [
        utc(2026, 5, 3, 2)
    ]
    assert enqueued_ticks() == [("report", utc(2026, 5, 1, 3)), ("report", utc(2026, 5, 3, 2))]
    row = ScheduleRow.objects.get()
    assert (row.cron, row.defined_at) == ("0 2 * * *", utc(2026, 5, 2, 2, 30))


@needs_db
def test_a_removed_schedule_stops_firing_and_its_row_is_kept():
    kept, removed = scheduled("* * * * *", name="kept"), scheduled("* * * * *", name="removed")
    enqueue_due([kept, removed], now=utc(2026, 5, 1, 12, 0, 30))
    enqueue_due([kept, removed], now=utc(2026, 5, 1, 12, 1))
    enqueue_due([kept], now=utc(2026, 5, 1, 12, 2))
    enqueue_due([kept], now=utc(2026, 5, 1, 12, 3))
    assert Counter(label for label, _ in enqueued_ticks()) == {"kept": 3, "removed": 1}
    assert ScheduleRow.objects.get(name="removed").last_tick == utc(2026, 5, 1, 12, 1)


@needs_db
@pytest.mark.parametrize(("zone", "cron", "expected"), DST_DAYS)
def test_schedulers_enqueue_one_job_per_local_tick_across_dst(zone, cron, expected):
    start, end = window(zone, expected)
    dst = scheduled(cron, zone, name="dst")
    now = start
    while now <= end:
        enqueue_due([dst], now=now)
        now += timedelta(minutes=15)
    assert local([run_at for _, run_at in enqueued_ticks()], zone) == expected


def test_the_statements_name_the_model_table():
    assert ScheduleRow._meta.db_table == "jobq_schedule"
    for statement in (
        sql.schedules.SELECT_SCHEDULES,
        sql.schedules.SYNC_SCHEDULES,
        sql.schedules.ADVANCE_SCHEDULE,
    ):
        assert re.search(r"\bjobq_schedule\b", statement)


@needs_db
def test_the_job_insert_and_the_row_advance_commit_together(monkeypatch):
    every_minute = scheduled("* * * * *")
    enqueue_due([every_minute], now=utc(2026, 5, 1, 12, 0, 30))

    def fail(jobs):
        raise RuntimeError("the insert failed")

    monkeypatch.setattr(enqueueing, "enqueue_many", fail)
    with pytest.raises(RuntimeError):
        enqueue_due([every_minute], now=utc(2026, 5, 1, 12, 1))
    assert ScheduleRow.objects.get().last_tick is None  # the advance rolled back with it
    monkeypatch.undo()
    assert [e.tick for e in enqueue_due([every_minute], now=utc(2026, 5, 1, 12, 1)).enqueued] == [
        utc(2026, 5, 1, 12, 1)
    ]


@needs_db
def test_a_scheduler_that_loses_the_race_writes_nothing_and_never_waits(connect):
    every_minute = scheduled("* * * * *")
    enqueue_due([every_minute], now=utc(2026, 5, 1, 12, 0, 30))
    # Another scheduler has advanced the row for 12:01 in a transaction not yet committed
    # (say its worker stalled right there).
    other = connect(autocommit=False)
    other.execute(
        "UPDATE jobq_schedule SET last_tick = %s WHERE name = 'every'", [utc(2026, 5, 1, 12, 1)]
    )
    with connection.cursor() as cursor:
        # Waiting for the other's row lock would fail after 100 ms.
        cursor.execute("SET lock_timeout = '100ms'")
        late = enqueue_due([every_minute], now=utc(2026, 5, 1, 12, 1, 5))
        cursor.execute("RESET lock_timeout")
    assert (late.enqueued, late.next_due) == ([], utc(2026, 5, 1, 12, 1, 5))
    assert not Job.objects.exists()
    # Had the other scheduler failed, the tick is still due at the next round.
    other.rollback()
    retried = enqueue_due([every_minute], now=utc(2026, 5, 1, 12, 1, 6))
    assert [done.tick for done in retried.enqueued] == [utc(2026, 5, 1, 12, 1)]


def run_schedulers(count, schedules_, times, *, lock_step):
    """``count`` threads, each with its own connection, call ``enqueue_due`` at each of
    ``times``; in lock step all of them at the same moment, else each at its own pace."""
    step = threading.Barrier(count)
    errors = []

    def scheduler():
        try:
            for now in times:
                if lock_step:
                    step.wait(timeout=60)
                enqueue_due(schedules_, now=now)
        except BaseException as exc:
            errors.append(exc)
            step.abort()
        finally:
            connections.close_all()

    threads = [threading.Thread(target=scheduler) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors


@needs_db
@pytest.mark.parametrize("lock_step", [True, False], ids=["lock step", "each at its own pace"])
def test_five_schedulers_enqueue_exactly_one_job_per_tick(lock_step):
    # At its own pace a scheduler may run ahead of the others by several ticks; catch_up
    # lets the one that finds several due enqueue them all, so every tick is expected.
    catch_up = 1 if lock_step else 1000
    minutely = scheduled("* * * * *", name="minutely", catch_up=catch_up)
    paris = scheduled("*/7 * * * *", "Europe/Paris", name="paris", catch_up=catch_up)
    start = utc(2026, 5, 1, 12, 0, 30)
    times = [start + timedelta(minutes=n) for n in range(121)]
    run_schedulers(5, [minutely, paris], times, lock_step=lock_step)
    ticks = enqueued_ticks()
    assert max(Counter(ticks).values()) == 1
    minutes = [utc(2026, 5, 1, 12) + timedelta(minutes=m) for m in range(1, 121)]
    assert [run_at for label, run_at in ticks if label == "minutely"] == minutes
    assert [run_at for label, run_at in ticks if label == "paris"] == [
        minute for minute in minutes if minute.minute % 7 == 0
    ]


@needs_db
def test_over_a_hundred_schedules_each_fire_once_per_tick():
    periods = {f"s{n:03}": 1 + n % 6 for n in range(120)}  # every 1 to 6 minutes
    many = [scheduled(f"*/{period} * * * *", name=name) for name, period in periods.items()]
    start = utc(2026, 5, 1, 12, 0, 30)
    run_schedulers(3, many, [start + timedelta(minutes=n) for n in range(13)], lock_step=True)
    ticks = enqueued_ticks()
    assert max(Counter(ticks).values()) == 1
    by_schedule = Counter(label for label, _ in ticks)
    assert by_schedule == {name: 12 // period for name, period in periods.items()}
    for label, run_at in ticks:
        assert run_at.minute % periods[label] == 0


# -- the worker's scheduler and wake-ups -----------------------------------------------------


class Clock:
    def __init__(self, now):
        self.now = now

    def __call__(self):
        return self.now


@needs_db
def test_the_scheduler_does_nothing_until_its_next_tick(django_assert_num_queries):
    clock = Clock(utc(2026, 5, 1, 12, 0, 30))
    scheduler = Scheduler([scheduled("*/5 * * * *")], clock=clock)
    assert scheduler.next_due == clock.now
    assert scheduler.run_if_due() == []  # first round: the row is created
    assert scheduler.next_due == utc(2026, 5, 1, 12, 5)
    clock.now = utc(2026, 5, 1, 12, 4, 59)
    with django_assert_num_queries(0):
        assert scheduler.run_if_due() == []
    clock.now = utc(2026, 5, 1, 12, 5)
    assert [e.tick for e in scheduler.run_if_due()] == [utc(2026, 5, 1, 12, 5)]
    assert scheduler.next_due == utc(2026, 5, 1, 12, 10)


def test_without_schedules_the_scheduler_never_runs():
    scheduler = Scheduler([])
    assert (scheduler.next_due, scheduler.run_if_due()) == (None, [])


def run_worker_until(worker, predicate, what):
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        return wait_until(predicate, timeout=10, what=what)
    finally:
        worker.stop()
        thread.join(30)


@needs_db
def test_an_idle_worker_wakes_for_a_delayed_job_before_its_poll_interval():
    delayed = record.using(delay=1).enqueue("delayed")
    worker = Worker(poll_interval=30)
    run_worker_until(worker, Effect.objects.exists, "the delayed job to run")
    assert Effect.objects.get().created_at >= delayed.run_at  # not before it was due


@needs_db
def test_an_idle_worker_wakes_at_another_workers_lease_deadline(queue_cursor):
    record.using(visibility_timeout=1).enqueue("orphaned")
    assert len(claims.claim(queue_cursor, worker_id="crashed", limit=1)) == 1
    worker = Worker(poll_interval=30)
    run_worker_until(worker, Effect.objects.exists, "the orphaned job to be reclaimed")
    assert Effect.objects.get().label == "orphaned"


@needs_db
def test_an_idle_worker_wakes_for_a_schedule_tick(temp_registry):
    job(name="tests.every_second", schedule=Schedule("* * * * * *", payload={"label": "tick"}))(
        record.func
    )
    worker = Worker(poll_interval=30)
    run_worker_until(worker, Effect.objects.exists, "a tick's job to run")
    assert Effect.objects.filter(label="tick").exists()
    assert ScheduleRow.objects.get().name == "tests.every_second"


@needs_db
@pytest.mark.parametrize(("flag", "rows"), [([], 1), (["--no-scheduler"], 0)])
def test_jobq_worker_runs_the_scheduler_unless_told_not_to(temp_registry, flag, rows):
    job(name="tests.hourly", schedule="0 * * * *")(noop)
    call_command("jobq_worker", "--burst", *flag, verbosity=0)
    assert ScheduleRow.objects.count() == rows


@pytest.mark.parametrize(
    ("statement", "params", "index"),
    [
        (sql.claims.SECONDS_UNTIL_DUE_ONE_QUEUE, {"queue": "rare"}, "jobq_job_claim_idx"),
        (sql.claims.SECONDS_UNTIL_DUE_ANY_QUEUE, {}, "jobq_job_claim_all_idx"),
        # Several queues: either claim index, whichever the planner finds cheaper.
        (sql.claims.SECONDS_UNTIL_DUE_QUEUES, {"queues": ["rare", "other"]}, "jobq_job_claim"),
    ],
)
@needs_db
def test_the_wake_up_query_seeks_the_partial_indexes(connect, statement, params, index):
    # 40,000 jobs, ready and running, most of them scheduled for later.
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO jobq_job (queue, kind, payload, priority, run_at, max_attempts, "
            "visibility_timeout, status, lease_deadline, worker_id) "
            "SELECT CASE WHEN n <= 40 THEN 'rare' ELSE 'busy' END, 'k', '{}', n % 3, "
            "now() + n * interval '1 s', 5, interval '30 s', "
            "CASE WHEN n % 2 = 0 THEN 'ready' ELSE 'running' END, "
            "CASE WHEN n % 2 = 0 THEN NULL ELSE now() + interval '30 s' END, 'w' "
            "FROM generate_series(1, 40000) AS n"
        )
        cursor.execute("ANALYZE jobq_job")
    conn = connect()
    plan = "\n".join(
        row[0]
        for row in conn.execute(
            "EXPLAIN " + statement, {"held": [], "horizon": 5, **params}
        ).fetchall()
    )
    assert f"using {index}" in plan, plan
    assert "jobq_job_lease_idx" in plan, plan
    assert "Seq Scan" not in plan, plan
    (seconds,) = conn.execute(statement, {"held": [], "horizon": 5, **params}).fetchone()
    assert 0 < seconds <= 2  # the earliest: the first ready job, due in about 2 s


@needs_db
def test_the_wake_up_query_reads_only_the_leases_that_lapse_within_the_horizon(connect):
    """20,000 jobs of another queue are running; none of their leases lapses within the
    horizon, so the search for this queue's next deadline stops before reaching them."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO jobq_job (queue, kind, payload, run_at, max_attempts, "
            "visibility_timeout, status, lease_deadline, worker_id) "
            "SELECT 'busy', 'k', '{}', now(), 5, interval '30 s', 'running', "
            "now() + interval '10 s' + n * interval '1 ms', 'w' "
            "FROM generate_series(1, 20000) AS n"
        )
        cursor.execute("ANALYZE jobq_job")
    conn = connect()
    params = {"held": [], "queue": "rare", "horizon": 5}
    ((plan,),) = conn.execute(
        "EXPLAIN (ANALYZE, FORMAT JSON) " + sql.claims.SECONDS_UNTIL_DUE_ONE_QUEUE, params
    ).fetchall()

    def lease_scans(node):
        if node.get("Index Name") == "jobq_job_lease_idx":
            yield node
        for child in node.get("Plans", []):
            yield from lease_scans(child)

    (scan,) = lease_scans(plan[0]["Plan"])
    assert scan["Actual Rows"] + scan.get("Rows Removed by Filter", 0) == 0, scan


# -- declarations, checks, the command -------------------------------------------------------


def test_job_declares_schedules(temp_registry):
    nightly = job(
        name="tests.nightly",
        schedule=[
            Schedule("30 2 * * *", name="nightly-eu", payload={"label": "eu"}),
            Schedule("0 6 * * *", "America/New_York", {"label": "us"}, "nightly-us", 3),
        ],
        timezone="Europe/Paris",
    )(record.func)
    assert nightly.schedules == (
        Schedule("30 2 * * *", "Europe/Paris", {"label": "eu"}, "nightly-eu"),
        Schedule("0 6 * * *", "America/New_York", {"label": "us"}, "nightly-us", 3),
    )
    five = job(name="tests.five", schedule="*/5 * * * *")(noop)
    assert five.schedules == (Schedule("*/5 * * * *"),)
    by_name = {s.name: s for s in collect()}
    assert set(by_name) == {"nightly-eu", "nightly-us", "tests.five"}
    assert (by_name["nightly-eu"].timetable.timezone, by_name["nightly-eu"].payload) == (
        "Europe/Paris",
        {"label": "eu"},
    )
    assert (by_name["tests.five"].kind, by_name["tests.five"].timetable.timezone) == (
        "tests.five",
        "UTC",
    )


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"schedule": 5}, TypeError),
        ({"schedule": ["* * * * *", None]}, TypeError),
        ({"timezone": "UTC"}, TypeError),
        ({"schedule": "* * * * *", "timezone": 1}, TypeError),
    ],
)
def test_job_refuses_misdeclared_schedules(temp_registry, options, error):
    with pytest.raises(error):
        job(name="tests.bad", **options)(record.func)


def schedule_check_ids():
    return [message.id for message in check_settings() + check_schedules()]


@pytest.mark.parametrize(
    ("jobq_schedules", "expected"),
    [
        ({"x": {"kind": RECORD, "cron": "0 4 * * *", "payload": {"label": "x"}}}, []),
        ([], ["django_jobq.E006"]),
        ({"x": "0 4 * * *"}, ["django_jobq.E006"]),
        ({"x": {"kind": RECORD}}, ["django_jobq.E006"]),
        ({"x": {"kind": RECORD, "cron": "* * * * *", "every": 5}}, ["django_jobq.E006"]),
        ({"x": {"kind": RECORD, "cron": "* * * * *", "catch_up": 0}}, ["django_jobq.E006"]),
        ({"x": {"kind": 5, "cron": "* * * * *"}}, ["django_jobq.E006"]),
        ({"bad name": {"kind": RECORD, "cron": "* * * * *"}}, ["django_jobq.E006"]),
        ({"x": {"kind": RECORD, "cron": "* * * * *", "payload": {"a": 1}}}, ["django_jobq.E006"]),
        ({"x": {"kind": RECORD, "cron": "61 * * * *"}}, ["django_jobq.E007"]),
        ({"x": {"kind": RECORD, "cron": "* * * * *", "timezone": "Mars"}}, ["django_jobq.E008"]),
        ({"x": {"kind": "elsewhere.jobs.x", "cron": "* * * * *"}}, ["django_jobq.W001"]),
        ({"tests.five": {"kind": "elsewhere.x", "cron": "* * * * *"}}, ["django_jobq.W001",
                                                                         "django_jobq.E009"]),
    ],
)  # fmt: skip
def test_invalid_schedules_have_a_check_id(temp_registry, jobq_schedules, expected):
    job(name="tests.five", schedule="*/5 * * * *")(noop)
    with override_settings(JOBQ={"SCHEDULES": jobq_schedules}):
        assert schedule_check_ids() == expected


def test_a_malformed_schedules_setting_stops_every_use_of_the_settings():
    with (
        override_settings(JOBQ={"SCHEDULES": {"x": {"cron": "* * * * *"}}}),
        pytest.raises(ImproperlyConfigured, match=r"lacks the required key 'kind'"),
    ):
        get_settings()


def test_code_schedules_are_checked_too(temp_registry):
    job(name="tests.bad_cron", schedule="0 25 * * *")(noop)
    job(name="tests.bad_zone", schedule="0 2 * * *", timezone="Europe/Pariss")(noop)
    job(name="tests.bad_payload", schedule=Schedule("0 2 * * *", payload={"x": 1}))(record.func)
    twins = [Schedule(cron, payload={"label": "twin"}) for cron in ("0 2 * * *", "0 3 * * *")]
    job(name="tests.twins", schedule=twins)(record.func)
    assert schedule_check_ids() == [
        "django_jobq.E007",
        "django_jobq.E008",
        "django_jobq.E006",
        "django_jobq.E009",
    ]
    with pytest.raises(ImproperlyConfigured, match=r"django_jobq\.E007"):
        Worker()
    Worker(scheduler=False)  # a worker without a scheduler does not read schedules


# Django 6.1's model checks query every database alias, "other" (SQLite) included.
@pytest.mark.django_db(databases=["default", "other"])
def test_manage_py_check_fails_on_an_invalid_schedule(temp_registry):
    job(name="tests.bad_cron", schedule=Schedule("every day", payload={"label": "x"}))(record.func)
    with pytest.raises(SystemCheckError, match=r"django_jobq\.E007"):
        call_command("check")


def run_command(*args):
    out = StringIO()
    call_command("jobq_schedules", *args, stdout=out)
    return out.getvalue()


def next_local(zone, at):
    """The next ``at`` (a time of day) in ``zone`` after now, computed without django-jobq."""
    now = timezone.now().astimezone(ZoneInfo(zone))
    today = datetime.combine(now.date(), at, ZoneInfo(zone))
    return today if today > now else datetime.combine(now.date() + timedelta(1), at, ZoneInfo(zone))


@needs_db
def test_jobq_schedules_lists_next_ticks_and_last_ticks(temp_registry):
    job(name="tests.morning", schedule="0 9 * * *", timezone="Asia/Tokyo")(noop)
    last = utc(2026, 5, 1, 0, 0)
    ScheduleRow.objects.create(
        name="tests.morning", kind="tests.morning", cron="0 9 * * *", timezone="Asia/Tokyo",
        defined_at=last - timedelta(days=30), last_tick=last,
    )  # fmt: skip
    ScheduleRow.objects.create(
        name="retired", kind=RECORD, cron="0 4 * * *", timezone="UTC", defined_at=last
    )
    with override_settings(
        JOBQ={
            "SCHEDULES": {
                "cleanup": {"kind": RECORD, "cron": "30 4 * * *", "payload": {"label": "c"}}
            }
        }
    ):
        listed = json.loads(run_command("--json"))
        table = run_command()
    morning = next_local("Asia/Tokyo", time(9))
    cleanup = next_local("UTC", time(4, 30))
    assert listed == [
        {
            "name": "tests.morning",
            "kind": "tests.morning",
            "cron": "0 9 * * *",
            "timezone": "Asia/Tokyo",
            "declared": True,
            "next": morning.isoformat(),
            "next_utc": morning.astimezone(UTC).isoformat(),
            "last_tick": "2026-05-01T00:00:00+00:00",
        },
        {
            "name": "cleanup",
            "kind": RECORD,
            "cron": "30 4 * * *",
            "timezone": "UTC",
            "declared": True,
            "next": cleanup.isoformat(),
            "next_utc": cleanup.isoformat(),
            "last_tick": None,
        },
        {
            "name": "retired",
            "kind": RECORD,
            "cron": "0 4 * * *",
            "timezone": "UTC",
            "declared": False,
            "next": None,
            "next_utc": None,
            "last_tick": None,
        },
    ]
    lines = table.splitlines()
    assert lines[0].split() == [
        *("NAME", "KIND", "CRON", "TIMEZONE", "NEXT", "(LOCAL)"),
        *("NEXT", "(UTC)", "LAST", "TICK", "(UTC)"),
    ]
    assert lines[1].split()[-3:] == [
        morning.isoformat(),
        morning.astimezone(UTC).isoformat(),
        "2026-05-01T00:00:00+00:00",
    ]
    assert lines[3].split()[-3:] == ["declared", "-", "never"]


@needs_db
def test_jobq_schedules_without_schedules():
    assert run_command() == "No schedules.\n"


# -- the examples in docs/scheduling.md ------------------------------------------------------

DOC = (REPO_ROOT / "docs" / "scheduling.md").read_text()
PYTHON_BLOCKS = re.findall(r"```python\n(.*?)```", DOC, re.DOTALL)


def send_reminder(order_id: int) -> None: ...


def purge_sessions() -> None: ...


def sync_catalogue(region: str) -> None: ...


def nightly_report() -> None: ...


@needs_db
def test_the_documented_delays_enqueue_delayed_jobs(temp_registry):
    job(name="shop.jobs.send_reminder")(send_reminder)
    ends_at = timezone.now() + timedelta(days=3)
    namespace = {
        "send_reminder": registry.get("shop.jobs.send_reminder"),
        "enqueue": enqueue,
        "order": SimpleNamespace(pk=12),
        "auction": SimpleNamespace(ends_at=ends_at),
    }
    before = timezone.now()
    exec(PYTHON_BLOCKS[0], namespace)  # noqa: S102 (the docs' own example)
    reminder, auction = Job.objects.order_by("id")
    assert reminder.payload == {"order_id": 12}
    assert before + timedelta(hours=24) <= reminder.run_at <= timezone.now() + timedelta(hours=24)
    assert (auction.kind, auction.payload, auction.run_at) == (
        "shop.jobs.close_auction",
        {"auction_id": 7},
        ends_at,
    )


def test_the_documented_schedules_are_valid(temp_registry):
    exec(PYTHON_BLOCKS[1], {"__name__": "shop.jobs"})  # noqa: S102 (the docs' own example)
    by_name = {schedule.name: schedule for schedule in collect()}
    assert {name: (s.timetable.cron, s.timetable.timezone) for name, s in by_name.items()} == {
        "shop.jobs.refresh_exchange_rates": ("*/5 * * * *", "UTC"),
        "shop.jobs.nightly_report": ("30 2 * * *", "Europe/Paris"),
        "digest-eu": ("0 7 * * 1-5", "Europe/Paris"),
        "digest-us": ("0 7 * * 1-5", "America/New_York"),
    }
    assert by_name["digest-us"].payload == {"region": "us"}
    settings_block: dict[str, Any] = {}
    exec(PYTHON_BLOCKS[2], settings_block)  # noqa: S102 (the docs' own example)
    job(name="shop.jobs.purge_sessions")(purge_sessions)
    job(name="shop.jobs.sync_catalogue")(sync_catalogue)
    with override_settings(JOBQ=settings_block["JOBQ"]):
        assert schedule_check_ids() == []
        assert {s.name: s.catch_up for s in collect()}.items() >= {
            "purge-sessions": 1,
            "sync-eu": 4,
        }.items()


@needs_db
def test_the_documented_listing_is_what_jobq_schedules_prints(temp_registry, monkeypatch):
    job(name="shop.jobs.nightly_report", schedule=Schedule(
        "30 2 * * *", timezone="Europe/Paris", name="nightly-report"
    ))(nightly_report)  # fmt: skip
    job(name="shop.jobs.purge_sessions")(purge_sessions)
    ScheduleRow.objects.create(
        name="nightly-report", kind="shop.jobs.nightly_report", cron="30 2 * * *",
        timezone="Europe/Paris", defined_at=utc(2026, 11, 1), last_tick=utc(2026, 11, 29, 1, 30),
    )  # fmt: skip
    ScheduleRow.objects.create(
        name="old-export", kind="shop.jobs.export", cron="0 5 * * *", timezone="UTC",
        defined_at=utc(2026, 9, 1), last_tick=utc(2026, 10, 2, 5),
    )  # fmt: skip
    monkeypatch.setattr(timezone, "now", lambda: utc(2026, 11, 29, 15, 23))
    purge = {"kind": "shop.jobs.purge_sessions", "cron": "0 4 * * *"}
    with override_settings(JOBQ={"SCHEDULES": {"purge-sessions": purge}}):
        output = run_command()
    documented = DOC.split("$ python manage.py jobq_schedules\n", 1)[1].split("```", 1)[0]
    assert output == documented
