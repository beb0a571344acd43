"""Django's Tasks framework on django-jobq: ``@task`` code runs with every queue guarantee.

The same module runs on Django 5.2 with the django-tasks backport (scripts/test's main
venv) and on Django 6.1's own ``django.tasks`` (scripts/test's second stage). The tasks
are in tests/testapp/tasks.py, written against the standard API. See docs/tasks.md.
"""

import json
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
from asgiref.sync import async_to_sync
from django.db import connection, transaction
from django.test.utils import override_settings
from django.utils import timezone

from django_jobq import claims, enqueue, leases, outcomes, registry, sql, task_results
from django_jobq.checks import check_tasks_backends
from django_jobq.conf import validate_tasks_backend
from django_jobq.models import DeadLetter, Job, StoredTaskResult
from django_jobq.operations import cancel, redrive
from django_jobq.outcomes import Action
from django_jobq.task_framework import (
    InvalidTask,
    InvalidTaskBackend,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)
from django_jobq.task_results import TaskNotRun
from django_jobq.tasks_backend import JobqBackend
from django_jobq.worker import Worker, announcer
from django_jobq.worker import worker as worker_module
from django_jobq.worker.executor import execute
from django_jobq.worker.held import HeldJob
from django_jobq.worker.maintenance import Maintenance
from tests.conftest import REPO_ROOT, wait_until
from tests.testapp import tasks
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)

BACKEND: dict[str, Any] = {
    "BACKEND": "django_jobq.tasks_backend.JobqBackend",
    "QUEUES": ["default", "tasks", "crash"],
    "OPTIONS": {"RETRY_BACKOFF_BASE": 0.01, "RETRY_BACKOFF_CAP": 0.01},
}


def with_options(**options):
    """``TASKS`` with these ``OPTIONS`` added to the test backend's."""
    return override_settings(
        TASKS={"default": {**BACKEND, "OPTIONS": {**BACKEND["OPTIONS"], **options}}}
    )


def run_burst(**options):
    return Worker(burst=True, poll_interval=0.01, **options).run()


def run_until_finished(result):
    """Run burst workers until ``result`` is SUCCESSFUL or FAILED (retries wait ~10 ms)."""

    def finished():
        run_burst()
        result.refresh()
        return result.is_finished

    wait_until(finished, what=f"task result {result.id} to finish")
    return result


@pytest.fixture
def signals():
    """The framework signals sent during the test, as ``(signal name, status)`` pairs."""
    sent = []
    receivers = {}
    for name, signal_ in (
        ("enqueued", task_enqueued),
        ("started", task_started),
        ("finished", task_finished),
    ):

        def receive(sender, task_result, name=name, **kwargs):
            assert issubclass(sender, JobqBackend)
            sent.append((name, task_result.status))

        receivers[signal_] = receive
        signal_.connect(receive)
    yield sent
    for signal_, receive in receivers.items():
        signal_.disconnect(receive)


# -- the backend ---------------------------------------------------------------------------


def test_the_backend_supports_deferral_async_tasks_results_and_priorities():
    backend = task_backends["default"]
    assert isinstance(backend, JobqBackend)
    assert backend.supports_defer
    assert backend.supports_async_task
    assert backend.supports_get_result
    assert backend.supports_priority


# -- enqueue -------------------------------------------------------------------------------


def test_enqueue_writes_a_job_and_a_ready_result_in_the_callers_transaction(queue_cursor):
    with transaction.atomic():
        result = tasks.record.enqueue("hello")
        assert claims.claim(queue_cursor, worker_id="w", limit=10) == []  # not committed yet
    assert result.status == TaskResultStatus.READY
    assert (result.args, result.kwargs, result.backend) == (["hello"], {}, "default")
    job = Job.objects.get()
    assert (job.kind, job.queue, job.priority) == ("tests.testapp.tasks.record", "tasks", -100)
    assert job.payload == {
        "result_id": result.id,
        "backend": "default",
        "args": ["hello"],
        "kwargs": {},
    }
    fetched = tasks.record.get_result(result.id)
    assert fetched.status == TaskResultStatus.READY
    assert fetched.enqueued_at == result.enqueued_at == job.created_at
    assert (fetched.args, fetched.worker_ids, fetched.errors) == (["hello"], [], [])


def test_a_rolled_back_enqueue_leaves_no_job_and_sends_no_signal(signals):
    with pytest.raises(RuntimeError), transaction.atomic():
        tasks.add.enqueue(1, 2)
        raise RuntimeError("the view failed after enqueueing")
    assert not Job.objects.exists()
    assert not StoredTaskResult.objects.exists()
    assert signals == []

    with transaction.atomic():
        tasks.add.enqueue(1, 2)
        assert signals == []  # not before the commit
    assert signals == [("enqueued", TaskResultStatus.READY)]


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_a_caller_in_another_database_enqueues_at_its_commit(signals):
    with transaction.atomic(using="other"):
        result = tasks.add.enqueue(1, 2)
        assert not Job.objects.exists()
        assert result.enqueued_at is None
    assert Job.objects.count() == 1
    assert result.enqueued_at == Job.objects.get().created_at
    assert signals == [("enqueued", TaskResultStatus.READY)]


def test_priorities_are_kept_exactly_and_higher_runs_first(queue_cursor):
    for priority in (-100, 0, 100, 7):
        tasks.add.using(priority=priority).enqueue(1, 1)
    claimed = claims.claim(queue_cursor, worker_id="w", limit=10)
    assert [job.priority for job in claimed] == [100, 7, 0, -100]


def test_run_after_defers_the_job(queue_cursor):
    later = timezone.now() + timedelta(hours=1)
    result = tasks.add.using(run_after=later).enqueue(1, 1)
    assert Job.objects.get().run_at == later
    assert claims.claim(queue_cursor, worker_id="w", limit=10) == []
    assert tasks.add.get_result(result.id).task.run_after == later


def test_a_task_due_at_once_has_no_run_after_even_late_in_a_transaction(queue_cursor):
    with transaction.atomic():
        Effect.objects.count()  # the transaction's now() is this statement's time
        result = tasks.add.enqueue(1, 1)
    job = Job.objects.get()
    assert job.run_at == job.created_at
    assert tasks.add.get_result(result.id).task.run_after is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"queue_name": "not-listed"}, "Queue 'not-listed' is not valid for backend"),
        ({"priority": 101}, "priority must be a whole number between -100 and 100"),
        ({"priority": -101}, "priority must be a whole number between -100 and 100"),
        ({"run_after": datetime(2030, 1, 1)}, "run_after must be an aware datetime"),
    ],
)
def test_invalid_tasks_are_refused_when_defined(change, message):
    with pytest.raises(InvalidTask, match=message):
        tasks.add.using(**change)
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((timezone.now(), 1), {}, r"args\[0\]: .* is not JSON-serialisable"),
        ((1,), {"b": float("nan")}, r"kwargs\['b'\]: nan .* is not JSON-serialisable"),
        (([{1: "x"}], 2), {}, r"args\[0\]\[0\]\[1\]: key 1 \(type int\) is not a str"),
        ((1,), {}, "missing a required argument: 'b'"),
        ((1, 2, 3), {}, "too many positional arguments"),
    ],
    ids=["datetime", "NaN", "int key", "missing argument", "extra argument"],
)
def test_arguments_must_be_json_and_fit_the_task(args, kwargs, message):
    with pytest.raises(TypeError, match=message):
        tasks.add.enqueue(*args, **kwargs)
    assert not Job.objects.exists()
    assert not StoredTaskResult.objects.exists()


def test_enqueue_and_get_result_have_async_forms():
    result = async_to_sync(tasks.add.aenqueue)(2, 3)
    assert Job.objects.get().payload["args"] == [2, 3]
    fetched = async_to_sync(tasks.add.aget_result)(result.id)
    assert (fetched.id, fetched.status) == (result.id, TaskResultStatus.READY)


def test_an_unknown_result_id_raises_the_frameworks_error():
    with pytest.raises(TaskResultDoesNotExist):
        tasks.add.get_result("no-such-result")


# -- running -------------------------------------------------------------------------------


def test_a_worker_runs_the_task_and_stores_its_return_value(signals):
    result = tasks.record.enqueue("ran")
    stats = run_burst()

    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == {"recorded": "ran"}
    assert result.worker_ids == [stats.worker_id]
    assert result.attempts == 1
    assert result.enqueued_at is not None and result.started_at is not None
    assert result.finished_at is not None
    assert result.enqueued_at <= result.started_at == result.last_attempted_at
    assert result.started_at <= result.finished_at
    assert result.errors == []
    assert list(Effect.objects.values_list("label", flat=True)) == ["ran"]
    assert not Job.objects.exists()
    assert signals == [
        ("enqueued", TaskResultStatus.READY),
        ("started", TaskResultStatus.RUNNING),
        ("finished", TaskResultStatus.SUCCESSFUL),
    ]


def test_a_slow_task_finished_receiver_holds_back_no_other_job():
    # task_finished runs on the worker's announcer thread, not its main loop: while a
    # receiver waits, the worker claims, runs and records other jobs (before, the main loop
    # ran the receiver, and the task it waits for was never even claimed).
    seen: dict[str, Any] = {}

    def receive(sender, task_result, **kwargs):
        if task_result.args != ["first"]:
            return
        later = tasks.record.enqueue("later")  # committed: the worker is told at once

        def later_finished() -> bool:
            later.refresh()
            return later.is_finished

        try:
            wait_until(later_finished, timeout=10, what="the later task")
            seen["later ran"] = True
        except AssertionError:
            seen["later ran"] = False

    task_finished.connect(receive)
    worker = Worker(poll_interval=60, scheduler=False)
    thread = threading.Thread(target=worker.run)
    try:
        tasks.record.enqueue("first")
        thread.start()
        wait_until(lambda: "later ran" in seen, what="the receiver of the first task's end")
    finally:
        task_finished.disconnect(receive)
        worker.stop()
        thread.join(30)
    assert seen["later ran"]
    assert sorted(Effect.objects.values_list("label", flat=True)) == ["first", "later"]


def test_a_burst_worker_sends_every_task_finished_before_it_returns(signals):
    # 200 receivers of 15 ms each: 3 s of announcing, longer than the worker's exit timeout
    # (2 s): the worker finishes once its announcer has sent them all, not at its exit.
    def take_a_while(sender, task_result, **kwargs):
        time.sleep(0.015)  # the receiver's work, not a wait for anything

    results = [tasks.record.enqueue(f"task {n}") for n in range(200)]
    task_finished.connect(take_a_while)
    try:
        run_burst(concurrency=4)
    finally:
        task_finished.disconnect(take_a_while)

    finished = [status for name, status in signals if name == "finished"]
    assert finished == [TaskResultStatus.SUCCESSFUL] * len(results)


def test_a_stopping_worker_sends_every_task_finished_before_it_exits():
    # The first receiver works for 2.5 s once the worker is told to stop, longer than the
    # worker's exit timeout (2 s): the stopping worker waits for its announcer as it waits
    # for running jobs, within its shutdown timeout.
    announced: list[str] = []
    stopped = threading.Event()

    def slow_first(sender, task_result, **kwargs):
        if not announced:
            stopped.wait(30)
            time.sleep(2.5)  # the receiver's work, not a wait for anything
        announced.append(task_result.id)

    for n in range(20):
        tasks.record.enqueue(f"task {n}")
    task_finished.connect(slow_first)
    worker = Worker(poll_interval=60, scheduler=False, concurrency=4, shutdown_timeout=30)
    thread = threading.Thread(target=worker.run)
    try:
        thread.start()
        wait_until(
            lambda: StoredTaskResult.objects.filter(status="SUCCESSFUL").count() > 1,
            what="tasks to finish",
        )
        worker.stop()  # SIGTERM's path
        stopped.set()
        thread.join(30)
    finally:
        stopped.set()
        task_finished.disconnect(slow_first)
    assert not thread.is_alive()
    successful = StoredTaskResult.objects.filter(status="SUCCESSFUL")
    assert sorted(announced) == sorted(successful.values_list("id", flat=True))
    assert len(announced) > 1


def test_task_finished_is_sent_in_the_order_the_outcomes_were_recorded():
    order: list[str] = []

    def hold_the_first(sender, task_result, **kwargs):
        if not order:  # meanwhile ten more are recorded, then announced together
            wait_until(
                lambda: StoredTaskResult.objects.filter(status="SUCCESSFUL").count() > 10,
                what="more tasks to finish",
            )
        order.append(task_result.args[0])

    labels = [f"task {n:02}" for n in range(30)]
    for label in labels:
        tasks.record.enqueue(label)
    task_finished.connect(hold_the_first)
    try:
        run_burst(concurrency=1, batch_size=1)  # run, and acked, in enqueue order
    finally:
        task_finished.disconnect(hold_the_first)
    assert order == labels


@pytest.mark.parametrize("raised", [ValueError, SystemExit, KeyboardInterrupt])
def test_a_receiver_that_raises_stops_no_other_announcement(raised, signals, caplog):
    def fail_once(sender, task_result, **kwargs):
        if task_result.args == ["first"]:
            raise raised("the receiver failed")

    tasks.record.enqueue("first")
    tasks.record.enqueue("second")
    task_finished.connect(fail_once)
    try:
        run_burst(batch_size=1, concurrency=1)
    finally:
        task_finished.disconnect(fail_once)
    assert [name for name, _ in signals].count("finished") == 2
    assert "the receiver failed" in caplog.text


def test_a_burst_worker_runs_the_tasks_its_receivers_enqueue():
    def chain(sender, task_result, **kwargs):
        if task_result.args == ["first"]:
            tasks.record.enqueue("follow-up")

    tasks.record.enqueue("first")
    task_finished.connect(chain)
    try:
        run_burst()
    finally:
        task_finished.disconnect(chain)
    assert sorted(Effect.objects.values_list("label", flat=True)) == ["first", "follow-up"]


def test_receivers_far_behind_stop_the_claims_not_the_worker(monkeypatch, caplog):
    # MAX_WAITING results unannounced: the worker claims nothing more (memory stays
    # bounded), but its main loop goes on: it records outcomes and heeds a stop.
    monkeypatch.setattr(worker_module, "EXIT_TIMEOUT", 0.2)
    monkeypatch.setattr(announcer, "MAX_WAITING", 2)
    release = threading.Event()

    def block_first(sender, task_result, **kwargs):
        if task_result.args == ["task 0"]:
            release.wait(30)

    for n in range(20):
        tasks.record.enqueue(f"task {n}")
    task_finished.connect(block_first)
    worker = Worker(
        poll_interval=60, scheduler=False, concurrency=1, batch_size=1, shutdown_timeout=1
    )
    thread = threading.Thread(target=worker.run)
    try:
        thread.start()
        wait_until(
            lambda: StoredTaskResult.objects.filter(status="SUCCESSFUL").count() >= 3,
            what="the receivers to fall behind",
        )
        # Two unannounced: behind. At most what it held then runs (a prefetched job and a
        # running one, and one claim that a notification put before that turn's acks).
        # Absence has no event to wait for: a second of it.
        with pytest.raises(AssertionError, match="timed out"):
            wait_until(lambda: Effect.objects.count() > 5, timeout=1.0)
        worker.stop()
        thread.join(10)
        assert not thread.is_alive()
    finally:
        release.set()
        task_finished.disconnect(block_first)
        worker.stop()
        thread.join(30)
    ran = Effect.objects.count()
    assert StoredTaskResult.objects.filter(status="SUCCESSFUL").count() == ran
    assert f"task_finished not sent for {ran} finished task" in caplog.text


def test_a_receiver_still_running_at_the_shutdown_deadline_is_left_and_logged(monkeypatch, caplog):
    # A stopping worker waits for task_finished's receivers until its shutdown deadline,
    # and no longer: it exits, and says how many tasks' ends it did not announce.
    monkeypatch.setattr(worker_module, "EXIT_TIMEOUT", 0.2)
    release = threading.Event()
    entered = threading.Event()

    def hang(sender, task_result, **kwargs):
        entered.set()
        release.wait(30)

    tasks.record.enqueue("one")
    tasks.record.enqueue("two")
    task_finished.connect(hang)
    worker = Worker(poll_interval=60, scheduler=False, batch_size=1, shutdown_timeout=0.5)
    thread = threading.Thread(target=worker.run)
    try:
        thread.start()
        wait_until(entered.is_set, what="the receiver to start")
        wait_until(
            lambda: StoredTaskResult.objects.filter(status="SUCCESSFUL").count() == 2,
            what="both tasks to finish",
        )
        worker.stop()
        thread.join(10)
        assert not thread.is_alive()
    finally:
        release.set()
        task_finished.disconnect(hang)
    assert re.search(r"task_finished not sent for 2 finished task\(s\): the receivers", caplog.text)


def test_one_ack_statement_records_a_tasks_job_with_its_result_and_a_plain_job(queue_cursor):
    # The outcome statements serve plain jobs and tasks' jobs alike: the task part (here its
    # return value) is NULL for a plain job, whose ack then writes no result.
    result = tasks.record.enqueue("together")
    plain = enqueue("tests.testapp.jobs.record", {"label": "plain"})
    jobs = claims.claim(queue_cursor, worker_id="w", limit=2)
    (plain_job,) = [job for job in jobs if job.id == plain.pk]
    (task_job,) = [job for job in jobs if job.id != plain.pk]
    acked = outcomes.ack(
        queue_cursor,
        [task_job.lease, plain_job.lease],
        return_values=['{"recorded": "together"}', None],
    )

    assert acked == {task_job.id, plain_job.id} and not acked.busy
    (finished,) = task_results.read_finished(acked.results)
    assert (finished.id, finished.status) == (result.id, "SUCCESSFUL")
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == {"recorded": "together"}
    assert StoredTaskResult.objects.count() == 1
    assert not Job.objects.exists()


@pytest.mark.parametrize("added_column", [None, "result"])
def test_the_results_the_start_and_the_ack_return_are_the_rows_as_stored(
    queue_cursor, added_column
):
    # Both statements return each result as JSON text (the start: the columns the job does
    # not hold; the ack: the row, when given a bare return value), from which the worker
    # builds what the runner and task_finished get: field for field, the row the ORM reads,
    # whatever JSON it holds; also once a later migration added a column named like the
    # statements' alias (a rolling deploy: old workers, new schema).
    label = 'é "quoted" \\ back\u2028slash 😀'
    returned = {"n": 12345678901234567890, "x": 0.1, "s": label, "nested": [1, {"b": None}]}
    result = tasks.record.enqueue(label=label)
    StoredTaskResult.objects.filter(pk=result.id).update(
        errors=[{"exception_class_path": "builtins.KeyError", "traceback": label}],
        run_after=timezone.now() - timedelta(minutes=1),
    )
    if added_column:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE jobq_task_result ADD COLUMN {added_column} jsonb")
    try:
        task_kinds = [kind for kind in registry.claimable_kinds() if task_results.handler(kind)]
        claimed = task_results.claim_and_start(
            queue_cursor, task_kinds=task_kinds, worker_id="w", limit=1
        )
        (job,) = claimed.jobs
        assert claimed.start_error is None
        taken = task_results.take_started(job.lease)
        assert taken is not None
        running = StoredTaskResult.objects.get(pk=result.id)
        assert taken[0]._asdict() == {
            name: getattr(running, name) for name in task_results.StartedResult._fields
        }

        acked = outcomes.ack(queue_cursor, [job.lease], return_values=[json.dumps(returned)])

        (finished,) = task_results.read_finished(acked.results)
        stored = StoredTaskResult.objects.get(pk=result.id)
        assert _columns(finished) == _columns(stored)
        assert (stored.kwargs, stored.return_value) == ({"label": label}, returned)
    finally:
        if added_column:
            with connection.cursor() as cursor:
                cursor.execute(f"ALTER TABLE jobq_task_result DROP COLUMN {added_column}")


#: Numbers that ``jsonb`` gives back as Python wrote them.
NUMBERS = [0.1, 1e-7, 1.0, -2.5, 12345678901234567890, {"n": 1.5e15}]


@pytest.mark.parametrize(
    ("enqueue_task", "returned"),
    [
        (lambda: tasks.flaky.enqueue("again", failures=2), 3),
        (
            lambda: tasks.record.enqueue('é "quoted" \\ back\u2028slash 😀'),
            {"recorded": 'é "quoted" \\ back\u2028slash 😀'},
        ),
        (lambda: tasks.echo.enqueue(1e300), 10**300),  # jsonb prints it without its exponent
        (
            lambda: tasks.echo.enqueue([0.1, 1e-7, 1.0, {"n": 12345678901234567890}]),
            [0.1, 1e-7, 1.0, {"n": 12345678901234567890}],
        ),
    ],
    ids=["after-two-retries", "text", "a float of 1e16 or more", "a float"],
)
def test_task_finished_gets_the_result_as_stored_without_reading_it_back(enqueue_task, returned):
    # The ack returns only when it finished a result the worker started (see the next
    # test); the worker makes task_finished's result from the one its attempt started.
    # Field for field, it is what get_result reads afterwards: errors and worker ids of the
    # failed attempts included.
    announced = []

    def receive(sender, task_result, **kwargs):
        announced.append(task_result)

    task_finished.connect(receive)
    try:
        result = run_until_finished(enqueue_task())
    finally:
        task_finished.disconnect(receive)

    (finished,) = [each for each in announced if each.status == TaskResultStatus.SUCCESSFUL]
    stored = result.task.get_result(result.id)
    assert _fields(finished) == _fields(stored)
    assert finished.return_value == stored.return_value == returned
    assert finished.task.module_path == stored.task.module_path


def test_the_starts_columns_are_the_started_results_fields_in_order():
    # The start returns its columns as a JSON array, read by position into StartedResult.
    returned = re.search(r"json_build_array\((.*?)\)::text", sql.tasks.START_TASK_ATTEMPTS, re.S)
    assert returned is not None
    columns = [name.strip().removeprefix("result.") for name in returned[1].split(",")]
    assert columns == list(task_results.StartedResult._fields)


def _fields(result: "TaskResult[..., Any]") -> dict[str, Any]:
    names = ["id", "status", "enqueued_at", "started_at", "finished_at", "last_attempted_at"]
    names += ["args", "kwargs", "backend", "errors", "worker_ids"]
    return {name: getattr(result, name) for name in names}


class _Announced(outcomes.ReturnValue):
    """A return value that notes when it is announced (as the task runner's announces)."""

    finished_at: datetime | None = None

    def announce(self, finished_at: datetime) -> None:
        self.finished_at = finished_at


def test_the_ack_returns_a_results_row_only_where_the_worker_holds_no_copy(queue_cursor):
    # A task runner's return value (a ReturnValue) holds the result its attempt started:
    # the ack then returns only the time it finished it, and the announcement is made from
    # that. A result the ack recreated (pruned meanwhile), or a return value given as bare
    # text, comes back as its row.
    held, recreated, bare = (tasks.record.enqueue(label) for label in ("held", "gone", "bare"))
    task_kinds = [kind for kind in registry.claimable_kinds() if task_results.handler(kind)]
    claimed = task_results.claim_and_start(
        queue_cursor, task_kinds=task_kinds, worker_id="w", limit=3
    )
    by_result = {job.payload["result_id"]: job for job in claimed.jobs}
    StoredTaskResult.objects.filter(pk=recreated.id).delete()
    held_value, recreated_value = _Announced('"held"'), _Announced('"gone"')
    values = [held_value, recreated_value, '"bare"']

    acked = outcomes.ack(
        queue_cursor,
        [by_result[result.id].lease for result in (held, recreated, bare)],
        return_values=values,
    )

    finished = {each.job: each for each in acked.results}
    held_job, recreated_job, bare_job = (by_result[r.id].id for r in (held, recreated, bare))
    stored = StoredTaskResult.objects.get(pk=held.id)
    assert finished[held_job].json is None
    assert finished[held_job].finished_at == stored.finished_at
    assert finished[held_job].return_value is held_value
    for job_id, result in ((recreated_job, recreated), (bare_job, bare)):
        assert finished[job_id].json is not None
        (read,) = task_results.read_finished([finished[job_id]])
        assert _columns(read) == _columns(StoredTaskResult.objects.get(pk=result.id))
    task_results.read_and_announce(acked.results)
    assert held_value.finished_at == stored.finished_at
    assert recreated_value.finished_at is None  # announced from its row instead


def _columns(result: StoredTaskResult) -> dict[str, Any]:
    return {field.attname: getattr(result, field.attname) for field in result._meta.concrete_fields}


def test_the_worker_marks_a_claims_tasks_running_in_one_statement_for_the_runner(queue_cursor):
    first, second = tasks.record.enqueue("one"), tasks.record.enqueue("two")
    plain = enqueue("tests.testapp.jobs.record", {"label": "plain"})
    jobs = claims.claim(queue_cursor, worker_id="w", limit=3)
    task_jobs = [job for job in jobs if job.id != plain.pk]
    task_results.start_claimed(queue_cursor, jobs)

    for result in (first, second):
        result.refresh()
        assert result.status == TaskResultStatus.RUNNING
        assert result.worker_ids == ["w"]
        assert result.started_at is not None and result.started_at == result.last_attempted_at
    taken = [task_results.take_started(job.lease) for job in task_jobs]
    assert all(taken)
    assert {stored.id for stored, _ in filter(None, taken)} == {first.id, second.id}
    # Taken at once: well within a third of the visibility timeout, the lease surely holds.
    assert all(stored.status == "RUNNING" and fresh for stored, fresh in filter(None, taken))
    assert [task_results.take_started(job.lease) for job in jobs] == [None] * 3  # taken once


def test_a_start_at_the_claim_is_fenced(queue_cursor):
    result = tasks.record.enqueue("late")
    (job,) = claims.claim(queue_cursor, worker_id="w", limit=1)
    queue_cursor.execute("UPDATE jobq_job SET attempts = attempts + 1 WHERE id = %s", [job.id])
    task_results.start_claimed(queue_cursor, [job])  # the claim's attempt lost the lease

    assert task_results.take_started(job.lease) is None
    result.refresh()
    assert result.status == TaskResultStatus.READY and result.worker_ids == []


def test_a_released_task_is_ready_again_without_the_released_attempt(queue_cursor):
    result = tasks.record.enqueue("released")
    (job,) = claims.claim(queue_cursor, worker_id="w", limit=1)
    task_results.start_claimed(queue_cursor, [job])
    released = task_results.release(queue_cursor, [job.lease])

    assert released == {job.id}
    assert task_results.take_started(job.lease) is None
    result.refresh()
    assert result.status == TaskResultStatus.READY
    assert result.worker_ids == [] and result.started_at is None
    assert result.last_attempted_at is None
    assert Job.objects.get().status == "ready"


def task_kinds():
    """The kinds of this process's registry that are tasks (what a worker passes)."""
    return sorted(kind for kind in registry.claimable_kinds() if task_results.handler(kind))


def test_a_claim_of_tasks_starts_them_in_its_own_round_trip(queue_cursor):
    first, second = tasks.record.enqueue("one"), tasks.record.enqueue("two")
    plain = enqueue("tests.testapp.jobs.record", {"label": "plain"})
    claimed = task_results.claim_and_start(
        queue_cursor, task_kinds=task_kinds(), worker_id="w", limit=3
    )

    assert claimed.start_error is None and not claimed.results_locked
    assert {job.id for job in claimed.jobs} == {first_job_id(first), first_job_id(second), plain.pk}
    assert claimed.tried == frozenset(job.lease for job in claimed.jobs)  # none started twice
    assert Job.objects.filter(status="running").count() == 3  # the claim committed
    for result in (first, second):
        result.refresh()
        assert result.status == TaskResultStatus.RUNNING and result.worker_ids == ["w"]
    taken = {job.id: task_results.take_started(job.lease) for job in claimed.jobs}
    assert taken[plain.pk] is None
    assert {stored.id for stored, _ in filter(None, taken.values())} == {first.id, second.id}


def first_job_id(result):
    """The id of the job that runs a task ``result`` (its stored ``job_id``)."""
    return StoredTaskResult.objects.get(pk=result.id).job_id


def test_a_note_of_an_earlier_claim_starts_nothing(queue_cursor):
    # The start reads the leases its own claim statement noted in the session: should that
    # statement fail, the note left there is an earlier claim's, and must not start again.
    result = tasks.record.enqueue("once")
    claimed = task_results.claim_and_start(
        queue_cursor, task_kinds=task_kinds(), worker_id="w", limit=1
    )
    (job,) = claimed.jobs
    queue_cursor.execute("SELECT current_setting('jobq.claim_note')")
    (note,) = queue_cursor.fetchone()
    assert note.endswith(f"[[{job.id}, {job.attempt}]]")
    queue_cursor.execute(
        sql.tasks.START_NOTED_TASK_ATTEMPTS, {"claim_note": "0:", "kinds": task_kinds()}
    )

    assert queue_cursor.fetchall() == []
    result.refresh()
    assert result.worker_ids == ["w"]  # started once, by its claim


def test_a_start_that_fails_leaves_the_claim_leased_and_each_task_to_its_runner(queue_cursor):
    # Two jobs naming one result (written past enqueue): the start's upsert cannot touch one
    # row twice, and fails as a whole. The claim had committed; the tasks are not started
    # again by the worker (each runner starts its own, and meets the problem alone).
    first, second = tasks.record.enqueue("one"), tasks.record.enqueue("two")
    queue_cursor.execute(
        "UPDATE jobq_job SET payload = jsonb_set(payload, '{result_id}', to_jsonb(%s::text))"
        " WHERE id = %s",
        [first.id, first_job_id(second)],
    )
    claimed = task_results.claim_and_start(
        queue_cursor, task_kinds=task_kinds(), worker_id="w", limit=2
    )

    assert isinstance(claimed.start_error, psycopg.errors.CardinalityViolation)
    assert len(claimed.jobs) == 2 and Job.objects.filter(status="running").count() == 2
    assert claimed.tried == frozenset(job.lease for job in claimed.jobs)
    first.refresh()
    assert first.status == TaskResultStatus.READY and first.worker_ids == []
    assert all(task_results.take_started(job.lease) is None for job in claimed.jobs)


def test_a_lock_on_the_task_results_delays_a_claim_of_tasks_a_moment_only(connect, queue_cursor):
    result = tasks.record.enqueue("locked out")
    # Ahead of it, jobs of a kind no worker has: the claim's first statement reads only
    # them, and its walk takes the task.
    queue_cursor.execute(
        "INSERT INTO jobq_job (queue, kind, payload, priority, run_at, max_attempts,"
        " visibility_timeout, status) SELECT 'default', 'elsewhere.kind', '{}', 10, now(), 5,"
        " interval '30 s', 'ready' FROM generate_series(1, 2)"
    )
    operator = connect(autocommit=False)
    operator.execute("LOCK TABLE jobq_task_result IN ACCESS EXCLUSIVE MODE")
    # A wait for the lock would end in the statement timeout, not in a lock timeout.
    queue_cursor.execute("SET lock_timeout = '20s'")
    queue_cursor.execute("SET statement_timeout = '5s'")
    try:
        claimed = task_results.claim_and_start(
            queue_cursor, task_kinds=task_kinds(), worker_id="w", limit=1
        )
        assert len(claimed.jobs) == 1
        assert claimed.results_locked and claimed.start_error is None
        assert Job.objects.get(pk=claimed.jobs[0].id).status == "running"  # committed
        # The main loop starts nothing more: the task's runner starts its own, on its thread.
        assert claimed.tried == frozenset(job.lease for job in claimed.jobs)
        task_results.start_claimed(queue_cursor, claimed.jobs, tried=claimed.tried)
    finally:
        operator.rollback()
    assert task_results.take_started(claimed.jobs[0].lease) is None
    result.refresh()
    assert result.status == TaskResultStatus.READY and result.worker_ids == []


def test_a_connection_lost_after_the_claims_commit_still_hands_its_jobs_on(
    queue_cursor, monkeypatch
):
    # The server ends the session after the claim's COMMIT came back, before the start ran.
    tasks.record.enqueue("kept")
    monkeypatch.setattr(
        sql.tasks, "SET_START_LOCK_TIMEOUT", "SELECT pg_terminate_backend(pg_backend_pid())"
    )
    claimed = task_results.claim_and_start(
        queue_cursor, task_kinds=task_kinds(), worker_id="w", limit=1
    )

    assert isinstance(claimed.start_error, psycopg.OperationalError)
    assert [job.id for job in claimed.jobs] == list(Job.objects.values_list("id", flat=True))
    assert claimed.tried == frozenset(job.lease for job in claimed.jobs)


def test_a_task_row_written_past_enqueue_does_not_fail_the_start_of_the_others(queue_cursor):
    # A reclaimed running row whose payload is no object (the check constraint of migration
    # 0008 spares running rows): the worker dead-letters it as poison, and the start of the
    # claim's other tasks goes on.
    healthy = [tasks.record.enqueue("one"), tasks.record.enqueue("two")]
    odd = tasks.record.enqueue("odd")
    queue_cursor.execute(
        "UPDATE jobq_job SET status = 'running', attempts = 1, payload = '[1, 2]',"
        " lease_deadline = now() - interval '1 second' WHERE id = %s",
        [first_job_id(odd)],
    )
    claimed = task_results.claim_and_start(
        queue_cursor, task_kinds=task_kinds(), worker_id="w", limit=3
    )

    assert claimed.start_error is None and len(claimed.jobs) == 3
    assert [job.poison for job in claimed.jobs if job.id == first_job_id(odd)] == [
        "payload is an array, not a JSON object"
    ]
    for result in healthy:
        result.refresh()
        assert result.status == TaskResultStatus.RUNNING and result.worker_ids == ["w"]
    odd.refresh()
    assert odd.status == TaskResultStatus.READY and odd.worker_ids == []


def test_a_release_after_an_earlier_attempt_keeps_that_attempts_start(queue_cursor):
    result = tasks.flaky.enqueue("again", failures=1)
    (job,) = claims.claim(queue_cursor, worker_id="first", limit=1)
    task_results.start_claimed(queue_cursor, [job])
    task_error = '{"exception_class_path": "builtins.ValueError", "traceback": ""}'
    outcomes.retry(queue_cursor, job.id, job.attempt, delay=0, error="boom", task_error=task_error)
    result.refresh()
    first_start = result.started_at
    (job,) = claims.claim(queue_cursor, worker_id="second", limit=1)
    task_results.start_claimed(queue_cursor, [job])
    task_results.release(queue_cursor, [job.lease])

    result.refresh()
    assert result.status == TaskResultStatus.READY
    assert result.worker_ids == ["first"] and result.started_at == first_start


def test_an_async_task_runs():
    result = tasks.async_double.enqueue(21)
    run_burst()
    # django-stubs type an async task's return value as its coroutine; it is the value.
    assert tasks.async_double.get_result(result.id).return_value == 42  # type: ignore[comparison-overlap]


def test_a_task_that_fails_twice_then_succeeds_keeps_both_errors(signals):
    result = run_until_finished(tasks.flaky.enqueue("flaky", failures=2))

    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.attempts == 3
    assert result.return_value == 3  # context.attempt, as the task saw it
    assert [error.exception_class_path for error in result.errors] == [
        "builtins.ConnectionError",
        "builtins.ConnectionError",
    ]
    assert "flaky: attempt 1 failed" in result.errors[0].traceback
    assert "flaky: attempt 2 failed" in result.errors[1].traceback
    assert result.errors[0].exception_class is ConnectionError
    assert list(Effect.objects.values_list("label", flat=True)) == ["flaky attempt 3"]
    started = [status for name, status in signals if name == "started"]
    finished = [status for name, status in signals if name == "finished"]
    assert (started, finished) == ([TaskResultStatus.RUNNING] * 3, [TaskResultStatus.SUCCESSFUL])


def test_a_dead_lettered_task_fails_with_every_error_and_a_redrive_makes_it_ready(signals):
    with with_options(MAX_ATTEMPTS=2):
        result = run_until_finished(tasks.always_fails.enqueue())
    assert result.status == TaskResultStatus.FAILED
    assert [error.exception_class_path for error in result.errors] == ["builtins.ValueError"] * 2
    assert "never works" in result.errors[1].traceback
    with pytest.raises(ValueError, match="Task failed"):
        _ = result.return_value
    dead = DeadLetter.objects.get()
    assert (dead.reason, dead.attempts, dead.max_attempts) == ("max attempts exceeded", 2, 2)
    assert ("finished", TaskResultStatus.FAILED) in signals

    assert redrive([dead.id]) == 1
    new_job = Job.objects.get()
    result.refresh()
    assert result.status == TaskResultStatus.READY
    assert StoredTaskResult.objects.get(pk=result.id).job_id == new_job.pk != dead.job_id
    assert new_job.payload["result_id"] == result.id  # the id survives the fresh job row

    run_until_finished(result)
    assert result.status == TaskResultStatus.FAILED
    assert len(result.errors) == result.attempts == 4  # the history is kept across redrives


def test_a_task_whose_final_attempt_lapsed_fails_without_running_again(queue_cursor):
    with with_options(MAX_ATTEMPTS=1):
        result = tasks.record.enqueue("once")
    (claimed,) = claims.claim(queue_cursor, worker_id="died", limit=1)  # then it crashed
    Job.objects.update(lease_deadline=timezone.now() - timedelta(seconds=1))
    run_burst()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    (error,) = result.errors
    assert error.exception_class is TaskNotRun
    assert error.traceback.startswith("lease expired on final attempt: the lease of attempt 1")
    assert DeadLetter.objects.get().job_id == claimed.id
    assert not Effect.objects.exists()


def test_a_cancelled_task_fails_with_a_task_not_run_error():
    result = tasks.add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(1, 2)
    assert cancel(Job.objects.get().pk)
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    (error,) = result.errors
    assert error.exception_class is TaskNotRun
    assert error.traceback.startswith("cancelled")


def test_a_return_value_that_is_not_json_fails_the_task_at_once():
    result = run_until_finished(tasks.returns_a_set.enqueue())
    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 1
    assert result.errors[0].exception_class_path == "django_jobq.exceptions.Fail"
    assert "return value: {1, 2} (type set) is not JSON-serialisable" in result.errors[0].traceback
    assert DeadLetter.objects.get().reason.startswith("failed: tests.testapp.tasks.returns_a_set")


def test_a_task_the_worker_does_not_know_waits_ready_for_a_worker_that_does(monkeypatch):
    result = tasks.add.enqueue(1, 2)
    monkeypatch.setattr("django_jobq.task_results.discover", lambda: None)
    with registry.isolated(without=["tests.testapp.tasks.add"]):  # a worker without it
        run_burst()
    monkeypatch.undo()

    assert not DeadLetter.objects.exists()
    result.refresh()
    assert result.status == TaskResultStatus.READY  # after the grace: FAILED, see
    assert run_until_finished(result).return_value == 3  # test_unknown_kinds.py


def test_backend_options_set_the_jobs_attempts_and_lease():
    with with_options(MAX_ATTEMPTS=7, VISIBILITY_TIMEOUT=timedelta(minutes=2)):
        tasks.add.enqueue(1, 1)
    job = Job.objects.get()
    assert (job.max_attempts, job.visibility_timeout) == (7, timedelta(minutes=2))


@pytest.mark.skipif(
    not tasks.TASK_OPTIONS_SUPPORTED, reason="Django 6.0's @task refuses extra keywords"
)
def test_task_options_override_the_backends():
    with with_options(MAX_ATTEMPTS=7):
        result = tasks.two_attempts.enqueue("attempt")
    job = Job.objects.get()
    assert (job.max_attempts, job.visibility_timeout) == (2, timedelta(seconds=45))
    run_burst()  # FixedBackoff(0): the retry is due at once, within the same burst
    result.refresh()
    assert (result.status, result.attempts) == (TaskResultStatus.FAILED, 2)
    assert Effect.objects.count() == 2


# -- settings and retention ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"QUEUES": ["has space"]}, "TASKS['default']['QUEUES'] has 'has space'"),
        ({"QUEUES": []}, "must be a non-empty list of queue names"),
        ({"OPTIONS": {"MAX_ATTEMPT": 3}}, "unknown key 'MAX_ATTEMPT'"),
        ({"OPTIONS": {"MAX_ATTEMPTS": 0}}, "['MAX_ATTEMPTS'] = 0 must be an int >= 1"),
        ({"OPTIONS": {"VISIBILITY_TIMEOUT": "30"}}, "'VISIBILITY_TIMEOUT'] = '30' must be"),
    ],
)
def test_invalid_backend_settings_are_django_jobq_e010(params, message):
    with override_settings(TASKS={"default": {**BACKEND, **params}}):
        (error,) = check_tasks_backends()
        assert error.id == "django_jobq.E010"
        assert message in error.msg
        with pytest.raises(InvalidTaskBackend, match=r"django_jobq\.E010"):
            tasks.add.enqueue(1, 2)
    assert check_tasks_backends() == []


def test_naming_the_backend_without_the_tasks_framework_is_django_jobq_e011(monkeypatch):
    monkeypatch.setitem(sys.modules, "django_jobq.tasks_backend", None)  # cannot be imported
    (error,) = check_tasks_backends()
    assert error.id == "django_jobq.E011"
    assert error.hint is not None and "django-tasks" in error.hint


def test_finished_results_are_pruned_after_their_retention(connect):
    done = tasks.add.enqueue(1, 2)
    run_burst()
    waiting = tasks.add.enqueue(3, 4)
    StoredTaskResult.objects.update(enqueued_at=timezone.now() - timedelta(days=30))
    StoredTaskResult.objects.filter(pk=done.id).update(
        finished_at=timezone.now() - timedelta(hours=2)
    )
    with override_settings(JOBQ={"TASK_RESULT_RETENTION": 3600}):
        Maintenance().run_if_due(connect())
    assert list(StoredTaskResult.objects.values_list("pk", flat=True)) == [waiting.id]
    with pytest.raises(TaskResultDoesNotExist):
        tasks.add.get_result(done.id)


# -- real processes ------------------------------------------------------------------------


@pytest.mark.acceptance
def test_a_task_whose_worker_is_killed_reruns_after_the_lease_and_succeeds(manage):
    lock_id = 5151
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s)", [lock_id])  # attempt 1 waits on it
    try:
        with with_options(VISIBILITY_TIMEOUT=1):
            result = tasks.crash_once.enqueue(lock_id)
        first = manage("jobq_worker", "--queue", "crash")

        def attempt_started(n):
            result.refresh()
            return result.status == TaskResultStatus.RUNNING and len(result.worker_ids) == n

        wait_until(lambda: attempt_started(1), what="attempt 1 to start")
        first.send_signal(signal.SIGKILL)
        first.wait(60)
        deadline = Job.objects.get().lease_deadline

        second = manage("jobq_worker", "--queue", "crash", "--poll-interval", "0.1")

        def finished() -> bool:
            result.refresh()
            return result.is_finished

        wait_until(finished, what="the rerun to finish")
        second.send_signal(signal.SIGTERM)
        _, stderr = second.communicate(timeout=60)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock_all()")

    assert second.returncode == 0, stderr
    assert result.status == TaskResultStatus.SUCCESSFUL, result.errors
    assert result.return_value == "survived attempt 2"
    assert result.attempts == 2
    assert result.worker_ids[0].endswith(f":{first.pid}")
    assert result.worker_ids[1].endswith(f":{second.pid}")
    assert result.last_attempted_at is not None and deadline is not None
    assert result.last_attempted_at >= deadline  # rerun only once the lease lapsed
    assert list(Effect.objects.values_list("label", flat=True)) == ["crash_once attempt 2"]
    assert not Job.objects.exists()


SCRIPT = """
import sys

import django
from django.conf import settings

sys.path[:0] = [{root!r}]
settings.configure(
    INSTALLED_APPS=["django_jobq", *{backport!r}],
    DATABASES={{"default": {{"ENGINE": "django.db.backends.postgresql", **{database!r}}}}},
    TASKS={{"default": {{"BACKEND": "django_jobq.tasks_backend.JobqBackend"}}}},
    USE_TZ=True,
)
django.setup()

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task

from django_jobq.outcomes import Action
from django_jobq.worker import Worker
from django_jobq.worker.executor import execute
from django_jobq.worker.held import HeldJob


@task
def square(x: int) -> int:
    return x * x


result = square.enqueue(12)
Worker(burst=True, poll_interval=0.05).run()
result.refresh()
print(result.status, result.return_value)
"""


def test_the_backend_works_with_settings_configured_in_a_standalone_script():
    settings_dict = connection.settings_dict
    database = {key.lower(): settings_dict[key] for key in ("NAME", "USER", "HOST", "PORT")}
    database["password"] = settings_dict["PASSWORD"]
    script = SCRIPT.format(
        root=str(REPO_ROOT),
        backport=[] if _core_tasks() else ["django_tasks"],
        database={key.upper(): value for key, value in database.items()},
    )
    finished = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert finished.returncode == 0, finished.stderr
    assert finished.stdout.split() == ["SUCCESSFUL", "144"]
    stored = StoredTaskResult.objects.get()  # in the test database, which the script used
    assert (stored.task_path, stored.return_value) == ("__main__.square", 144)


def _core_tasks():
    import importlib.util

    return importlib.util.find_spec("django.tasks") is not None


# -- the examples in docs/tasks.md ---------------------------------------------------------

DOC = (REPO_ROOT / "docs" / "tasks.md").read_text()
PYTHON_BLOCKS = re.findall(r"```python\n(.*?)```", DOC, re.DOTALL)


@pytest.mark.parametrize("index", [0, 1, 6], ids=["Django 6", "Django 5.2", "Django 6.0 alias"])
def test_the_documented_settings_are_valid(index):
    namespace: dict[str, Any] = {}
    exec(PYTHON_BLOCKS[index], namespace)  # noqa: S102 (the docs' own example)
    for alias, params in namespace["TASKS"].items():
        assert params["BACKEND"] == "django_jobq.tasks_backend.JobqBackend"
        assert validate_tasks_backend(alias, params) == []
    assert "django_jobq" in namespace.get("INSTALLED_APPS", ["django_jobq"])


@pytest.fixture
def docs_tasks(monkeypatch):
    """Run the docs' ``shop/tasks.py`` example with the standard imports it shows."""
    if not _core_tasks():
        import django_tasks

        monkeypatch.setitem(sys.modules, "django.tasks", django_tasks)
    namespace = {"__name__": "shop.tasks"}
    with (
        registry.isolated(),  # forget them after
        override_settings(TASKS={"default": {**BACKEND, "QUEUES": ["default", "emails"]}}),
    ):
        exec(PYTHON_BLOCKS[2], namespace)  # noqa: S102 (the docs' own example)
        yield namespace


def test_the_documented_tasks_run_and_report_their_results(docs_tasks):
    orders = SimpleNamespace(create=lambda total: SimpleNamespace(pk=7, total=total))
    usage = {**docs_tasks, "Order": SimpleNamespace(objects=orders)}
    exec(PYTHON_BLOCKS[3], usage)  # noqa: S102 (the docs' own example)
    assert Job.objects.get().queue == "emails"
    assert usage["result"].status == TaskResultStatus.READY
    stock = docs_tasks["sync_stock"].enqueue("sku-1")
    run_burst()
    exec(PYTHON_BLOCKS[4], usage)  # noqa: S102 (the docs' own example)
    assert (usage["result"].status, usage["result"].return_value) == (
        TaskResultStatus.SUCCESSFUL,
        "receipt for order 7 sent",
    )
    assert docs_tasks["sync_stock"].get_result(stock.id).return_value == 1


@pytest.mark.skipif(
    not tasks.TASK_OPTIONS_SUPPORTED, reason="Django 6.0's @task refuses extra keywords"
)
def test_the_documented_task_options_reach_the_job(docs_tasks):
    namespace: dict[str, Any] = {"__name__": "shop.tasks"}
    exec(PYTHON_BLOCKS[5], namespace)  # noqa: S102 (the docs' own example)
    namespace["import_catalogue"].enqueue("https://example.com/catalogue.csv")
    job = Job.objects.get()
    assert (job.max_attempts, job.visibility_timeout) == (10, timedelta(minutes=5))
    definition = registry.get("shop.tasks.import_catalogue")
    assert definition is not None and definition.backoff is not None
    assert definition.backoff(1) == definition.backoff(7) == 30


def test_a_task_that_waited_past_its_lease_in_the_prefetch_is_not_called(queue_cursor):
    tasks.record.enqueue("reclaimed meanwhile")
    (job,) = claims.claim(queue_cursor, worker_id="stalled", limit=1)
    task_results.start_claimed(queue_cursor, [job])
    # The worker stalled (say, SIGSTOP) longer than the lease: another worker reclaimed it.
    queue_cursor.execute(
        "UPDATE jobq_job SET lease_deadline = now() - interval '1 second' WHERE id = %s", [job.id]
    )
    (again,) = claims.claim(queue_cursor, worker_id="other", limit=1)
    assert again.attempt == job.attempt + 1
    started, _ = task_results._started[job.lease]
    task_results._started[job.lease] = (started, 0.0)  # taken long after a third of the timeout

    def extend(held: HeldJob) -> bool:
        extended = leases.heartbeat(queue_cursor, [held.job.lease])
        held.lease_lost = held.job.id not in extended
        return not held.lease_lost

    outcome = execute(HeldJob(job), extend)
    assert not Effect.objects.filter(label="reclaimed meanwhile").exists()  # never called
    assert outcome.action is Action.LEASE_LOST


@pytest.mark.parametrize(
    ("change", "error"),
    [
        pytest.param("run_after = 'infinity'", "'infinity'", id="a time of infinity"),
        pytest.param(
            "errors = jsonb_build_array((repeat('[', 3000) || repeat(']', 3000))::jsonb)",
            "RecursionError",
            id="JSON nested 3,000 deep",
        ),
    ],
)
def test_a_result_python_cannot_read_fails_that_task_alone(change, error, caplog):
    """A result row holding what Python cannot (written by hand) in a column the worker
    reads: the statements that start the task and record its outcome return the result as
    JSON text, read row by row, so the
    worker stays up, only that task's attempts fail (its runner's start meets the value),
    and its dead letter is recorded. Before, the start of the claim's tasks raised out of
    the worker's main loop (JSON too deep: the process exited, and so did every restart),
    or the dead letter could not be read back (a time of infinity: reclaimed for ever)."""
    with with_options(MAX_ATTEMPTS=2):
        odd = tasks.record.enqueue("odd")
    healthy = tasks.record.enqueue("healthy")
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE jobq_task_result SET " + change + " WHERE id = %s",  # noqa: S608 (the test's own)
            [odd.id],
        )

    def dead_lettered():
        run_burst(concurrency=2)  # again while the retry is not yet due (~10 ms)
        return DeadLetter.objects.exists()

    wait_until(dead_lettered, what="the odd task's dead letter")

    assert list(Effect.objects.values_list("label", flat=True)) == ["healthy"]
    assert StoredTaskResult.objects.get(id=healthy.id).status == "SUCCESSFUL"
    dead = DeadLetter.objects.get()
    assert dead.attempts == 2 and error in dead.last_error
    assert "cannot be read" in caplog.text  # its task_finished is not sent, and says so


def test_a_task_runs_with_its_jobs_arguments_whatever_its_result_row_holds():
    # The start returns only the result's columns its job does not hold: the arguments the
    # task gets, and those its started result shows, are the job's. A result's copy that no
    # longer matches them (written by hand, here beyond what Python can read) is not read.
    result = tasks.record.enqueue(label="from the job")
    deep = "jsonb_build_object('deep', (repeat('[', 3000) || repeat(']', 3000))::jsonb)"
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE jobq_task_result SET kwargs = {deep} WHERE id = %s",  # noqa: S608 (the test's own)
            [result.id],
        )
    started = []

    def receive(sender, task_result, **kwargs):
        started.append(task_result.kwargs)

    task_started.connect(receive)
    try:
        run_burst()
    finally:
        task_started.disconnect(receive)

    assert started == [{"label": "from the job"}]
    assert list(Effect.objects.values_list("label", flat=True)) == ["from the job"]
    status = StoredTaskResult.objects.values_list("status", flat=True).get(pk=result.id)
    assert status == "SUCCESSFUL"


@pytest.mark.parametrize(
    ("result_id", "error"),
    [("null", 'null value in column "id"'), (None, "missing 1 required positional argument")],
    ids=["result_id null", "no result_id"],
)
def test_a_task_job_without_a_result_id_fails_alone_and_the_worker_claims_on(
    result_id, error, caplog
):
    """A task's job written past enqueue (by hand, another producer) whose payload names no
    result cannot be started: the claim's start of its tasks fails on it, the worker hands
    the claim on all the same, each runner starts its own task, and only that job's attempts
    fail (a dead letter with the database's error); the other jobs run."""
    healthy = tasks.add.enqueue(1, 2)
    bad = Job.objects.get()
    payload = {key: value for key, value in bad.payload.items() if key != "result_id"}
    with connection.cursor() as cursor:  # a copy of the task's job, its payload edited
        cursor.execute(
            "INSERT INTO jobq_job (queue, kind, payload, priority, run_at, max_attempts, "
            "visibility_timeout, status, attempts, created_at, expires_at) "
            "SELECT queue, kind, %s::jsonb, priority, run_at, 2, visibility_timeout, status, "
            "attempts, created_at, expires_at FROM jobq_job WHERE id = %s RETURNING id",
            [
                json.dumps({**payload, "result_id": None} if result_id else payload),
                bad.pk,
            ],
        )
        (bad_id,) = cursor.fetchone()
    for n in range(5):
        enqueue("tests.testapp.jobs.record", {"label": f"plain {n}"})

    run_burst(concurrency=2)

    assert Effect.objects.filter(label__startswith="plain").count() == 5
    assert StoredTaskResult.objects.get(id=healthy.id).status == "SUCCESSFUL"
    dead = DeadLetter.objects.get(job_id=bad_id)
    assert error in dead.last_error and dead.attempts == 2
    assert "starting the claim's tasks failed" in caplog.text
