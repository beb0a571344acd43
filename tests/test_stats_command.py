"""``manage.py jobq_stats``: the table, the JSON document, and ``--check``'s exit status."""

import json
import re
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.test.utils import override_settings
from django.utils import timezone

from django_jobq import flow_control, stats
from django_jobq.models import Job, OutcomeRollup, WorkerProcess
from tests.factories import DeadLetterFactory, JobFactory, database_now, waiting_job

#: One transaction per test: the database clock stands still, so the rows placed in "the
#: last minute" stay there (see ``database_now``); the subprocess test commits.
pytestmark = pytest.mark.django_db

BUCKETS = 19


def last_minute_rollup(queue, **fields):
    minute = stats.current_minute(database_now()) - timedelta(minutes=1)
    buckets = [0] * BUCKETS
    buckets[4] = fields.pop("runs", 0)  # (0.05 s, 0.1 s]
    OutcomeRollup.objects.create(
        queue=queue, kind="k", minute=minute, duration_buckets=buckets, **fields
    )


def stats_output(*args):
    out = StringIO()
    call_command("jobq_stats", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def busy_queue():
    waiting_job(30, queue="emails")
    waiting_job(5, queue="emails")
    JobFactory(queue="emails", run_at=timezone.now() + timedelta(hours=1))
    JobFactory(queue="emails", status=Job.Status.RUNNING, attempts=1, worker_id="h:7")
    last_minute_rollup("emails", succeeded=40, retried=2, runs=42)
    DeadLetterFactory.create_batch(3, queue="emails", kind="shop.jobs.send_receipt")
    WorkerProcess.objects.create(worker_id="h:7", host="h", pid=7, queues=["emails"], concurrency=4)


def test_the_table_shows_queues_dead_letters_and_workers(busy_queue):
    output = stats_output()
    header, emails = output.splitlines()[:2]
    assert header.split() == [
        "QUEUE", "READY", "SCHEDULED", "RUNNING", "OLDEST", "READY",
        "SUCCEEDED", "1M", "SUCCEEDED", "1H", "FAILED", "1H", "P50", "P99", "PAUSED",
    ]  # fmt: skip
    cells = emails.split()
    assert cells[:4] == ["emails", "2", "1", "1"]
    assert cells[4:6] == ["30.0", "s"]  # the oldest ready job's wait
    assert cells[6:9] == ["40", "40", "2"]  # succeeded last minute, last hour; failed
    assert cells[9:] == ["75", "ms", "100", "ms", "-"]  # p50, p99 of 42 runs in (50, 100] ms
    assert "shop.jobs.send_receipt             3" in output
    assert "h:7" in output and " emails " in output and " ago" in output


def test_json_is_the_same_for_scripts(busy_queue):
    document = json.loads(stats_output("--json"))
    (emails,) = document["queues"]
    assert {key: emails[key] for key in ("queue", "ready", "scheduled", "running")} == {
        "queue": "emails",
        "ready": 2,
        "scheduled": 1,
        "running": 1,
    }
    assert emails["oldest_ready_age"] == pytest.approx(30)
    assert emails["last_minute"] == {"succeeded": 40, "retried": 2, "dead_lettered": 0}
    assert emails["last_hour"] == emails["last_minute"]
    assert emails["duration_p50"] == pytest.approx(0.075)
    assert document["dead_letters"] == [
        {"queue": "emails", "kind": "shop.jobs.send_receipt", "count": 3}
    ]
    (worker,) = document["workers"]
    assert (worker["worker_id"], worker["queues"], worker["stale"]) == ("h:7", ["emails"], False)
    assert document["problems"] == []


def test_check_passes_when_every_number_is_under_its_threshold():
    waiting_job(10, queue="fine")
    assert "fine" in stats_output("--check")


def test_check_fails_on_an_old_ready_job_and_on_dead_letters(busy_queue):
    waiting_job(600, queue="stuck")
    with pytest.raises(CommandError) as failed:
        stats_output("--check")
    assert failed.value.returncode == 2
    message = str(failed.value)
    assert "queue stuck: the oldest ready job has waited 10 min (threshold 5 min)" in message
    assert "3 dead letters (threshold 0)" in message
    assert "emails: the oldest" not in message  # 30 s is fine


def test_a_paused_queue_is_marked_and_its_alert_says_why_it_waits():
    waiting_job(600, queue="stuck")
    flow_control.pause_queue("stuck", until=timedelta(hours=1))
    row = next(line for line in stats_output().splitlines() if line.startswith("stuck"))
    assert row.split()[-2] == "until"
    with pytest.raises(CommandError) as failed:
        stats_output("--check")
    assert re.search(
        r"queue stuck: the oldest ready job has waited 10 min \(threshold 5 min\): the queue "
        r"is paused \(since \S+, until \S+\)",
        str(failed.value),
    )
    document = json.loads(stats_output("--json"))
    (stuck,) = document["queues"]
    assert stuck["paused"] is True and stuck["paused_until"] is not None


def test_an_empty_paused_queue_is_listed():
    flow_control.pause_queue("default")
    assert json.loads(stats_output("--json"))["queues"][0]["queue"] == "default"


def test_thresholds_come_from_options_then_settings(busy_queue):
    stats_output("--check", "--max-oldest-ready-age", "60", "--max-dead-letters", "3")
    with pytest.raises(CommandError, match="oldest ready job has waited"):
        stats_output("--check", "--max-oldest-ready-age", "20", "--max-dead-letters", "3")
    with override_settings(JOBQ={"ALERT_OLDEST_READY_AGE": 60, "ALERT_DEAD_LETTERS": None}):
        stats_output("--check")  # dead letters are not checked at all


def test_check_in_json_lists_the_problems(busy_queue):
    with pytest.raises(CommandError):
        call_command("jobq_stats", "--check", "--json", stdout=(out := StringIO()))
    assert json.loads(out.getvalue())["problems"] == ["3 dead letters (threshold 0)"]


def test_an_empty_queue_database_says_so():
    output = stats_output()
    assert "No queues" in output and "No dead letters." in output
    assert "No workers registered." in output


@pytest.mark.django_db(transaction=True)
def test_the_exit_status_of_a_real_process(manage):
    waiting_job(600, queue="stuck")
    failing = manage("jobq_stats", "--check")
    _, stderr = failing.communicate(timeout=60)
    assert failing.returncode == 2, stderr
    assert "queue stuck: the oldest ready job has waited 10 min" in stderr
    passing = manage("jobq_stats", "--check", "--max-oldest-ready-age", "3600")
    passing.communicate(timeout=60)
    assert passing.returncode == 0
