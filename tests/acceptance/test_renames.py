"""Renames and rolling deploys with real ``manage.py jobq_worker`` processes: jobs stored
under a renamed handler's old kind run on the new handler, and two releases' definitions of
one schedule, live together for over 10 s, enqueue every tick of either exactly once.
"""

import json
import signal
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from django_jobq import enqueue
from django_jobq.models import DeadLetter, Job
from django_jobq.timetables import Timetable
from tests.conftest import wait_until
from tests.testapp.models import Effect

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

WORKER_TIMEOUT = 60  # seconds; a generous bound so a hung worker fails the test
OLD_GREET = "tests.testapp.jobs.renames_old_greet"


def test_jobs_of_a_renamed_kind_run_once_on_the_new_handler(manage):
    # An old release's web processes still write the old kinds (its rows, by SQL); the new
    # release's own enqueue under an alias stores the new kind.
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO jobq_job (queue, kind, payload, max_attempts, visibility_timeout)"
            " SELECT 'renames', kind, jsonb_build_object('label', 'sql' || n), 3, '30 s'"
            " FROM unnest(%s::text[]) AS kind, generate_series(1, 10) AS n",
            [[OLD_GREET, "renames.hello"]],
        )
    for n in range(10):
        assert enqueue(OLD_GREET, {"label": f"new{n}"}).kind == "renames.greet"

    worker = manage("jobq_worker", "--burst", "--queue", "renames", "--concurrency", "2")
    _, stderr = worker.communicate(timeout=WORKER_TIMEOUT)

    assert worker.returncode == 0, stderr
    assert not DeadLetter.objects.exists(), stderr
    assert not Job.objects.exists(), stderr
    labels = Counter(Effect.objects.values_list("label", flat=True))
    expected = (
        [f"sql{n} {OLD_GREET}" for n in range(1, 11)]
        + [f"sql{n} renames.hello" for n in range(1, 11)]
        + [f"new{n} renames.greet" for n in range(10)]
    )
    assert labels == Counter(expected)  # each once, on the one handler


def _start(manage, cron, label):
    """A worker of a release whose ``renames-overlap`` schedule is ``cron`` with payload
    ``{"label": label}``; its ticks' jobs go to a queue no worker serves, to be counted."""
    definition = {"cron": cron, "payload": {"label": label}, "catch_up": 5}
    worker = manage(
        "jobq_worker",
        "--queue",
        "renames",
        JOBQ_TEST_RENAMES_SCHEDULE=json.dumps(definition),
    )
    with connection.cursor() as cursor:

        def registered():
            cursor.execute("SELECT 1 FROM jobq_worker_process WHERE pid = %s", [worker.pid])
            return cursor.fetchone() or worker.poll() is not None

        wait_until(registered, timeout=WORKER_TIMEOUT, what="the worker to register")
    assert worker.poll() is None, worker.communicate()
    return worker


def _stop(worker):
    worker.send_signal(signal.SIGTERM)
    _, stderr = worker.communicate(timeout=WORKER_TIMEOUT)
    assert worker.returncode == 0, stderr


#: How long after the second worker registered the window starts (its first scheduler
#: round runs right after it registers), and how long the window lasts.
SETTLE = timedelta(seconds=2)
WINDOW = timedelta(seconds=12)


@pytest.mark.parametrize(
    ("old_cron", "new_cron", "new_label"),
    [
        pytest.param("* * * * * *", "* * * * * */2", "new", id="coinciding: 1 s and 2 s"),
        pytest.param("* * * * * */4", "* * * * * 2-59/4", "new", id="disjoint: 0,4,8 and 2,6,10"),
        pytest.param("* * * * * *", "* * * * * *", "changed payload", id="a changed payload"),
    ],
)
def test_two_releases_schedules_enqueue_each_tick_of_either_once(
    manage, old_cron, new_cron, new_label
):
    old = _start(manage, old_cron, "old")
    wait_until(
        lambda: Job.objects.filter(payload__label="old").exists(),
        timeout=WORKER_TIMEOUT,
        what="the old release's schedule to fire",
    )
    new = _start(manage, new_cron, new_label)
    start = datetime.now(UTC) + SETTLE
    end = start + WINDOW
    # Ticks are enqueued in order (a schedule's last_tick only moves forward), so once a
    # tick at or after `end` exists, every instant up to `end` has been decided.
    wait_until(
        lambda: Job.objects.filter(queue="renames-ticks", run_at__gte=end).exists(),
        timeout=(end - datetime.now(UTC)).total_seconds() + WORKER_TIMEOUT,
        what="ticks past the window",
    )
    _stop(new)
    _stop(old)

    rows = list(Job.objects.values_list("run_at", "payload__label"))
    assert max(Counter(run_at for run_at, _ in rows).values()) == 1  # no tick enqueued twice
    in_window = sorted((run_at, label) for run_at, label in rows if start < run_at <= end)
    # Expected: every instant in (start, end] of either definition, each once.
    union = sorted(
        set(Timetable(old_cron).between(start, end)) | set(Timetable(new_cron).between(start, end))
    )
    assert [run_at for run_at, _ in in_window] == union
    assert len(union) >= WINDOW.total_seconds() // 2  # ticks kept firing throughout
    new_ticks = set(Timetable(new_cron).between(start, end))
    old_ticks = set(Timetable(old_cron).between(start, end))
    for run_at, label in in_window:
        # Each instant runs with the payload of a definition that has it.
        assert run_at in (old_ticks if label == "old" else new_ticks), (run_at, label)
    if not new_ticks & old_ticks:  # disjoint: each definition fired its own
        assert {label for _, label in in_window} == {"old", new_label}
