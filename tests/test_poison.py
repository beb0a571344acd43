"""Rows no ``enqueue`` wrote are quarantined, never crashed on (issue 15).

Each poison row is inserted by SQL next to a healthy job, as a row older than the CHECK
constraints of migration 0008 (see tests/poison.py). The claim leases it without failing,
the worker dead-letters it unrun with a reason naming the problem, the healthy job runs and
the worker goes on; every statement that reads the jobs table survives it.
"""

from __future__ import annotations

import importlib
import re
import signal
import threading
from datetime import UTC, datetime
from typing import Any

import pytest
from django.core.management import call_command
from django.db import IntegrityError, OperationalError, connection
from django.db.migrations.recorder import MigrationRecorder

from django_jobq import claims, operations, sql, stats
from django_jobq.conf import MAX_DURATION
from django_jobq.models import JOB_INSERT_CONSTRAINTS, DeadLetter, Job
from django_jobq.task_framework import TaskResultStatus
from django_jobq.worker import Worker
from tests.conftest import REPO_ROOT, wait_until
from tests.factories import DeadLetterFactory
from tests.poison import (
    ALL_ODD_ROWS,
    CLAIMED_POISON,
    RUN_LIKE_ANY_JOB,
    UNCLAIMED_POISON,
    insert_row,
    update_row,
)
from tests.testapp import tasks
from tests.testapp.jobs import record, retry_later
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)


def labels() -> list[str]:
    return sorted(Effect.objects.values_list("label", flat=True))


class RunningWorker:
    """An in-process worker on a thread (full turns: claim, observer tick, idle timeout);
    :meth:`stop` joins it and re-raises whatever ended its loop."""

    def __init__(self, **options: Any) -> None:
        self.worker = Worker(poll_interval=0.2, batch_size=10, **options)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.worker.run()
        except BaseException as exc:
            self.error = exc

    def stop(self) -> None:
        self.worker.stop()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive()
        if self.error is not None:
            raise self.error


@pytest.mark.parametrize("case", list(CLAIMED_POISON))
def test_the_claim_leases_a_poison_row_and_names_its_problem(case, queue_cursor):
    columns, reason = CLAIMED_POISON[case]
    poison_id = insert_row(columns)
    healthy = record.enqueue("healthy")
    claimed = {job.id: job for job in claims.claim(queue_cursor, worker_id="w", limit=10)}
    assert set(claimed) == {poison_id, healthy.pk}
    assert (claimed[healthy.pk].poison, claimed[healthy.pk].payload) == ("", {"label": "healthy"})
    poisoned = claimed[poison_id]
    if reason.startswith("poison row: "):
        assert reason.removeprefix("poison row: ") in poisoned.poison
        assert poisoned.payload == {}
    else:
        assert poisoned.attempts_exhausted and not poisoned.reclaimed
    assert poisoned.visibility_timeout.total_seconds() <= 10 * 365 * 86400


@pytest.mark.parametrize("case", list(CLAIMED_POISON))
def test_a_poison_row_becomes_one_dead_letter_and_the_healthy_job_next_to_it_runs(case):
    columns, reason = CLAIMED_POISON[case]
    poison_id = insert_row(columns)
    record.enqueue("healthy")
    running = RunningWorker()
    wait_until(lambda: labels() == ["healthy"] and DeadLetter.objects.exists(), what="outcomes")
    record.enqueue("after")  # the loop goes on: claims, ticks and idles with the row gone
    wait_until(lambda: labels() == ["after", "healthy"], what="the next job")
    running.stop()
    # (not DeadLetter.objects.get(): the row keeps the poison values, see test_admin_poison)
    ((job_id, dead_reason),) = DeadLetter.objects.values_list("job_id", "reason")
    assert job_id == poison_id
    assert reason in dead_reason, dead_reason
    assert not Job.objects.exists()


@pytest.mark.parametrize("case", list(UNCLAIMED_POISON))
def test_a_worker_turns_with_an_unclaimable_poison_row_in_the_table(case):
    poison_id = insert_row(UNCLAIMED_POISON[case])
    record.enqueue("healthy")
    running = RunningWorker()
    wait_until(lambda: labels() == ["healthy"], what="the healthy job")
    record.enqueue("after")
    wait_until(lambda: labels() == ["after", "healthy"], what="the next job")
    running.stop()
    assert list(Job.objects.values_list("id", flat=True)) == [poison_id]
    assert not DeadLetter.objects.exists()


@pytest.mark.parametrize("case", list(RUN_LIKE_ANY_JOB))
def test_an_odd_row_that_breaks_no_rule_runs_like_any_job(case):
    insert_row(RUN_LIKE_ANY_JOB[case], label="odd")
    record.enqueue("healthy")
    running = RunningWorker()
    wait_until(lambda: labels() == ["healthy", "odd"], what="both jobs")
    running.stop()
    assert not Job.objects.exists() and not DeadLetter.objects.exists()


@pytest.mark.parametrize("case", list(ALL_ODD_ROWS))
def test_queue_states_samples_and_the_idle_wake_up_survive_each_poison_row(case, queue_cursor):
    insert_row(ALL_ODD_ROWS[case])
    record.enqueue("healthy")
    (state,) = stats.queue_states()
    assert (state.queue, state.ready) == ("default", 1 + (case not in UNCLAIMED_POISON))
    assert 0 <= state.oldest_ready_age < 60
    (bounded,) = stats.queue_states(count_cap=1000)  # the dashboard's bounded counts
    assert bounded.ready == state.ready and 0 <= bounded.oldest_ready_age < 60
    # The idle worker's wake-up query: seconds until something is due (None: nothing is).
    queue_cursor.execute(sql.claims.SECONDS_UNTIL_DUE_ANY_QUEUE, {"held": [], "horizon": 0.5})
    ((until_due,),) = queue_cursor.fetchall()
    assert until_due is None or until_due >= 0
    queue_cursor.execute(sql.stats.SAMPLE_QUEUES)
    assert queue_cursor.fetchall() == [("default",)]


def test_a_real_worker_process_quarantines_every_poison_row_and_runs_the_healthy_jobs(manage):
    poison_ids = {insert_row(columns): reason for columns, reason in CLAIMED_POISON.values()}
    unclaimed_ids = {insert_row(columns) for columns in UNCLAIMED_POISON.values()}
    for case, columns in RUN_LIKE_ANY_JOB.items():
        insert_row(columns, label=case)
    for n in range(5):
        record.enqueue(f"healthy {n}")
    worker = manage(
        "jobq_worker", "--concurrency", "2", "--batch-size", "4", "--poll-interval", "0.2"
    )
    expected = sorted([*RUN_LIKE_ANY_JOB, *(f"healthy {n}" for n in range(5))])
    wait_until(
        lambda: labels() == expected and DeadLetter.objects.count() == len(poison_ids),
        timeout=60,
        what="the healthy jobs to run and the poison rows to be dead letters",
    )
    record.enqueue("after")
    wait_until(lambda: "after" in labels(), timeout=60, what="the next job")
    assert worker.poll() is None, worker.communicate()
    worker.send_signal(signal.SIGTERM)
    _, stderr = worker.communicate(timeout=60)
    assert worker.returncode == 0, stderr
    dead = dict(DeadLetter.objects.values_list("job_id", "reason"))
    assert dead.keys() == poison_ids.keys()
    for job_id, reason in poison_ids.items():
        assert reason in dead[job_id], (reason, dead[job_id])
    assert set(Job.objects.values_list("id", flat=True)) == unclaimed_ids
    assert "poison" not in labels()


@pytest.mark.parametrize(
    ("columns", "constraint"),
    [
        ({"run_at": "'-infinity'"}, "jobq_job_run_at_is_finite"),
        ({"run_at": "'infinity'"}, "jobq_job_run_at_is_finite"),
        ({"expires_at": "'infinity'"}, "jobq_job_expires_at_is_finite"),
        ({"created_at": "'-infinity'"}, "jobq_job_created_at_is_finite"),
        ({"visibility_timeout": "'300000 years'"}, "jobq_job_visibility_timeout_1ms_to_10y"),
        ({"visibility_timeout": "'3651 days'"}, "jobq_job_visibility_timeout_1ms_to_10y"),
        ({"visibility_timeout": "'0.0009 seconds'"}, "jobq_job_visibility_timeout_1ms_to_10y"),
        ({"visibility_timeout": "'-5 seconds'"}, "jobq_job_visibility_timeout_1ms_to_10y"),
        ({"payload": "'[1, 2]'"}, "jobq_job_payload_is_object"),
        ({"payload": "'null'"}, "jobq_job_payload_is_object"),
        ({"payload": "'\"text\"'"}, "jobq_job_payload_is_object"),
        ({"attempts": "6", "max_attempts": "5"}, "jobq_job_ready_attempts_within_max"),
        ({"status": "'done'"}, "jobq_job_status_is_known"),
        ({"max_attempts": "0"}, "jobq_job_max_attempts_gte_1"),
        ({"attempts": "-1"}, "jobq_job_attempts_check"),
    ],
)
def test_the_constraints_refuse_at_insert_what_enqueue_refuses(columns, constraint):
    values = {
        "queue": "'default'",
        "kind": "'x'",
        "payload": "'{}'",
        "max_attempts": "5",
        "visibility_timeout": "interval '30 seconds'",
        **columns,
    }
    with pytest.raises(IntegrityError, match=constraint), connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO jobq_job ({', '.join(values)}) "  # noqa: S608 (the test's own SQL)
            f"VALUES ({', '.join(values.values())})"
        )
    assert not Job.objects.exists()


def test_the_constraints_of_migration_0008_are_not_valid_until_validated():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT conname, convalidated FROM pg_constraint "
            "WHERE conrelid = 'jobq_job'::regclass AND conname = ANY(%s)",
            [[constraint.name for constraint in JOB_INSERT_CONSTRAINTS]],
        )
        rows = dict(cursor.fetchall())
    assert rows == {constraint.name: False for constraint in JOB_INSERT_CONSTRAINTS}


def test_a_poison_row_left_in_place_makes_validate_name_it_and_goes_once_quarantined():
    insert_row({"payload": "'[]'"})
    validate = "ALTER TABLE jobq_job VALIDATE CONSTRAINT jobq_job_payload_is_object"
    with pytest.raises(IntegrityError, match="payload_is_object"), connection.cursor() as c:
        c.execute(validate)
    Worker(burst=True, poll_interval=0.05).run()
    assert DeadLetter.objects.values_list("reason", flat=True).get().startswith("poison row")
    with connection.cursor() as cursor:
        cursor.execute(validate)


def test_enqueue_s_extremes_still_insert_and_a_worker_s_writes_keep_the_constraints():
    latest = datetime(9999, 12, 31, 23, 59, tzinfo=UTC)
    earliest = datetime(1, 1, 1, tzinfo=UTC)
    record.using(  # on a queue no worker here serves: a 1 ms lease lapses while it runs
        queue="extremes",
        visibility_timeout=0.001,
        max_attempts=2**31 - 1,
        priority=-(2**31),
        run_at=earliest,
    ).enqueue("shortest lease")
    record.using(visibility_timeout=MAX_DURATION, priority=2**31 - 1, expires_at=latest).enqueue(
        "longest lease"
    )
    record.using(run_at=latest).enqueue("due last")
    retry_later.using(visibility_timeout=MAX_DURATION, max_attempts=2).enqueue(delay=MAX_DURATION)
    stats = Worker(burst=True, poll_interval=0.05, queues=["default"]).run()
    assert labels() == ["longest lease"]
    assert (
        stats.outcome_counts.retried == 1
    )  # ready again, 10 years from now: within the constraints
    with connection.cursor() as cursor:
        for constraint in JOB_INSERT_CONSTRAINTS:
            cursor.execute(f"ALTER TABLE jobq_job VALIDATE CONSTRAINT {constraint.name}")


# -- docs/operations.md, "Rows written by other producers" ---------------------------------

SECTION = (
    (REPO_ROOT / "docs" / "operations.md")
    .read_text()
    .split("## Rows written by other producers\n")[1]
    .split("\n## ")[0]
)


def test_the_documented_constraints_are_the_models():
    documented = set(re.findall(r"^\| `(jobq_job_[a-z0-9_]+)` \|", SECTION, re.MULTILINE))
    assert documented == {constraint.name for constraint in JOB_INSERT_CONSTRAINTS}


def test_the_documented_query_finds_the_rows_that_break_a_rule_then_validate_passes():
    (query,) = re.findall(r"```sql\n(.*?)```", SECTION, re.DOTALL)
    breaking_no_rule = {"deep object payload", "attempts and max_attempts at the integer maximum"}
    breaking = {
        insert_row(columns)
        for case, columns in ALL_ODD_ROWS.items()
        if case not in breaking_no_rule and case not in RUN_LIKE_ANY_JOB
    }
    for case in breaking_no_rule:  # an object; attempts within max_attempts
        insert_row(CLAIMED_POISON[case][0])
    for columns in RUN_LIKE_ANY_JOB.values():  # a running row is the worker's; 4000 BC is finite
        insert_row(columns)
    record.enqueue("healthy")
    with connection.cursor() as cursor:
        cursor.execute(query)
        assert {row[0] for row in cursor.fetchall()} == breaking
        cursor.execute("DELETE FROM jobq_job WHERE id = ANY(%s)", [list(breaking)])
        for constraint in JOB_INSERT_CONSTRAINTS:
            cursor.execute(f"ALTER TABLE jobq_job VALIDATE CONSTRAINT {constraint.name}")


def test_a_poison_dead_letter_is_left_in_place_by_a_redrive_and_the_others_redriven():
    insert_row({"payload": "'[1]'"})
    insert_row({"visibility_timeout": "'300000 years'"})
    Worker(burst=True, poll_interval=0.05).run()
    DeadLetterFactory(kind="tests.testapp.jobs.gone", reason="unknown kind", payload={})
    assert DeadLetter.objects.count() == 3
    ids = sorted(DeadLetter.objects.values_list("id", flat=True))

    assert operations.redrive(ids) == 1  # no IntegrityError: the poison ones stay
    (job,) = Job.objects.all()
    assert job.kind == "tests.testapp.jobs.gone"
    assert DeadLetter.objects.count() == 2
    assert all(
        r.startswith("poison row") for r in DeadLetter.objects.values_list("reason", flat=True)
    )


def test_the_migration_gives_up_on_a_held_lock_instead_of_queueing_the_queue_behind_it(
    connect, monkeypatch
):
    operations = importlib.import_module("django_jobq.migrations._operations")
    monkeypatch.setattr(operations, "LOCK_TIMEOUT", "200ms")
    call_command("migrate", "django_jobq", "0007", verbosity=0)
    reader = connect(autocommit=False)
    reader.execute("SELECT count(*) FROM jobq_job")  # a transaction left open on the table
    with pytest.raises(OperationalError, match="lock timeout"):
        call_command("migrate", "django_jobq", verbosity=0)
    applied = MigrationRecorder(connection).applied_migrations()
    assert ("django_jobq", "0008_job_insert_constraints") not in applied
    reader.rollback()
    call_command("migrate", "django_jobq", verbosity=0)
    test_the_constraints_of_migration_0008_are_not_valid_until_validated()


def test_the_poison_job_of_a_django_task_fails_its_result_with_the_reason():
    result = tasks.add.enqueue(1, 2)
    update_row(Job.objects.values_list("id", flat=True).get(), {"run_at": "'-infinity'"})
    Worker(burst=True, poll_interval=0.05).run()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    (error,) = result.errors
    assert error.exception_class_path == "django_jobq.task_results.TaskNotRun"
    assert error.traceback.startswith("poison row: run_at is -infinity")
    assert DeadLetter.objects.values_list("reason", flat=True).get() == (
        "poison row: run_at is -infinity"
    )
