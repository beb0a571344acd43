"""The worker's main connection prepares its statements when, and only when, that is safe:
its listener proved that connections to the queue database keep session state, and
``DATABASES``' ``OPTIONS`` leave ``prepare_threshold`` to it. A migration that changes the
columns a prepared statement returns costs a reconnect, never a job."""

from __future__ import annotations

import logging
import time
from typing import Any

import psycopg
import pytest
from django.db import connection, connections, transaction

from django_jobq.models import DeadLetter, Job
from django_jobq.task_framework import TaskResultStatus
from django_jobq.worker import Worker
from django_jobq.worker import worker as worker_module
from tests.conftest import wait_until
from tests.test_wake import WAKE_BOUND, Running
from tests.testapp import tasks
from tests.testapp.jobs import record
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def main_connections(monkeypatch) -> list[psycopg.Connection[Any]]:
    """The main-loop connections the workers of the test open, in order."""
    opened: list[psycopg.Connection[Any]] = []
    connect = Worker._connect

    def recorded(self: Worker) -> psycopg.Connection[Any]:
        opened.append(connect(self))
        return opened[-1]

    monkeypatch.setattr(Worker, "_connect", recorded)
    return opened


def prepared(conn: psycopg.Connection[Any]) -> int:
    """Statements prepared in ``conn``'s session, the worker's main connection, read from
    the test's thread while the worker runs. Under the connection's lock no statement of
    the worker's is in flight, but a limited claim's pipeline may be open between two
    statements (a pipeline is not shared across threads: a statement sent now would join
    it); so this waits for a moment with the lock free and no pipeline open, and reads
    through libpq directly (psycopg's ``execute`` would take the lock again)."""
    deadline = time.monotonic() + 20.0
    while time.monotonic() < deadline:
        with conn.lock:
            if conn.info.pipeline_status == psycopg.pq.PipelineStatus.OFF:
                result = conn.pgconn.exec_(b"SELECT count(*) FROM pg_prepared_statements")
                assert result.status == psycopg.pq.ExecStatus.TUPLES_OK, result.error_message
                value = result.get_value(0, 0)
                assert value is not None
                return int(value)
        time.sleep(0.001)  # the worker's pipeline ends within a claim's round trips
    raise AssertionError("the worker's connection stayed in a pipeline for 20 s")


def run_one(label: str) -> None:
    record.enqueue(label)
    wait_until(lambda: Effect.objects.filter(label=label).exists(), what=f"job {label} to run")
    wait_until(lambda: not Job.objects.exists(), what=f"job {label} to be acked")


def test_a_listening_worker_on_a_direct_connection_prepares_its_statements(main_connections):
    with Running(worker_id="prepares") as running:
        assert running.worker._listener is not None
        wait_until(running.worker._listener.keeps_session_state.is_set, what="the check")
        run_one("first")
        (main,) = main_connections
        assert main.prepare_threshold == worker_module.PREPARE_THRESHOLD
        assert prepared(main) > 0  # the claim and the ack, at least


def test_a_worker_that_does_not_listen_prepares_nothing(main_connections):
    running = Running(listen=False, poll_interval=0.05, worker_id="no-listen")
    running.thread.start()  # not ``with``: that waits for a listener
    try:
        run_one("polled")
        (main,) = main_connections
        assert main.prepare_threshold is None
        assert prepared(main) == 0
    finally:
        running.__exit__(None, None, None)


def test_databases_options_decide_when_they_set_prepare_threshold(main_connections, monkeypatch):
    options = connections["default"].settings_dict.setdefault("OPTIONS", {})
    monkeypatch.setitem(options, "prepare_threshold", None)
    with Running(worker_id="options-decide") as running:
        assert running.worker._listener is not None
        wait_until(running.worker._listener.keeps_session_state.is_set, what="the check")
        run_one("not prepared")
        (main,) = main_connections
        assert main.prepare_threshold is None
        assert prepared(main) == 0


def test_a_migration_that_changes_a_prepared_claims_columns_costs_a_reconnect_not_a_job(
    main_connections, caplog
):
    caplog.set_level(logging.WARNING, logger="django_jobq.worker")
    try:
        with Running(worker_id="migrated") as running:
            assert running.worker._listener is not None
            wait_until(running.worker._listener.keeps_session_state.is_set, what="the check")
            run_one("before")
            assert prepared(main_connections[0]) > 0
            with connection.cursor() as cursor:
                # The claim returns job.priority: its prepared result type no longer holds.
                cursor.execute("ALTER TABLE jobq_job ALTER COLUMN priority TYPE bigint")
            run_one("after")
    finally:  # once the worker stopped: changed back under it, it would reconnect again
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE jobq_job ALTER COLUMN priority TYPE integer")
    assert "cached plan must not change result type" in caplog.text
    assert len(main_connections) == 2  # one reconnect
    assert not DeadLetter.objects.exists()
    assert running.stats is not None and running.stats.outcome_counts.succeeded == 2


def test_a_migration_of_the_task_results_costs_the_worker_nothing(main_connections, caplog):
    # No prepared statement returns a task result's columns (each returns the result as
    # JSON text: sql.tasks, sql.outcomes), so a migration that alters them makes none
    # stale: no reconnect, and the claimed jobs (tasks and plain ones) run at once.
    caplog.set_level(logging.WARNING, logger="django_jobq.worker")
    with Running(
        worker_id="results-migrated", queues=["default", "tasks"], concurrency=2
    ) as running:
        assert running.worker._listener is not None
        wait_until(running.worker._listener.keeps_session_state.is_set, what="the check")
        first = tasks.record.enqueue("task before")
        wait_until(lambda: _finished(first), what="the first task")
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE jobq_task_result ALTER COLUMN backend TYPE varchar(130)")
        try:
            with transaction.atomic():
                task = tasks.record.enqueue("task after")
                record.enqueue("plain after")
            wait_until(
                lambda: _finished(task), timeout=WAKE_BOUND, what="the task, without a lapse"
            )
            wait_until(lambda: not Job.objects.exists(), timeout=WAKE_BOUND, what="the plain job")
        finally:
            with connection.cursor() as cursor:
                cursor.execute(
                    "ALTER TABLE jobq_task_result ALTER COLUMN backend TYPE varchar(100)"
                )
    assert "cached plan must not change result type" not in caplog.text
    assert not DeadLetter.objects.exists()
    assert Effect.objects.filter(label__in=["task after", "plain after"]).count() == 2
    assert running.stats is not None and running.stats.outcome_counts.succeeded == 3


def test_a_column_a_newer_migration_adds_to_task_results_does_not_stop_the_worker(main_connections):
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE jobq_task_result ADD COLUMN added_later text")
    try:
        with Running(worker_id="results-widened", queues=["tasks"]) as running:
            result = tasks.record.enqueue("widened")
            wait_until(lambda: _finished(result), what="the task")
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE jobq_task_result DROP COLUMN added_later")
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == {"recorded": "widened"}
    assert running.stats is not None and running.stats.outcome_counts.succeeded == 1


def _finished(result: Any) -> bool:
    result.refresh()
    return bool(result.status == TaskResultStatus.SUCCESSFUL)
