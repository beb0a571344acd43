"""The operators' flow control API (django_jobq.flow_control): pauses, run-time limits, the
queues it knows, the errors it raises, and the wake-ups it sends."""

import select
from datetime import UTC, datetime, timedelta

import pytest
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from django_jobq import flow_control, sql
from django_jobq.exceptions import UnknownQueue
from django_jobq.models import KindLimit, Queue, WorkerProcess
from tests.factories import JobFactory, database_now

pytestmark = pytest.mark.django_db

QUEUES = {"emails": {"CONCURRENCY_LIMIT": 3, "RATE_LIMIT": "10/s"}}


def state(name):
    control = flow_control.queue_state(name)
    assert control is not None, f"{name} is not a known queue"
    return control


def test_pause_until_resumed_then_resume():
    pause = flow_control.pause_queue("default")
    assert pause.queue == "default" and pause.paused_until is None
    control = state("default")
    assert control.paused and control.paused_at == pause.paused_at
    assert flow_control.resume_queue("default") is True
    assert not state("default").paused
    assert Queue.objects.get(name="default").paused_at is None
    assert flow_control.resume_queue("default") is False  # nothing to resume


@pytest.mark.parametrize(
    "until", [timedelta(minutes=30), 1800, 1800.0], ids=["timedelta", "int", "float"]
)
def test_a_relative_end_is_counted_on_the_database_clock(until):
    before = database_now()
    pause = flow_control.pause_queue("default", until=until)
    assert pause.paused_until is not None
    assert (
        before + timedelta(minutes=30)
        <= pause.paused_until
        <= database_now() + timedelta(minutes=30)
    )


def test_pausing_a_paused_queue_keeps_paused_at_and_replaces_the_end():
    first = flow_control.pause_queue("default", until=60)
    again = flow_control.pause_queue("default")
    assert again.paused_at == first.paused_at and again.paused_until is None
    moment = timezone.now() + timedelta(days=1)
    assert flow_control.pause_queue("default", until=moment).paused_until == moment


def test_a_pause_whose_end_passed_is_over_and_a_new_one_starts_afresh():
    Queue.objects.create(
        name="default",
        paused_at=timezone.now() - timedelta(hours=2),
        paused_until=timezone.now() - timedelta(hours=1),
    )
    control = state("default")
    assert not control.paused and control.paused_at is None
    pause = flow_control.pause_queue("default")
    assert pause.paused_at > timezone.now() - timedelta(minutes=1)
    assert flow_control.resume_queue("default") is True


def test_resume_of_an_ended_pause_says_it_was_not_paused_and_clears_it():
    Queue.objects.create(
        name="default",
        paused_at=timezone.now() - timedelta(hours=2),
        paused_until=timezone.now() - timedelta(hours=1),
    )
    assert flow_control.resume_queue("default") is False
    assert Queue.objects.get(name="default").paused_until is None


def test_pause_many_queues_in_one_call():
    JobFactory(queue="webhooks")
    pauses = flow_control.pause_queues(["webhooks", "default", "webhooks"])
    assert [pause.queue for pause in pauses] == ["default", "webhooks"]
    assert flow_control.resume_queues(["default", "webhooks", "never-paused"]) == [
        "default",
        "webhooks",
    ]


@pytest.mark.parametrize(
    ("until", "error", "message"),
    [
        (timezone.now().replace(tzinfo=None), ValueError, "until must be an aware datetime"),
        (timezone.now() - timedelta(seconds=1), ValueError, "until must be in the future"),
        (0, ValueError, "until: a pause's duration must be more than 0"),
        (-5.0, ValueError, "until: a pause's duration"),
        (float("nan"), ValueError, "until: a pause's duration"),
        (timedelta(days=4000), ValueError, "at most 10 years"),
        (datetime(9999, 12, 31, tzinfo=UTC), ValueError, "until must be before 9999-12-30"),
        ("30m", TypeError, "until must be an aware datetime, a timedelta, seconds"),
        (True, TypeError, "until must be"),
    ],
    ids=["naive", "past", "zero", "negative", "nan", "too-long", "year-9999", "text", "bool"],
)
def test_a_bad_end_is_refused_naming_until(until, error, message):
    with pytest.raises(error, match=message):
        flow_control.pause_queue("default", until=until)
    assert not Queue.objects.exists()


def test_an_unknown_queue_is_refused_with_the_closest_known_one():
    with override_settings(JOBQ={"QUEUES": QUEUES}):
        with pytest.raises(UnknownQueue, match="no queue 'emials' is known; did you mean 'emails'"):
            flow_control.pause_queue("emials")
        with pytest.raises(UnknownQueue) as raised:
            flow_control.set_queue_limits("emials", concurrency_limit=2)
    assert isinstance(raised.value, LookupError) and raised.value.suggestion == "emails"
    assert not Queue.objects.exists()
    flow_control.pause_queue("not-deployed-yet", allow_unknown=True)
    assert state("not-deployed-yet").paused  # known from now on: it has a row


@pytest.mark.parametrize(
    ("call", "error", "field"),
    [
        (lambda: flow_control.pause_queue("bad name"), ValueError, "queue 'bad name'"),
        (
            lambda: flow_control.pause_queue(7),  # type: ignore[arg-type]
            TypeError,
            "queue must be",
        ),
        (lambda: flow_control.pause_queues("default"), TypeError, "queues must be an iterable"),
        (lambda: flow_control.resume_queue(""), ValueError, "queue '' is not a queue name"),
        (
            lambda: flow_control.set_queue_limits("default", concurrency_limit=0),
            ValueError,
            "concurrency_limit must be 1 to",
        ),
        (
            lambda: flow_control.set_queue_limits("default", concurrency_limit="3"),  # type: ignore[arg-type]
            TypeError,
            "concurrency_limit must be an int or None",
        ),
        (
            lambda: flow_control.set_queue_limits("default", concurrency_limit=True),
            TypeError,
            "concurrency_limit",
        ),
        (
            lambda: flow_control.set_queue_limits("default", rate_limit="100/sec"),
            ValueError,
            "rate_limit: a rate limit is written <count>/<window>",
        ),
        (
            lambda: flow_control.set_kind_limits("x", rate_limit=100),  # type: ignore[arg-type]
            TypeError,
            "rate_limit must be a str",
        ),
        (lambda: flow_control.set_kind_limits("1x"), ValueError, "kind '1x' is not a kind name"),
    ],
    ids=[
        "queue-name",
        "queue-type",
        "queues-str",
        "resume-empty",
        "concurrency-zero",
        "concurrency-str",
        "concurrency-bool",
        "rate-grammar",
        "rate-type",
        "kind-name",
    ],
)
def test_bad_input_is_refused_naming_the_field(call, error, field):
    with pytest.raises(error, match=field):
        call()
    assert not Queue.objects.exists() and not KindLimit.objects.exists()


def test_the_known_queues():
    JobFactory(queue="has-ready-jobs")
    JobFactory(queue="scheduled-only", run_at=timezone.now() + timedelta(hours=1))
    WorkerProcess.objects.create(worker_id="w:1", host="w", pid=1, queues=["served"], concurrency=1)
    WorkerProcess.objects.create(
        worker_id="w:2",
        host="w",
        pid=2,
        queues=["served-by-a-stale-worker"],
        concurrency=1,
        last_seen=timezone.now() - timedelta(hours=1),
    )
    WorkerProcess.objects.create(worker_id="w:3", host="w", pid=3, queues=None, concurrency=1)
    Queue.objects.create(name="has-a-row")
    with override_settings(JOBQ={"QUEUES": QUEUES, "DEFAULT_QUEUE": "main"}):
        known = flow_control.known_queues()
    # The settings', the registry's (tests/testapp/jobs.py) and TASKS' queues are there too.
    assert {"main", "emails", "tasks", "has-ready-jobs", "scheduled-only", "served"} <= set(known)
    assert "has-a-row" in known and "served-by-a-stale-worker" not in known
    assert known == sorted(known)


def test_effective_limits_and_where_they_come_from():
    with override_settings(JOBQ={"QUEUES": QUEUES}):
        emails = state("emails")
        assert (emails.concurrency_limit, emails.concurrency_limit_source) == (3, "setting")
        assert (emails.rate_limit, emails.rate_limit_source) == ("10/s", "setting")
        assert (state("default").concurrency_limit, state("default").rate_limit_source) == (
            None,
            None,
        )

        flow_control.set_queue_limits("emails", concurrency_limit=1)
        emails = state("emails")
        assert (emails.concurrency_limit, emails.concurrency_limit_source) == (1, "operator")
        assert (emails.rate_limit, emails.rate_limit_source) == ("10/s", "setting")
        assert (emails.setting_concurrency_limit, emails.operator_concurrency_limit) == (3, 1)

        flow_control.set_queue_limits(
            "emails", concurrency_limit=flow_control.UNCHANGED, rate_limit="5/10s"
        )
        row = Queue.objects.get(name="emails")
        assert (row.concurrency_limit, row.rate_limit) == (1, "5/10s")

        flow_control.set_queue_limits("emails")  # no override: the settings' again
        emails = state("emails")
        assert (emails.concurrency_limit_source, emails.rate_limit_source) == (
            "setting",
            "setting",
        )


def test_kind_limits_list_the_job_decorators_and_the_overrides():
    assert flow_control.kind_limits() == [] or all(
        control.setting_concurrency_limit or control.setting_rate_limit
        for control in flow_control.kind_limits()
    )
    flow_control.set_kind_limits("another.service.kind", concurrency_limit=2)
    flow_control.set_kind_limits("another.service.kind", rate_limit="600/m")  # replaces both
    (control,) = [c for c in flow_control.kind_limits() if c.kind == "another.service.kind"]
    assert (control.concurrency_limit, control.concurrency_limit_source) == (None, None)
    assert (control.rate_limit, control.rate_limit_source) == ("600/m", "operator")
    assert not control.registered


def test_a_kinds_registered_limits_come_from_the_code(monkeypatch):
    from django_jobq import registry

    definition = registry.definitions()[0]
    limited = registry.KindDefinition(
        func=definition.func, kind=definition.kind, concurrency_limit=4, rate_limit="50/s"
    )
    monkeypatch.setattr(registry, "definitions", lambda: [limited])
    monkeypatch.setattr(registry, "get", lambda kind: limited if kind == limited.kind else None)
    (control,) = flow_control.kind_limits()
    assert (control.kind, control.registered) == (definition.kind, True)
    assert (control.concurrency_limit, control.concurrency_limit_source) == (4, "code")
    flow_control.set_kind_limits(definition.kind, concurrency_limit=1, rate_limit=None)
    (control,) = flow_control.kind_limits()
    assert (control.concurrency_limit, control.concurrency_limit_source) == (1, "operator")
    assert (control.rate_limit, control.rate_limit_source) == ("50/s", "code")


# -- wake-ups --------------------------------------------------------------------------------


@pytest.fixture
def listener(connect):
    """A connection listening on the wake channel, as a worker's listener; ``heard()`` returns
    the payloads delivered so far."""
    connection = connect()
    connection.execute(sql.wake.LISTEN_WAKE)

    def heard(timeout=0.5):
        payloads = []
        while select.select([connection.fileno()], [], [], timeout)[0]:
            payloads += [n.payload for n in connection.notifies(timeout=0)]
            timeout = 0.05
        return sorted(payloads)

    return heard


@pytest.mark.django_db(transaction=True)
def test_resume_and_limit_changes_wake_the_queues_workers_at_commit(listener):
    flow_control.pause_queue("default")
    assert listener() == []  # a pause wakes nobody
    with transaction.atomic():
        flow_control.resume_queue("default")
        assert listener(0.1) == []  # not before the commit
    assert listener() == ["default"]
    flow_control.set_queue_limits("default", concurrency_limit=2)
    assert listener() == ["default"]
    with transaction.atomic():
        flow_control.set_queue_limits("default", rate_limit="1/s")
        transaction.set_rollback(True)
    assert listener() == []  # rolled back: no change, no wake-up
    assert Queue.objects.get(name="default").rate_limit is None


@pytest.mark.django_db(transaction=True)
def test_a_kind_limit_wakes_the_queues_holding_its_ready_jobs(listener):
    JobFactory(queue="a", kind="some.kind")
    JobFactory(queue="b", kind="other.kind")
    JobFactory(queue="c", kind="some.kind", run_at=timezone.now() + timedelta(hours=1))
    JobFactory(queue="d", kind="some.kind")
    assert flow_control.set_kind_limits("some.kind", concurrency_limit=5) == ["a", "c", "d"]
    assert listener() == ["a", "c", "d"]
    assert KindLimit.objects.get(kind="some.kind").concurrency_limit == 5
    assert flow_control.set_kind_limits("no.jobs.kind", concurrency_limit=5) == []
    assert KindLimit.objects.filter(kind="no.jobs.kind").exists()
