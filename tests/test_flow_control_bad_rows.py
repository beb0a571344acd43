"""Rows of the flow-control tables written by hand (docs/flow-control.md, "Rows written by
hand"): the CHECK constraints refuse what the readers cannot use, and a row that got in all
the same (the constraints dropped, then added back ``NOT VALID``) never crashes or stalls a
worker, ``jobq_stats``, ``jobq_queues``, the dashboard, the metrics or the admin: each reads
it as a pause or a limit it can apply, or ignores the value with a warning."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import IntegrityError, connection, transaction
from django.db.backends.utils import CursorWrapper
from django.urls import reverse
from prometheus_client.parser import text_string_to_metric_families

from django_jobq import flow_control
from django_jobq.models import Job, LimitStart, LimitState
from django_jobq.worker import Worker
from tests.conftest import wait_until
from tests.testapp.jobs import flow_step, limited_step, record
from tests.testapp.models import Effect, Run

pytestmark = pytest.mark.django_db(transaction=True)

# name: (columns of queue "flow"'s row, SQL expressions; whether workers see it paused)
REFUSED_QUEUE_ROWS = {
    "paused until infinity": ({"paused_at": "now()", "paused_until": "'infinity'"}, True),
    "paused until -infinity": ({"paused_at": "now()", "paused_until": "'-infinity'"}, False),
    "paused at infinity": ({"paused_at": "'infinity'"}, True),
    "paused at -infinity": ({"paused_at": "'-infinity'"}, True),
    "paused until, not paused": ({"paused_until": "now() + interval '1 hour'"}, False),
    "paused until infinity, not paused": ({"paused_until": "'infinity'"}, False),
    "paused until year 20000": ({"paused_at": "now()", "paused_until": "'20000-01-01'"}, True),
    "paused at 4000 BC": ({"paused_at": "'4000-01-01 BC'"}, True),
    "rate limit not in the grammar": ({"rate_limit": "'lots'"}, False),
    "rate limit of none": ({"rate_limit": "'0/s'"}, False),
    "concurrency limit 0": ({"concurrency_limit": "0"}, False),
    "negative concurrency limit": ({"concurrency_limit": "-5"}, False),
}
# A column no constraint checks, and no reader needs.
ODD_QUEUE_ROWS = {
    "updated at infinity": ({"updated_at": "'infinity'"}, False),
}

# name: columns of kind limited_step's row (its @job allows 2 at once)
REFUSED_KIND_ROWS = {
    "rate limit not in the grammar": {"rate_limit": "'lots'"},
    "concurrency limit 0": {"concurrency_limit": "0"},
}
ODD_KIND_ROWS = {"updated at infinity": {"updated_at": "'infinity'"}}


@pytest.fixture(autouse=True)
def uncached_metrics(settings):
    """The metrics view reads the database at every request (its reads are otherwise cached
    per process, across tests)."""
    settings.JOBQ = {**settings.JOBQ, "METRICS_CACHE_TIMEOUT": 0}


@contextmanager
def checks_dropped(table: str) -> Iterator[CursorWrapper]:
    """A cursor in a transaction where every CHECK constraint of ``table`` is dropped; they
    are added back ``NOT VALID`` at its end, so what it wrote got past them (as by an
    operator who dropped them for a fix by hand)."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conrelid = %s::regclass AND contype = 'c'",
            [table],
        )
        definitions = cursor.fetchall()
        for name, _ in definitions:
            cursor.execute(f"ALTER TABLE {table} DROP CONSTRAINT {name}")
        yield cursor
        for name, definition in definitions:
            definition = definition.removesuffix(" NOT VALID")
            cursor.execute(f"ALTER TABLE {table} ADD CONSTRAINT {name} {definition} NOT VALID")


def write_row(table: str, key: str, name: str, columns: dict[str, str]) -> None:
    """Insert the row ``key = name`` of ``table`` with ``columns`` (the test's own SQL
    expressions), past the table's constraints."""
    with checks_dropped(table) as cursor:
        cursor.execute(
            f"INSERT INTO {table} ({key}, {', '.join(columns)}) "  # noqa: S608
            f"VALUES (%s, {', '.join(columns.values())})",
            [name],
        )


def run_burst() -> None:
    """Run a burst worker to its end; fail if it does not end within 60 s."""
    worker = Worker(burst=True, poll_interval=0.05, concurrency=2)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            worker.run()
        except BaseException as exc:
            errors.append(exc)
        finally:
            from django.db import connections

            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=60)
    if thread.is_alive():
        worker.stop()
        thread.join(timeout=30)
        pytest.fail("the burst worker did not finish")
    if errors:
        raise errors[0]


def execute(statement: str, params: list[Any] | None = None) -> None:
    """Run ``statement`` in a savepoint of its own (a refused one leaves the test's
    transaction usable)."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(statement, params)


def renders(client: Any, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, response.content[:2000]
    content: str = response.content.decode()
    return content


def metric_samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The samples of a metrics page as Prometheus parses it, by name and sorted labels."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def operator_readers_render(admin_client, queue: str) -> dict[str, Any]:
    """Every operators' view of flow control, read once; returns their outputs by name (the
    metrics as :func:`metric_samples`)."""
    out = StringIO()
    call_command("jobq_stats", stdout=out)
    stats_json = StringIO()
    call_command("jobq_stats", "--json", stdout=stats_json)
    json.loads(stats_json.getvalue())
    queues = StringIO()
    call_command("jobq_queues", stdout=queues)
    queues_json = StringIO()
    call_command("jobq_queues", "--json", stdout=queues_json)
    json.loads(queues_json.getvalue())
    return {
        "jobq_stats": out.getvalue(),
        "jobq_queues": queues.getvalue(),
        "queues page": renders(admin_client, reverse("admin:django_jobq_queue_changelist")),
        "queue page": renders(
            admin_client, reverse("admin:django_jobq_queue_change", args=[queue])
        ),
        "kinds page": renders(admin_client, reverse("admin:django_jobq_kindlimit_changelist")),
        "dashboard": renders(admin_client, reverse("admin:django_jobq_dashboard")),
        "metrics": metric_samples(renders(admin_client, reverse("jobq:metrics"))),
    }


# -- the constraints -------------------------------------------------------------------------


@pytest.mark.parametrize("case", list(REFUSED_QUEUE_ROWS))
def test_postgresql_refuses_a_queue_row_no_reader_could_use(case):
    columns, _ = REFUSED_QUEUE_ROWS[case]
    with pytest.raises(IntegrityError, match="violates check constraint"):
        execute(
            f"INSERT INTO jobq_queue (name, {', '.join(columns)}) "  # noqa: S608
            f"VALUES ('flow', {', '.join(columns.values())})"
        )


@pytest.mark.parametrize("case", list(REFUSED_KIND_ROWS))
def test_postgresql_refuses_a_kind_row_no_reader_could_use(case):
    columns = REFUSED_KIND_ROWS[case]
    with pytest.raises(IntegrityError, match="violates check constraint"):
        execute(
            f"INSERT INTO jobq_kind_limit (kind, {', '.join(columns)}) "  # noqa: S608
            f"VALUES (%s, {', '.join(columns.values())})",
            [limited_step.kind],
        )


def test_a_hand_written_pause_until_infinity_is_refused():
    flow_control.pause_queue("flow")
    with pytest.raises(IntegrityError, match="jobq_queue_paused_until_in_range"):
        execute("UPDATE jobq_queue SET paused_until = 'infinity'")
    with pytest.raises(IntegrityError, match="jobq_queue_paused_until_needs_paused_at"):
        execute("UPDATE jobq_queue SET paused_at = NULL, paused_until = now() + interval '1 h'")
    with pytest.raises(IntegrityError, match="jobq_queue_paused_at_in_range"):
        execute("UPDATE jobq_queue SET paused_at = '-infinity'")


# -- rows that got past them -----------------------------------------------------------------


@pytest.mark.parametrize("case", [*REFUSED_QUEUE_ROWS, *ODD_QUEUE_ROWS])
def test_a_bad_queue_row_neither_crashes_nor_stalls_a_worker_or_the_operators_views(
    case, admin_client, caplog
):
    columns, paused = {**REFUSED_QUEUE_ROWS, **ODD_QUEUE_ROWS}[case]
    write_row("jobq_queue", "name", "flow", columns)
    flow_step.enqueue("in the odd queue")
    record.enqueue("elsewhere")
    caplog.set_level(logging.WARNING, logger="django_jobq")

    run_burst()

    assert list(Effect.objects.values_list("label", flat=True)) == ["elsewhere"]
    assert Run.objects.exists() is not paused  # read as a pause, or as none
    assert Job.objects.filter(kind=flow_step.kind).exists() is paused
    if {"concurrency_limit", "rate_limit"} & set(columns):  # ignored (no setting's here)
        assert "jobq_queue row of queue 'flow': " in caplog.text
        assert " ignored, it is not a limit" in caplog.text
    (control,) = [c for c in flow_control.queue_states() if c.name == "flow"]
    assert control.paused is paused
    assert (control.concurrency_limit, control.rate_limit) == (None, None)
    views = operator_readers_render(admin_client, "flow")
    assert views["metrics"][("jobq_queue_paused", (("queue", "flow"),))] == int(paused)


def test_a_pause_until_a_time_no_datetime_holds_is_shown_as_until_resumed(admin_client):
    write_row("jobq_queue", "name", "flow", {"paused_at": "now()", "paused_until": "'infinity'"})
    (control,) = [c for c in flow_control.queue_states() if c.name == "flow"]
    assert control.paused and control.paused_at is not None and control.paused_until is None
    views = operator_readers_render(admin_client, "flow")
    (line,) = [line for line in views["jobq_queues"].splitlines() if line.startswith("flow ")]
    assert line.split()[1] == "yes"


def test_pausing_again_a_queue_paused_since_a_time_no_datetime_holds_starts_afresh():
    write_row("jobq_queue", "name", "flow", {"paused_at": "'-infinity'"})
    pause = flow_control.pause_queue("flow", until=60)
    assert pause.paused_at is not None and pause.paused_until is not None
    assert flow_control.resume_queue("flow")


@pytest.mark.parametrize("case", [*REFUSED_KIND_ROWS, *ODD_KIND_ROWS])
def test_a_bad_kind_row_neither_crashes_nor_stalls_a_worker_or_the_operators_views(
    case, admin_client, caplog
):
    columns = {**REFUSED_KIND_ROWS, **ODD_KIND_ROWS}[case]
    write_row("jobq_kind_limit", "kind", limited_step.kind, columns)
    limited_step.enqueue("limited")
    record.enqueue("elsewhere")
    caplog.set_level(logging.WARNING, logger="django_jobq")

    run_burst()

    assert list(Effect.objects.values_list("label", flat=True)) == ["elsewhere"]
    assert list(Run.objects.values_list("label", flat=True)) == ["limited"]
    if {"concurrency_limit", "rate_limit"} & set(columns):  # ignored: @job's applies
        assert f"jobq_kind_limit row of kind '{limited_step.kind}': " in caplog.text
    (control,) = [c for c in flow_control.kind_limits() if c.kind == limited_step.kind]
    assert (control.concurrency_limit, control.concurrency_limit_source) == (2, "code")
    assert control.rate_limit is None
    operator_readers_render(admin_client, "flow-kinds")
    page = renders(
        admin_client, reverse("admin:django_jobq_kindlimit_change", args=[limited_step.kind])
    )
    assert limited_step.kind in page


def test_the_largest_limits_are_limits_like_any_other(admin_client):
    largest = 2**31 - 1
    flow_control.set_queue_limits("flow", concurrency_limit=largest, rate_limit="1/999999d")
    flow_control.set_kind_limits(limited_step.kind, concurrency_limit=largest)
    for n in range(3):
        flow_step.enqueue(f"queue {n}")
        limited_step.enqueue(f"kind {n}")

    run_burst()

    assert Run.objects.filter(label__startswith="queue").count() == 1  # one in 999,999 days
    assert Run.objects.filter(label__startswith="kind").count() == 3
    views = operator_readers_render(admin_client, "flow")
    key = ("jobq_queue_concurrency_limit", (("queue", "flow"), ("source", "operator")))
    assert views["metrics"][key] == largest
    rate = ("jobq_queue_rate_limit_per_second", (("queue", "flow"), ("source", "operator")))
    assert views["metrics"][rate] == pytest.approx(1 / (999_999 * 86_400))
    assert f"{largest} (operator)" in views["queues page"]


@pytest.mark.parametrize(
    "started_at", ["'infinity'", "now() + interval '1000 years'"], ids=["infinity", "year-3000"]
)
def test_a_start_logged_ahead_of_the_clock_neither_crashes_nor_holds_a_rate_limit(started_at):
    """Workers stamp starts with the database clock: a start further ahead of it than the
    window (written by hand) is none, and the next claim's prune deletes it."""
    flow_control.set_queue_limits("flow", rate_limit="2/30s")
    execute(
        "INSERT INTO jobq_limit_start (scope, name, started_at, starts) "  # noqa: S608
        f"VALUES ('queue', 'flow', {started_at}, 1000)"
    )
    flow_step.enqueue("first")
    flow_step.enqueue("second")
    record.enqueue("elsewhere")

    run_burst()

    assert list(Effect.objects.values_list("label", flat=True)) == ["elsewhere"]
    assert sorted(Run.objects.values_list("label", flat=True)) == ["first", "second"]
    assert not LimitStart.objects.filter(starts=1000).exists()


def test_a_limit_row_deleted_by_hand_under_running_workers_is_written_again():
    flow_control.set_queue_limits("flow", concurrency_limit=1)
    worker = Worker(poll_interval=0.05, concurrency=2, scheduler=False)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        flow_step.enqueue("before")
        wait_until(lambda: Run.objects.filter(label="before").exists(), what="the first job")
        LimitState.objects.all().delete()  # the row the worker's limited claims lock
        flow_step.enqueue("after")
        wait_until(lambda: Run.objects.filter(label="after").exists(), what="the next job")
    finally:
        worker.stop()
        thread.join(timeout=30)
    assert LimitState.objects.filter(scope="queue", name="flow").exists()


@pytest.mark.parametrize("name", ["", "-dash first", "has space", "semi;colon"])
def test_a_row_whose_name_is_no_queue_or_kind_name_is_refused_and_left_out_if_it_got_in(
    name, admin_client
):
    for table, key in (("jobq_queue", "name"), ("jobq_kind_limit", "kind")):
        with (
            pytest.raises(IntegrityError, match="_valid"),
            transaction.atomic(),
            connection.cursor() as cursor,
        ):
            cursor.execute(
                f"INSERT INTO {table} ({key}, concurrency_limit) VALUES (%s, 1)",  # noqa: S608
                [name],
            )
        write_row(table, key, name, {"concurrency_limit": "1"})
    record.enqueue("elsewhere")

    run_burst()

    assert list(Effect.objects.values_list("label", flat=True)) == ["elsewhere"]
    assert name not in flow_control.known_queues()
    assert name not in [control.kind for control in flow_control.kind_limits()]
    operator_readers_render(admin_client, "flow")
