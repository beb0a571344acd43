"""``manage.py jobq_queues``: the table, pause/resume, limits, and clear errors."""

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings
from django.utils import timezone

from django_jobq.models import KindLimit, Queue
from tests.factories import JobFactory, waiting_job

pytestmark = pytest.mark.django_db

QUEUES = {"emails": {"CONCURRENCY_LIMIT": 3, "RATE_LIMIT": "10/s"}}


def queues(*args):
    out, err = StringIO(), StringIO()
    call_command("jobq_queues", *args, stdout=out, stderr=err)
    return out.getvalue() + err.getvalue()


def row_of(output, queue):
    (line,) = [line for line in output.splitlines() if line.split()[:1] == [queue]]
    return line


@override_settings(JOBQ={"QUEUES": QUEUES})
def test_the_table_lists_known_queues_with_pauses_limits_and_jobs():
    waiting_job(5, queue="emails")
    waiting_job(5, queue="emails")
    Queue.objects.create(
        name="emails", paused_at=timezone.now(), concurrency_limit=1, rate_limit=None
    )
    output = queues()
    assert output.splitlines()[0].split() == [
        "QUEUE", "PAUSED", "CONCURRENCY", "LIMIT", "RATE", "LIMIT", "READY", "RUNNING",
    ]  # fmt: skip
    assert row_of(output, "emails").split() == [
        "emails", "yes", "1", "(operator)", "10/s", "(setting)", "2", "0",
    ]  # fmt: skip
    assert row_of(output, "default").split() == ["default", "-", "-", "-", "0", "0"]
    assert queues("list") == output


def test_pause_for_a_duration_then_resume():
    output = queues("pause", "default", "--for", "600")
    assert "Queue default paused (since " in output and "), until 20" in output
    control = Queue.objects.get(name="default")
    assert control.paused_at is not None and control.paused_until is not None
    assert control.paused_until - control.paused_at == timedelta(minutes=10)  # one now()
    assert "until " in row_of(queues(), "default")
    assert queues("resume", "default") == "Queue default resumed: workers claim its jobs again.\n"
    assert queues("resume", "default") == "Queue default was not paused: nothing changed.\n"


def test_pause_until_a_time_without_an_offset_is_in_the_current_time_zone():
    moment = (timezone.localtime() + timedelta(days=1)).replace(microsecond=0)
    queues("pause", "default", "--until", moment.replace(tzinfo=None).isoformat())
    assert Queue.objects.get(name="default").paused_until == moment


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("pause", "defualt"), "no queue 'defualt' is known; did you mean 'default'?"),
        (("resume", "defualt"), "No queue 'defualt' is known, and none is paused; did you mean"),
        (("pause", "default", "--until", "tomorrow"), "expected an ISO 8601 date and time"),
        (("pause", "default", "--until", "2020-01-01T00:00Z"), "until must be in the future"),
        (("pause", "default", "--for", "0"), "expected seconds, more than 0"),
        (("pause", "default", "--for", "5", "--until", "2099-01-01"), "not allowed with"),
        (("pause", "bad name", "--allow-unknown"), "queue 'bad name' is not a queue name"),
        (("limit", "default"), "Nothing to change: pass --concurrency and/or --rate."),
        (("limit", "default", "--concurrency", "0"), "expected a whole number from 1 to"),
        (("limit", "default", "--rate", "100/sec"), "a rate limit is written <count>/<window>"),
        (("limit", "defualt", "--rate", "1/s"), "did you mean 'default'?"),
        (("limit-kind", "1x", "--rate", "1/s"), "kind '1x' is not a kind name"),
    ],
)
def test_mistakes_are_clear_errors(args, message):
    with pytest.raises(CommandError, match=message.replace("(", r"\(").replace("?", r"\?")):
        queues(*args)
    assert not Queue.objects.exists() and not KindLimit.objects.exists()


@override_settings(JOBQ={"QUEUES": QUEUES})
def test_limits_change_one_keep_the_other_and_none_removes_an_override():
    assert queues("limit", "emails", "--concurrency", "5") == (
        "Queue emails: concurrency limit 5 (operator), rate limit 10/s (setting).\n"
    )
    assert queues("limit", "emails", "--rate", "2/m") == (
        "Queue emails: concurrency limit 5 (operator), rate limit 2/m (operator).\n"
    )
    assert queues("limit", "emails", "--concurrency", "none", "--rate", "NONE") == (
        "Queue emails: concurrency limit 3 (setting), rate limit 10/s (setting).\n"
    )


def test_a_kind_limit_names_the_queues_woken_and_warns_of_an_unregistered_kind():
    JobFactory(queue="theirs", kind="another.service.kind")
    output = queues("limit-kind", "another.service.kind", "--concurrency", "2")
    assert "Kind another.service.kind: concurrency limit 2 (operator), rate limit -." in output
    assert "Workers of theirs woken." in output
    assert "warning: no @job in this process registers the kind" in output
    (row,) = [line for line in queues().splitlines() if line.startswith("another.service.kind ")]
    assert row.split()[1:3] == ["2", "(operator)"]
    document = json.loads(queues("--json"))
    theirs = [kind for kind in document["kinds"] if kind["kind"] == "another.service.kind"]
    assert theirs == [
        {
            "kind": "another.service.kind",
            "concurrency_limit": 2,
            "concurrency_limit_source": "operator",
            "rate_limit": None,
            "rate_limit_source": None,
        }
    ]


def test_json_for_scripts():
    queues("pause", "default", "--for", "60")
    document = json.loads(queues("list", "--json"))
    (default,) = [queue for queue in document["queues"] if queue["queue"] == "default"]
    assert default["paused"] is True and default["paused_until"] is not None
    assert (default["concurrency_limit"], default["concurrency_limit_source"]) == (None, None)
    assert (default["ready"], default["running"]) == (0, 0)
