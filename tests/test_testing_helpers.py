"""django_jobq.testing: what a project's own tests can do with the jobs they enqueue, inside
an ordinary transaction-wrapped test (docs/testing.md).

run_jobs() runs due jobs in the test's transaction with the worker's claim, handler call and
outcome recording; enqueued_jobs()/assert_enqueued() look without running; eager mode runs
each job at its enqueue; the pytest plugin gives the ``jobq`` fixture and the ``jobq_eager``
marker. The sample modules a user would write are testproject/shop/tests/.
"""

from __future__ import annotations

import asyncio
import copy
import importlib.metadata
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from datetime import date, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from django_jobq import enqueue, job, registry, signals
from django_jobq.context import JobContext
from django_jobq.decorator import JobDefinition
from django_jobq.exceptions import Fail, MaxRuntimeExceeded, UnknownKind
from django_jobq.models import DeadLetter, Job, StoredTaskResult
from django_jobq.task_framework import task_finished
from django_jobq.testing import (
    JobDeadLettered,
    JobqFixture,
    TooManyJobs,
    assert_enqueued,
    eager,
    enqueued_jobs,
    run_jobs,
)
from django_jobq.testing.eager_mode import MAX_DEPTH
from tests.conftest import REPO_ROOT
from tests.testapp import jobs, tasks
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db


def labels() -> list[str]:
    return list(Effect.objects.order_by("id").values_list("label", flat=True))


@pytest.fixture
def chain() -> Iterator[JobDefinition]:
    """A handler that records ``link <n>`` and enqueues link ``n - 1`` (none after 1; with
    ``n`` 0 or less it never ends)."""
    with registry.isolated():

        @job(name="tests.testing.chain")
        def link(n: int) -> None:
            Effect.objects.create(label=f"link {n}")
            if n != 1:
                link.enqueue(n=n - 1)

        yield link


# -- run_jobs: running, in the test's own transaction --------------------------------------


def test_run_jobs_runs_what_the_test_enqueued_and_its_effect_is_visible_in_the_test():
    enqueued = jobs.record.enqueue(label="hello")

    ran = run_jobs()

    assert labels() == ["hello"]
    assert [(r.job_id, r.kind, r.payload, r.attempt, r.outcome) for r in ran] == [
        (enqueued.pk, "tests.testapp.jobs.record", {"label": "hello"}, 1, "succeeded")
    ]
    assert not Job.objects.exists()  # acked, as a worker acks
    assert connection.in_atomic_block  # still the test's transaction


def test_nothing_due_runs_nothing():
    assert run_jobs() == []


def test_jobs_run_in_claim_order_priority_first_then_enqueue_order():
    jobs.record.enqueue(label="first")
    jobs.record.using(priority=5).enqueue(label="urgent")
    jobs.record.enqueue(label="second")

    run_jobs()

    assert labels() == ["urgent", "first", "second"]


def test_jobs_that_handlers_enqueue_run_too_until_none_is_left(chain):
    chain.enqueue(n=3)

    ran = run_jobs()

    assert labels() == ["link 3", "link 2", "link 1"]
    assert [r.payload for r in ran] == [{"n": 3}, {"n": 2}, {"n": 1}]


def test_an_endless_chain_stops_at_max_jobs_with_an_error_naming_the_cap(chain):
    chain.enqueue(n=0)  # enqueues n=-1, -2, ... forever

    with pytest.raises(TooManyJobs, match=r"run_jobs\(max_jobs=5\) made 5 attempts") as info:
        run_jobs(max_jobs=5)

    assert len(info.value.ran) == 5
    assert "tests.testing.chain" in str(info.value)


def test_queues_and_kinds_choose_what_runs_and_the_rest_stays_enqueued():
    jobs.record.enqueue(label="default queue")
    jobs.record.using(queue="other").enqueue(label="other queue")
    jobs.send_reminder.enqueue(label="reminder")

    run_jobs(queues=["other"])
    run_jobs(kinds=[jobs.send_reminder])

    assert labels() == ["other queue", "reminder"]
    assert [j.payload for j in enqueued_jobs()] == [{"label": "default queue"}]


def test_kinds_given_by_an_alias_run_the_jobs_stored_under_every_name_of_the_handler():
    enqueue("renames.hello", {"label": "new"})  # stored under the handler's kind
    enqueue("renames.greet", {"label": "old"})

    ran = run_jobs(kinds=["tests.testapp.jobs.renames_old_greet"])

    assert len(ran) == 2
    assert set(labels()) == {"new renames.greet", "old renames.greet"}


def test_a_kind_this_process_does_not_register_cannot_be_run():
    with pytest.raises(LookupError, match=r"did you mean 'tests\.testapp\.jobs\.record'"):
        run_jobs(kinds=["tests.testapp.jobs.recrod"])


def test_a_delayed_job_waits_unless_include_scheduled():
    jobs.record.using(delay=timedelta(hours=1)).enqueue(label="later")

    assert run_jobs() == []
    assert labels() == []

    run_jobs(include_scheduled=True)
    assert labels() == ["later"]


def test_the_same_signals_are_sent_as_by_a_worker():
    heard: list[tuple[str, int]] = []

    def succeeded(sender: Any, job: Any, **kwargs: Any) -> None:
        heard.append(("succeeded", job.id))

    def started(sender: Any, job: Any, **kwargs: Any) -> None:
        heard.append(("started", job.id))

    signals.job_succeeded.connect(succeeded)
    signals.job_started.connect(started)
    try:
        enqueued = jobs.record.enqueue(label="x")
        run_jobs()
    finally:
        signals.job_succeeded.disconnect(succeeded)
        signals.job_started.disconnect(started)
    assert heard == [("started", enqueued.pk), ("succeeded", enqueued.pk)]


# -- failures: the original exception, recorded as the worker records it -------------------


def test_a_failure_raises_the_handlers_own_exception_after_recording_the_retry():
    enqueued = jobs.always_fails.enqueue(reason="the partner is down")

    with pytest.raises(RuntimeError, match="the partner is down") as info:
        run_jobs()

    (note,) = info.value.__notes__
    assert f"job {enqueued.pk} tests.testapp.jobs.always_fails attempt 1" in note
    assert "recorded as a retry" in note
    retried = Job.objects.get()
    assert (retried.status, retried.attempts) == ("ready", 1)
    assert retried.last_error == "RuntimeError: the partner is down"
    assert retried.run_at > enqueued.run_at  # now + backoff: not due again in this test
    assert run_jobs() == []


def test_without_raise_exceptions_failures_are_reported_and_include_scheduled_drives_retries():
    jobs.always_fails.enqueue(reason="nope")  # max_attempts=2

    first = run_jobs(raise_exceptions=False)
    rest = run_jobs(raise_exceptions=False, include_scheduled=True)

    assert [(r.attempt, r.outcome) for r in first] == [(1, "retried")]
    assert first[0].retry_delay > 0
    assert isinstance(first[0].exception, RuntimeError)
    assert [(r.attempt, r.outcome, r.reason) for r in rest] == [
        (2, "dead_lettered", "max attempts exceeded")
    ]
    dead = DeadLetter.objects.get()
    assert (dead.kind, dead.attempts, dead.last_error) == (
        "tests.testapp.jobs.always_fails",
        2,
        "RuntimeError: nope",
    )
    assert not Job.objects.exists()


def test_a_permanent_failure_is_a_dead_letter_and_raises_its_exception():
    jobs.give_up.enqueue(reason="order was deleted")

    with pytest.raises(Fail, match="order was deleted"):
        run_jobs()

    assert DeadLetter.objects.get().reason == "failed: order was deleted"


def test_a_job_dead_lettered_unrun_is_never_silent():
    enqueue("tests.testapp.jobs.record", {"label": "late"}, expires_at=timezone.now())

    with pytest.raises(JobDeadLettered, match="was dead-lettered: expired"):
        run_jobs()

    assert labels() == []
    assert DeadLetter.objects.get().reason == "expired"


def test_a_handler_whose_sql_fails_leaves_the_test_transaction_usable():
    with registry.isolated():

        @job(name="tests.testing.bad_sql", max_attempts=1)
        def bad_sql() -> None:
            Effect.objects.create(label="rolled back with the failed attempt")
            with connection.cursor() as cursor:
                cursor.execute("SELECT * FROM no_such_table")

        bad_sql.enqueue()
        ran = run_jobs(raise_exceptions=False)

    assert [r.outcome for r in ran] == ["dead_lettered"]
    assert "no_such_table" in ran[0].error
    assert labels() == []  # the attempt's writes went with its savepoint
    assert DeadLetter.objects.count() == 1  # and the test's transaction goes on


# -- context: takes_context and ctx.atomic() in a test -------------------------------------


def test_a_handler_that_takes_a_context_sees_its_attempt():
    enqueued = jobs.inspect_context.enqueue()

    run_jobs()

    assert labels() == [
        f"job {enqueued.pk} attempt 1 tests.testapp.jobs.inspect_context default "
        f"extended=True moved=True lost=False"
    ]


def test_ctx_atomic_completes_the_job_in_a_savepoint_of_the_test_transaction():
    jobs.complete_in_transaction.enqueue(label="invoice")

    ran = run_jobs()

    assert labels() == ["invoice attempt 1"]
    assert [r.outcome for r in ran] == ["succeeded"]
    assert not Job.objects.exists()  # acked inside ctx.atomic()


def test_ctx_atomic_inside_a_transaction_the_handler_opened_is_still_refused():
    jobs.nested_complete.enqueue()

    with pytest.raises(RuntimeError, match=r"ctx.atomic\(\) opens the job's transaction"):
        run_jobs()

    assert labels() == []


# -- async handlers: awaited on the test's thread, on its connection ----------------------


@pytest.fixture
def async_jobs() -> Iterator[dict[str, JobDefinition]]:
    """Async handlers, registered for one test only (a worker of another test must not
    gain async kinds)."""
    with registry.isolated():

        @job(name="tests.testing.async_record")
        async def async_record(label: str) -> str:
            await asyncio.sleep(0)
            await Effect.objects.acreate(label=label)
            return label.upper()

        @job(name="tests.testing.async_fails", max_attempts=2)
        async def async_fails(reason: str) -> None:
            await asyncio.sleep(0)
            raise LookupError(reason)

        @job(name="tests.testing.async_with_context", takes_context=True)
        async def async_with_context(ctx: JobContext, label: str) -> None:
            await ctx.aatomic(Effect.objects.create, label=f"{label} {ctx.attempt}")

        @job(name="tests.testing.async_overruns", max_runtime=0.05)
        async def async_overruns() -> None:
            await asyncio.sleep(3600)
            await Effect.objects.acreate(label="never")

        yield {
            "record": async_record,
            "fails": async_fails,
            "context": async_with_context,
            "overruns": async_overruns,
        }


def test_an_async_handler_runs_in_the_test_and_its_orm_writes_are_the_tests(async_jobs):
    async_jobs["record"].enqueue(label="hello")

    ran = run_jobs()

    assert [(r.outcome, r.returned) for r in ran] == [("succeeded", "HELLO")]
    assert labels() == ["hello"]  # written through the async ORM, in this transaction
    assert not Job.objects.exists()
    assert connection.in_atomic_block


def test_an_async_handlers_failure_raises_its_own_exception_after_recording_the_retry(
    async_jobs,
):
    async_jobs["fails"].enqueue(reason="no such partner")

    with pytest.raises(LookupError, match="no such partner"):
        run_jobs()

    retried = Job.objects.get()
    assert (retried.status, retried.attempts) == ("ready", 1)
    assert retried.last_error == "LookupError: no such partner"


def test_an_async_handler_with_context_commits_its_write_with_the_ack_in_aatomic(async_jobs):
    async_jobs["context"].enqueue(label="paid")

    ran = run_jobs()

    assert [r.outcome for r in ran] == ["succeeded"]
    assert labels() == ["paid 1"]
    assert not Job.objects.exists()


def test_an_async_handler_past_max_runtime_is_cancelled_and_retried(async_jobs):
    async_jobs["overruns"].enqueue()

    (ran,) = run_jobs(raise_exceptions=False)

    assert ran.outcome == "retried"
    assert isinstance(ran.exception, MaxRuntimeExceeded)
    assert labels() == []  # the body after the await never ran


# -- Django tasks on the JobqBackend --------------------------------------------------------


def test_a_task_runs_and_its_result_is_readable_with_get_result():
    finished: list[Any] = []

    def hear(sender: Any, task_result: Any, **kwargs: Any) -> None:
        finished.append(task_result.status.name)

    task_finished.connect(hear)
    try:
        result = tasks.add.enqueue(2, 3)
        ran = run_jobs()
    finally:
        task_finished.disconnect(hear)

    assert [(r.kind, r.returned) for r in ran] == [("tests.testapp.tasks.add", "5")]
    # A test may keep or copy what ran: a task's return value copies as its JSON text.
    copied = copy.deepcopy(ran)[0].returned
    assert (type(copied), copied) == (str, "5")
    fetched = tasks.add.get_result(result.id)
    assert fetched.status.name == "SUCCESSFUL"
    assert fetched.return_value == 5
    assert finished == ["SUCCESSFUL"]


def test_a_failing_task_raises_and_its_result_fails_at_its_last_attempt():
    result = tasks.always_fails.enqueue()

    with pytest.raises(ValueError, match="never works"):
        run_jobs()
    run_jobs(raise_exceptions=False, include_scheduled=True)

    assert StoredTaskResult.objects.get(pk=result.id).status == "FAILED"
    assert tasks.always_fails.get_result(result.id).errors[-1].exception_class_path == (
        "builtins.ValueError"
    )


# -- assertions: what was enqueued, without running it --------------------------------------


def test_enqueued_jobs_lists_the_live_jobs_in_enqueue_order_by_kind_and_queue():
    first = jobs.record.enqueue(label="a")
    jobs.send_reminder.enqueue(label="b")
    third = jobs.record.using(queue="other").enqueue(label="c")

    assert [j.pk for j in enqueued_jobs(jobs.record)] == [first.pk, third.pk]
    assert [j.pk for j in enqueued_jobs("tests.testapp.jobs.record", queue="other")] == [third.pk]
    assert len(enqueued_jobs()) == 3


def test_assert_enqueued_matches_kind_payload_count_queue_and_priority():
    jobs.record.using(priority=3).enqueue(label="a")

    (found,) = assert_enqueued(jobs.record, payload={"label": "a"}, count=1, priority=3)
    assert found.payload == {"label": "a"}
    assert_enqueued("tests.testapp.jobs.record", queue="default")
    assert_enqueued(jobs.send_reminder, count=0)


def test_assert_enqueued_compares_payloads_after_enqueues_json_encoding():
    report = "another.service.report"  # a kind of another service's: no handler here
    enqueue(report, {"on": date(2026, 12, 1), "total": Decimal("9.50")}, allow_unregistered=True)

    on_date = {"on": date(2026, 12, 1), "total": Decimal("9.50")}
    assert_enqueued(report, payload=on_date, allow_unregistered=True)
    assert_enqueued(report, payload={"on": "2026-12-01", "total": "9.50"}, allow_unregistered=True)


def test_a_misspelt_kind_is_refused_so_a_count_of_zero_cannot_pass_by_mistake(settings):
    settings.JOBQ = {**settings.JOBQ, "ENQUEUE_UNREGISTERED_KINDS": False}  # the default
    jobs.record.enqueue(label="a")

    with pytest.raises(UnknownKind, match=re.escape("did you mean 'tests.testapp.jobs.record'")):
        assert_enqueued("tests.testapp.jobs.recrod", count=0)
    with pytest.raises(UnknownKind):
        enqueued_jobs("tests.testapp.jobs.recrod")
    assert enqueued_jobs("another.service.kind", allow_unregistered=True) == []


def test_assert_enqueued_counts_an_aliased_kind_as_its_handler():
    enqueue("renames.hello", {"label": "x"})

    assert_enqueued("tests.testapp.jobs.renames_old_greet", count=1)
    assert_enqueued(jobs.renames_greet, payload={"label": "x"})


def test_a_failed_assertion_says_what_was_expected_and_lists_what_was_enqueued():
    enqueued = jobs.record.enqueue(label="a")

    with pytest.raises(AssertionError) as info:
        assert_enqueued(jobs.record, payload={"label": "b"}, count=1)

    assert str(info.value) == (
        "expected 1 job of kind 'tests.testapp.jobs.record' with payload {'label': 'b'}; "
        "found 0. Enqueued (1):\n"
        f"  job {enqueued.pk} tests.testapp.jobs.record queue='default' priority=0 "
        "status=ready payload={'label': 'a'}"
    )


def test_a_failed_assertion_on_an_empty_queue_says_so():
    with pytest.raises(AssertionError, match=r"at least 1 jobs of kind .*No job is enqueued\."):
        assert_enqueued(jobs.record)


def test_count_zero_fails_when_one_was_enqueued():
    jobs.record.enqueue(label="a")

    with pytest.raises(AssertionError, match=r"expected 0 jobs of kind .*; found 1"):
        assert_enqueued(jobs.record, count=0)


# -- eager mode -----------------------------------------------------------------------------


def test_in_eager_mode_enqueue_writes_the_row_then_runs_it_at_once():
    with eager():
        enqueued = jobs.record.enqueue(label="now")
        assert labels() == ["now"]  # before enqueue() returned

    assert enqueued.pk is not None
    assert not Job.objects.exists()
    jobs.record.enqueue(label="after")  # not eager any more
    assert labels() == ["now"]


def test_eager_jobs_get_the_payload_after_its_json_round_trip():
    received: list[Any] = []
    with registry.isolated():

        @job(name="tests.testing.receive")
        def receive(amount: Any, day: Any) -> None:
            received.append((amount, day))

        with eager():
            receive.enqueue(amount=Decimal("9.50"), day=date(2026, 12, 1))

    assert received == [("9.50", "2026-12-01")]  # strings, as a worker's handler gets them


def test_eager_raises_the_failure_out_of_enqueue_after_recording_it():
    with eager(), pytest.raises(RuntimeError, match="boom"):
        jobs.always_fails.enqueue()

    assert Job.objects.get().attempts == 1  # the retry was recorded


def test_eager_without_raise_exceptions_only_records():
    with eager(raise_exceptions=False):
        jobs.give_up.enqueue(reason="bad order")

    assert DeadLetter.objects.get().reason == "failed: bad order"


def test_eager_runs_a_delayed_job_at_once_too():
    with eager():
        jobs.record.using(delay=3600).enqueue(label="not later")

    assert labels() == ["not later"]


def test_eager_chains_run_nested_and_an_endless_one_stops_at_the_depth_cap(chain):
    with eager():
        chain.enqueue(n=3)
        assert labels() == ["link 3", "link 2", "link 1"]
        with pytest.raises(TooManyJobs, match=f"{MAX_DEPTH} levels deep"):
            chain.enqueue(n=0)


def test_eager_leaves_a_kind_no_handler_here_runs_enqueued():
    with eager():
        enqueue("another.service.kind", {"x": 1}, allow_unregistered=True)

    assert_enqueued("another.service.kind", count=1)


def test_eager_runs_a_job_before_the_callers_transaction_commits_even_if_it_rolls_back():
    """Why eager mode is not the default: the job ran on data the caller then rolled back."""
    with eager():
        try:
            with transaction.atomic():
                jobs.record.enqueue(label="ran for a rolled-back request")
                raise RuntimeError("the view failed after enqueueing")
        except RuntimeError:
            pass

    assert labels() == []  # rolled back: but the job ran, and an email would have been sent
    assert not Job.objects.exists()


def test_eager_is_a_function_decorator():
    @eager()
    def enqueue_it() -> None:
        jobs.record.enqueue(label="decorated")

    enqueue_it()
    assert labels() == ["decorated"]


def test_outside_eager_mode_the_enqueue_hook_is_unset():
    from django_jobq import enqueueing

    assert enqueueing.after_insert is None
    with eager():
        assert enqueueing.after_insert is not None
    assert enqueueing.after_insert is None


@pytest.mark.jobq_eager
def test_the_jobq_eager_marker_runs_jobs_at_their_enqueue():
    jobs.record.enqueue(label="marked")

    assert labels() == ["marked"]


# -- another database for the queue: deferred to the caller's commit -----------------------


@pytest.mark.django_db(databases=["default", "queue"])
def test_a_queue_on_another_database_is_in_the_tests_transaction_too(settings):
    """With the queue in "queue" and the caller's data in "default", enqueue defers the
    insert to default's commit, unless "queue" is in a transaction too: in a test that asks
    for both databases it is (the test's), so the job is written at once, and runs."""
    settings.JOBQ = {**settings.JOBQ, "DATABASE": "queue"}
    with transaction.atomic(using="default"):
        jobs.record.enqueue(label="from default")
    assert [j.payload for j in enqueued_jobs()] == [{"label": "from default"}]

    run_jobs()

    assert labels() == ["from default"]
    assert not Job.objects.using("queue").exists()


@pytest.mark.django_db(transaction=True, databases=["default", "queue"])
def test_in_a_transactional_test_a_deferred_enqueue_happens_at_the_callers_commit(settings):
    settings.JOBQ = {**settings.JOBQ, "DATABASE": "queue"}
    with transaction.atomic(using="default"):
        jobs.record.enqueue(label="at commit")
        assert enqueued_jobs() == []  # deferred: "queue" is in no transaction

    run_jobs()

    assert labels() == ["at commit"]


# -- outside a transaction ------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_in_a_transactional_test_each_write_commits_as_a_worker_would():
    jobs.record.enqueue(label="committed")

    ran = run_jobs()

    assert [r.outcome for r in ran] == ["succeeded"]
    assert not connection.in_atomic_block
    assert labels() == ["committed"]


# -- the pytest plugin ----------------------------------------------------------------------


def test_the_jobq_fixture_gives_the_helpers(jobq):
    assert isinstance(jobq, JobqFixture)
    jobs.record.enqueue(label="via fixture")

    jobq.assert_enqueued(jobs.record, count=1)
    assert [j.kind for j in jobq.enqueued()] == ["tests.testapp.jobs.record"]
    assert [r.outcome for r in jobq.run()] == ["succeeded"]
    assert labels() == ["via fixture"]


def test_the_package_registers_the_plugin_with_a_pytest11_entry_point():
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["pytest11"] == {"django_jobq": "django_jobq.testing.plugin"}


def test_the_plugin_imports_nothing_of_django_and_runs_without_pytest_django(tmp_path):
    """pytest loads the plugin before settings are configured, and in projects without
    pytest-django: its import must not import Django, and a run without pytest-django works."""
    probe = (
        "import sys, django_jobq.testing.plugin, django_jobq.testing; "
        "loaded = sorted(m for m in sys.modules if m == 'django' or m.startswith('django.')); "
        "print(loaded)"
    )
    imported = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert imported.stdout.strip() == "[]"

    (tmp_path / "test_plain.py").write_text("def test_plain():\n    assert True\n")
    installed = importlib.metadata.entry_points(group="pytest11", name="django_jobq")
    plugin = [] if installed else ["-p", "django_jobq.testing.plugin"]  # an older install
    environment = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    environment.pop("DJANGO_SETTINGS_MODULE", None)

    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:django"]

    def pytest(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*command, *plugin, "-c", "/dev/null", *args],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=environment,
        )

    run = pytest("-q", "--strict-markers", str(tmp_path / "test_plain.py"))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout
    assert "@pytest.mark.jobq_eager(raise_exceptions=True" in pytest("--markers").stdout


# -- the docs' examples are the demo's tests ------------------------------------------------


@pytest.mark.parametrize("page", ["testing.md", "quickstart.md"])
def test_the_docs_examples_from_the_demos_tests_are_in_those_tests(page):
    """A block that opens with ``# testproject/...`` quotes that file: it runs in CI."""
    text = (REPO_ROOT / "docs" / page).read_text()
    quoted = re.findall(r"```python\n# (testproject/\S+)\n(.*?)```", text, re.DOTALL)
    assert quoted
    for path, block in quoted:
        assert block in (REPO_ROOT / path).read_text(), f"{page} quotes {path}: not found"
