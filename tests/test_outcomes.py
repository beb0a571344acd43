"""What a worker writes about a job always fits, and a write that fails costs only that job.

See docs/guarantees.md ("Faults and what the worker does") and docs/operations.md (log lines).
"""

import logging
import re
import signal
import threading

import pytest
from django.db import connection

from django_jobq import claims, text
from django_jobq.models import DeadLetter, Job
from django_jobq.outcomes import Action, Outcome
from django_jobq.task_framework import InvalidTask, TaskResultStatus
from django_jobq.worker import Worker
from django_jobq.worker.completer import Completer
from django_jobq.worker.observer import Observer
from tests.conftest import REPO_ROOT, wait_until
from tests.testapp import tasks
from tests.testapp.jobs import (
    outcomes_fail_long,
    outcomes_flaky,
    outcomes_raise_long,
    outcomes_record,
    outcomes_returns_coroutine,
)
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)


def run_burst(**options):
    return Worker(burst=True, poll_interval=0.05, **options).run()


# -- a 600-character failure ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("handler", "quoted"),
    [(outcomes_fail_long, "failed: xxx"), (outcomes_raise_long, "failed: ValueError: yyy")],
    ids=["Fail", "outside-retry_on"],
)
def test_a_failure_longer_than_the_reason_column_dead_letters_and_the_rest_run(handler, quoted):
    bad = handler.enqueue(size=600)
    Job.objects.filter(pk=bad.pk).update(priority=10)  # claimed first
    for n in range(20):
        outcomes_record.enqueue(f"healthy {n}")

    stats = run_burst(concurrency=2)

    assert Effect.objects.count() == 20
    assert not Job.objects.exists()
    dead = DeadLetter.objects.get()
    assert dead.job_id == bad.pk
    assert dead.reason.startswith(quoted)
    assert len(dead.reason) == text.MAX_REASON_LENGTH
    assert re.search(r"… \[\d+ more characters\]$", dead.reason)
    assert dead.last_error.endswith("x" * 600 if handler is outcomes_fail_long else "y" * 600)
    assert (stats.outcome_counts.succeeded, stats.outcome_counts.dead_lettered) == (20, 1)


# -- a failed outcome write ----------------------------------------------------------------


@pytest.fixture
def refuse():
    """``refuse(name, clause, row=, when=, label=)``: install a trigger (``clause``: when
    it fires) that raises for the row whose ``label`` (an expression on ``row``, by default
    the job's or dead letter's payload label) is ``refused``; dropped after the test."""
    installed = []

    def install(name, clause, row="NEW", when="", label="payload->>'label'"):
        with connection.cursor() as cursor:
            cursor.execute(
                f"""
                CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                    IF {row}.{label} = 'refused' THEN
                        RAISE EXCEPTION 'refused by a test trigger';
                    END IF;
                    RETURN {row};
                END $$;
                CREATE TRIGGER {name} {clause} FOR EACH ROW {when} EXECUTE FUNCTION {name}();
                """
            )
        installed.append(name)

    yield install
    with connection.cursor() as cursor:
        for name in installed:
            cursor.execute(f"DROP FUNCTION IF EXISTS {name}() CASCADE")


def _completer():
    observer = Observer(worker_id="test", queues=["outcomes"], concurrency=1, kinds=[])
    applied: list[Outcome] = []
    return Completer(on_applied=applied.append, observer=observer), applied


def test_a_batched_ack_that_fails_for_one_job_records_the_others(refuse, queue_cursor, caplog):
    refuse("outcomes_refuse_delete", "BEFORE DELETE ON jobq_job", row="OLD")
    for label in ("a", "refused", "b", "c"):
        outcomes_record.enqueue(label)
    claimed = claims.claim(queue_cursor, worker_id="test", limit=4, queues=["outcomes"])
    completer, applied = _completer()
    completer.pending = [Outcome(job, Action.ACK, duration=0.01) for job in claimed]

    completer.flush(queue_cursor)  # raises nothing

    assert not completer.pending
    assert len(applied) == 4  # every outcome let go: the refused job's lease will lapse
    (left,) = Job.objects.all()
    assert (left.payload, left.status) == ({"label": "refused"}, "running")
    assert not DeadLetter.objects.exists()  # its dead letter deletes the row too: refused
    assert completer.outcome_counts.succeeded == 3
    assert "recording them one by one" in caplog.text
    assert "its dead letter could not be recorded either" in caplog.text


def test_a_retry_the_database_refuses_becomes_a_dead_letter_saying_so(refuse):
    refuse("outcomes_refuse_retry", "BEFORE UPDATE ON jobq_job", when="WHEN (NEW.status = 'ready')")
    refused = outcomes_flaky.enqueue("refused")
    for n in range(5):
        outcomes_record.enqueue(f"healthy {n}")

    stats = run_burst(concurrency=2)

    assert Effect.objects.count() == 5
    assert not Job.objects.exists()
    dead = DeadLetter.objects.get()
    assert (dead.job_id, dead.attempts) == (refused.pk, 1)
    assert dead.reason == (
        "outcome could not be recorded: RaiseException: refused by a test trigger …"
    )
    assert dead.last_error.startswith("the retry could not be recorded: RaiseException")
    assert "RuntimeError: refused broke" in dead.last_error
    assert (stats.outcome_counts.succeeded, stats.outcome_counts.dead_lettered) == (5, 1)


def test_a_dead_letter_the_database_refuses_is_given_up_and_the_worker_goes_on(refuse, caplog):
    refuse("outcomes_refuse_dead", "BEFORE INSERT ON jobq_dead_letter")
    refused = outcomes_flaky.using(max_attempts=1, visibility_timeout=1).enqueue("refused")
    for n in range(5):
        outcomes_record.enqueue(f"healthy {n}")
    worker = Worker(burst=True, poll_interval=0.05, concurrency=2)
    finished = []
    thread = threading.Thread(target=lambda: finished.append(worker.run()))
    thread.start()
    try:
        wait_until(
            lambda: "its dead letter could not be recorded either" in caplog.text,
            what="the worker giving the outcome up",
        )
        # The others are recorded meanwhile: only the refused job is left.
        wait_until(lambda: Job.objects.count() == 1, what="the healthy jobs' acks")
        assert Effect.objects.count() == 5
        left = Job.objects.get()
        assert (left.pk, left.status) == (refused.pk, "running")  # its lease lapses
        assert not DeadLetter.objects.exists()
        with connection.cursor() as cursor:  # the database accepts dead letters again
            cursor.execute("DROP FUNCTION outcomes_refuse_dead() CASCADE")
    finally:
        thread.join(timeout=30)
    assert not thread.is_alive()
    # The burst worker waited for the lapsed lease, reclaimed it past the last attempt and
    # dead-lettered it: nothing left running, nothing lost.
    (stats,) = finished
    assert stats.outcome_counts.succeeded == 5
    dead = DeadLetter.objects.get()
    assert (dead.job_id, dead.reason) == (
        refused.pk,
        DeadLetter.Reason.LEASE_EXPIRED_ON_FINAL_ATTEMPT,
    )
    assert not Job.objects.exists()


def test_a_task_result_the_database_refuses_fails_that_task_only(refuse):
    refuse(
        "outcomes_refuse_success",
        "BEFORE UPDATE ON jobq_task_result",
        when="WHEN (NEW.status = 'SUCCESSFUL')",
        label="args->>0",
    )
    refused = tasks.outcomes_echo.enqueue("refused")
    fine = [tasks.outcomes_echo.enqueue(f"value {n}") for n in range(5)]

    stats = run_burst(concurrency=3)

    for result in fine:
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
    refused.refresh()
    assert refused.status == TaskResultStatus.FAILED
    dead = DeadLetter.objects.get()
    assert dead.reason.startswith("outcome could not be recorded: RaiseException: refused")
    assert not Job.objects.exists()
    assert (stats.outcome_counts.succeeded, stats.outcome_counts.dead_lettered) == (5, 1)


# -- async handlers (tests/test_async_jobs.py runs them) ---------------------------------


async def _async_generator(label: str):
    yield label


def test_a_handler_that_returns_a_coroutine_is_dead_lettered_never_acked():
    outcomes_returns_coroutine.enqueue("never")
    stats = run_burst()
    dead = DeadLetter.objects.get()
    assert dead.reason.startswith("failed: the handler returned coroutine, an awaitable")
    assert not Effect.objects.exists()
    assert stats.outcome_counts.succeeded == 0


def test_the_task_backend_refuses_an_async_generator_task_function():
    with pytest.raises(InvalidTask, match="async generator"):
        tasks.task(_async_generator)


# -- log lines of a worker process ---------------------------------------------------------


def _worker_lines(manage, **env):
    """Run a worker process over two 600-character failures, a job failing three times and
    20 healthy jobs; return its stderr lines once they are all recorded (it is still up)."""
    for n in range(20):
        outcomes_record.enqueue(f"healthy {n}")
    bad = outcomes_fail_long.enqueue(size=600)
    outcomes_raise_long.enqueue(size=600)
    flaky = outcomes_flaky.enqueue("flaky")
    worker = manage("jobq_worker", "--queue", "outcomes", "--poll-interval", "0.1", **env)
    wait_until(
        lambda: DeadLetter.objects.count() == 3 and Effect.objects.count() == 20,
        what="every job to be recorded",
    )
    assert worker.poll() is None  # still up
    worker.send_signal(signal.SIGTERM)
    _, stderr = worker.communicate(timeout=60)
    assert worker.returncode == 0, stderr
    dead = DeadLetter.objects.get(job_id=bad.pk)
    assert dead.reason.startswith("failed: xxx")
    assert dead.reason.endswith(f"… [{len('failed: ') + 600 - 477} more characters]")
    assert dead.last_error == "Fail: " + "x" * 600
    return bad, flaky, stderr.splitlines()


def _check_lines(lines, bad, flaky):
    warnings = [line for line in lines if " WARNING " in line]
    errors = [line for line in lines if " ERROR " in line]
    assert len(warnings) == 2, lines
    for attempt, line in enumerate(warnings, start=1):
        assert re.search(
            rf"job {flaky.pk} tests\.testapp\.jobs\.outcomes_flaky attempt {attempt}/3 failed: "
            r"RuntimeError: flaky broke …; next run in 0 s$",
            line,
        ), line
    assert len(errors) == 3, lines
    assert any(
        f"job {bad.pk} tests.testapp.jobs.outcomes_fail_long attempt 1/{bad.max_attempts} "
        f"dead-lettered: "
        f"failed: xxx"
        in line
        and "more characters]" in line
        for line in errors
    ), errors
    assert any(
        f"job {flaky.pk} tests.testapp.jobs.outcomes_flaky attempt 3/3 dead-lettered: "
        f"max attempts exceeded (last error: RuntimeError: flaky broke …)" in line
        for line in errors
    ), errors
    assert not [line for line in lines if "succeeded in" in line]  # DEBUG: not shown at -v 1


@pytest.mark.acceptance
def test_a_worker_process_whose_outcome_write_fails_records_the_others_and_stays_up(manage, refuse):
    refuse("outcomes_refuse_dead", "BEFORE INSERT ON jobq_dead_letter")
    refused = outcomes_flaky.using(max_attempts=1, priority=10).enqueue("refused")  # first
    for n in range(20):
        outcomes_record.enqueue(f"healthy {n}")
    worker = manage("jobq_worker", "--queue", "outcomes", "--poll-interval", "0.1")
    wait_until(
        lambda: Effect.objects.count() == 20 and Job.objects.count() == 1,
        what="the healthy jobs to be recorded",
    )
    assert worker.poll() is None  # still up
    worker.send_signal(signal.SIGTERM)
    _, stderr = worker.communicate(timeout=60)
    assert worker.returncode == 0, stderr
    assert Job.objects.get().pk == refused.pk  # given up: its lease lapses, then it reruns
    (given_up,) = [line for line in stderr.splitlines() if " ERROR " in line]
    assert re.search(
        rf"job {refused.pk} tests\.testapp\.jobs\.outcomes_flaky attempt 1/1: its dead "
        r"letter could not be recorded either \(RaiseException: refused by a test trigger "
        r"…\); giving it up",
        given_up,
    ), given_up


@pytest.mark.acceptance
def test_a_worker_process_logs_each_failed_attempt_and_dead_letter_once(manage):
    bad, flaky, lines = _worker_lines(manage)
    _check_lines(lines, bad, flaky)


@pytest.mark.acceptance
def test_with_a_root_handler_in_logging_each_line_appears_once(manage):
    bad, flaky, lines = _worker_lines(manage, JOBQ_TEST_ROOT_LOGGING="1")
    assert any(line.startswith("root-handler ") for line in lines), lines
    _check_lines(lines, bad, flaky)


def test_the_worker_keeps_the_projects_own_django_jobq_logging(caplog):
    from django.core.management import call_command

    jobq = logging.getLogger("django_jobq")
    handler = logging.NullHandler()
    jobq.addHandler(handler)
    try:
        call_command("jobq_worker", "--burst", "--queue", "outcomes", verbosity=2)
        assert jobq.handlers == [handler]
        assert jobq.level == logging.NOTSET and jobq.propagate
    finally:
        jobq.removeHandler(handler)


def test_the_documented_log_lines_have_the_workers_format():
    operations = (REPO_ROOT / "docs" / "operations.md").read_text()
    section = operations.split("### Log lines at default verbosity", 1)[1]
    block = section.split("```\n", 2)[1]
    prefix = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} "
    job = r"job \d+ [\w.]+ attempt \d+/\d+ "
    patterns = [
        rf"{prefix}WARNING django_jobq\.worker: {job}failed: \w+: .+; next run in [\d.]+ s",
        rf"{prefix}ERROR django_jobq\.worker: {job}dead-lettered: .+( \(last error: .+\))?",
    ]
    lines = block.splitlines()
    assert len(lines) == 3
    for line in lines:
        assert any(re.fullmatch(pattern, line) for pattern in patterns), line
