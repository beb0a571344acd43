"""Enqueue: what is written, the defaults it fills in, and the bad input it refuses."""

import enum
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext, override_settings
from django.utils import timezone

from django_jobq import enqueue, enqueue_many, job
from django_jobq.models import Job
from tests.testapp.jobs import always_fails, record, wait_for_lock

pytestmark = pytest.mark.django_db


def test_handler_enqueue_writes_a_ready_job_with_the_call_as_payload():
    saved = record.enqueue("hello")

    row = Job.objects.get()
    assert saved.pk == row.pk
    assert row.kind == "tests.testapp.jobs.record"
    assert row.payload == {"label": "hello"}
    assert row.status == Job.Status.READY
    assert row.attempts == 0
    assert row.queue == "default"
    assert row.max_attempts == 5  # JOBQ default
    assert row.visibility_timeout == timedelta(seconds=30)
    assert row.run_at <= timezone.now()


def test_the_returned_job_holds_every_column_as_stored():
    """RETURNING * yields the table's column order, not the model's (expires_at was added
    by a later migration): each value must still land in its own field."""
    saved = record.using(expires_at=timezone.now() + timedelta(hours=1)).enqueue("x")
    row = Job.objects.get()
    for field in Job._meta.concrete_fields:
        assert getattr(saved, field.attname) == getattr(row, field.attname), field.name
    assert saved.expires_at is not None and saved.expires_at > saved.created_at


def assert_as_stored(saved):
    row = Job.objects.get(pk=saved.pk)
    for field in Job._meta.concrete_fields:
        assert getattr(saved, field.attname) == getattr(row, field.attname), field.name


@override_settings(USE_TZ=False, TIME_ZONE="America/New_York")
def test_without_time_zones_the_returned_times_are_naive_as_the_orm_reads_them():
    with timezone.override("Asia/Tokyo"):  # an active zone changes nothing without USE_TZ
        saved = record.using(delay=60, expires_at=datetime(2030, 1, 1)).enqueue("x")
    assert_as_stored(saved)
    assert saved.created_at.tzinfo is None
    assert saved.run_at.tzinfo is None
    assert saved.expires_at == datetime(2030, 1, 1)


def test_the_returned_visibility_timeout_is_the_stored_one_to_the_microsecond():
    # Python and PostgreSQL round this many seconds to different microseconds.
    assert_as_stored(record.using(visibility_timeout=22537.4021065).enqueue("x"))


class Urgency(enum.IntEnum):
    HIGH = 10


class Name(str):
    pass


def test_the_returned_values_have_the_types_the_orm_reads():
    saved = record.using(priority=Urgency.HIGH, queue=Name("default")).enqueue("x")
    assert_as_stored(saved)
    for name in ("priority", "queue", "status", "kind"):
        assert type(getattr(saved, name)) is type(getattr(Job.objects.get(), name)), name


def test_a_job_found_by_its_idempotency_key_is_returned_as_stored():
    first = record.using(idempotency_key="k", delay=30).enqueue("a")
    Job.objects.filter(pk=first.pk).update(last_error="from an earlier attempt")
    again, fresh = enqueue_many(
        [record.using(idempotency_key="k").prepare("b"), record.prepare("c")]
    )
    assert again.pk == first.pk
    assert again.last_error == "from an earlier attempt"
    assert_as_stored(again)
    assert_as_stored(fresh)


def test_defaults_come_from_the_job_decorator_then_the_setting():
    assert wait_for_lock.enqueue(lock_id=1, label="x").queue == "slow"
    assert always_fails.enqueue().max_attempts == 2
    with override_settings(JOBQ={"DEFAULT_QUEUE": "bulk", "MAX_ATTEMPTS": 9}):
        plain = record.enqueue("y")
    assert (plain.queue, plain.max_attempts) == ("bulk", 9)


def test_using_overrides_options_for_one_enqueue_only():
    run_at = datetime(2030, 1, 1, tzinfo=UTC)
    saved = record.using(
        priority=5, run_at=run_at, queue="other", max_attempts=3, visibility_timeout=7
    ).enqueue(label="x")
    row = Job.objects.get(pk=saved.pk)
    assert (row.priority, row.run_at, row.queue, row.max_attempts) == (5, run_at, "other", 3)
    assert row.visibility_timeout == timedelta(seconds=7)
    assert record.enqueue("y").priority == 0


def test_delay_is_counted_on_the_database_clock():
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        before = cursor.fetchone()[0]
    saved = record.using(delay=timedelta(minutes=5)).enqueue("later")
    assert before + timedelta(minutes=5) <= saved.run_at <= before + timedelta(minutes=6)
    assert record.using(delay=90).enqueue("seconds").run_at >= before + timedelta(seconds=90)


def test_enqueue_by_kind_name_validates_against_the_registered_handler():
    saved = enqueue("tests.testapp.jobs.record", {"label": "by name"}, priority=3)
    assert (saved.kind, saved.payload, saved.priority) == (
        "tests.testapp.jobs.record",
        {"label": "by name"},
        3,
    )
    with pytest.raises(TypeError, match="missing a required argument: 'label'"):
        enqueue("tests.testapp.jobs.record", {"lable": "typo"})
    assert Job.objects.count() == 1


def test_a_kind_not_registered_here_is_accepted_for_another_worker():
    saved = enqueue("billing.jobs.charge", {"invoice": 7})
    assert Job.objects.get(pk=saved.pk).kind == "billing.jobs.charge"


def test_payload_values_go_through_django_json_encoder():
    saved = enqueue(
        "some.kind", {"when": datetime(2026, 1, 2, 3, 4, tzinfo=UTC), "amount": Decimal("1.50")}
    )
    assert Job.objects.get(pk=saved.pk).payload == {
        "when": "2026-01-02T03:04:00Z",
        "amount": "1.50",
    }


def test_enqueue_many_inserts_every_job_in_one_statement_in_input_order():
    with CaptureQueriesContext(connection) as queries:
        saved = enqueue_many(
            [record.prepare(label=f"n{i}") for i in range(500)]
            + [{"kind": "tests.testapp.jobs.record", "payload": {"label": "dict"}, "priority": 2}]
        )
    assert len(queries.captured_queries) == 1
    assert [job.payload["label"] for job in saved] == [f"n{i}" for i in range(500)] + ["dict"]
    assert Job.objects.count() == 501
    assert saved[-1].priority == 2


def test_enqueue_many_of_nothing_does_nothing():
    with CaptureQueriesContext(connection) as queries:
        assert enqueue_many([]) == []
    assert queries.captured_queries == []


def test_an_idempotency_key_returns_the_live_job_instead_of_a_second_row():
    first = record.using(idempotency_key="welcome-42").enqueue("a")
    again = record.using(idempotency_key="welcome-42").enqueue("b")
    twins = enqueue_many([record.using(idempotency_key="k").prepare("c")] * 2)
    assert again.pk == first.pk
    assert again.payload == {"label": "a"}
    assert twins[0].pk == twins[1].pk
    assert Job.objects.count() == 2
    # Another kind may use the same key.
    assert always_fails.using(idempotency_key="welcome-42").enqueue().pk != first.pk


def test_one_bad_item_in_enqueue_many_writes_none_of_them():
    with pytest.raises(TypeError, match=r"payload\['label'\]"):
        enqueue_many([record.prepare("ok"), record.prepare(label=object())])
    assert not Job.objects.exists()


def test_job_decorator_refuses_invalid_definitions():
    with pytest.raises(ValueError, match="invalid queue"):
        job(name="tests.bad_queue", queue="bad queue")(lambda: None)
    with pytest.raises(ValueError, match="not a module-level function"):
        job(lambda: None)
    with pytest.raises(ValueError, match="max_attempts"):
        job(name="tests.zero", max_attempts=0)(lambda: None)
    with pytest.raises(TypeError, match="cannot be passed by keyword"):

        @job(name="tests.varargs")
        def varargs(*items):
            pass

    with pytest.raises(ValueError, match="already registered"):

        @job(name="tests.testapp.jobs.record")
        def impostor(label):
            pass


def test_calling_the_handler_directly_runs_it_without_a_queue():
    record("direct")
    from tests.testapp.models import Effect

    assert Effect.objects.get().label == "direct"
    assert not Job.objects.exists()
