"""Mistakes fail where they are made: an enqueue of a kind this process does not register
raises at the call, a ``@job`` or ``@task`` that workers will not import is a system-check
warning, and a task whose function a worker lacks still ends by the framework's contract.
See docs/deploying.md, "Mistakes that fail where they are made"."""

import re
import signal
import subprocess
import sys
from datetime import UTC, datetime
from typing import Any

import pytest
from django.test.utils import override_settings

from django_jobq import enqueue, enqueue_many
from django_jobq.checks import check_definitions
from django_jobq.exceptions import UnknownKind
from django_jobq.models import DeadLetter, Job, StoredTaskResult
from django_jobq.operations import redrive
from django_jobq.scheduling import ScheduledJob
from django_jobq.task_framework import TaskResultDoesNotExist, TaskResultStatus, task_finished
from django_jobq.task_results import TaskNotRun, fail_unrun
from django_jobq.tasks_backend import JobqBackend
from django_jobq.timetables import Timetable
from tests.conftest import REPO_ROOT, wait_until
from tests.testapp import jobs, tasks, views_jobs
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)

#: The production default (tests/settings.py opts the rest of the suite in).
REFUSE = override_settings(JOBQ={"ENQUEUE_UNREGISTERED_KINDS": False})
RECEIPT = "tests.testapp.jobs.mistakes_send_receipt"


# -- enqueue of a kind unknown here ---------------------------------------------------------


@REFUSE
def test_enqueue_of_a_misspelt_kind_raises_with_the_nearest_kind_and_writes_nothing():
    with pytest.raises(
        UnknownKind, match=r"did you mean 'tests\.testapp\.jobs\.mistakes_send_receipt'\?"
    ) as info:
        enqueue("tests.testapp.jobs.mistakes_send_reciept", {"order_id": 1})
    assert isinstance(info.value, LookupError)
    assert (info.value.kind, info.value.suggestion) == (
        "tests.testapp.jobs.mistakes_send_reciept",
        RECEIPT,
    )
    assert "allow_unregistered=True" in str(info.value)
    assert not Job.objects.exists()


@REFUSE
def test_an_unknown_kind_in_a_batch_refuses_the_whole_batch():
    batch: list[dict[str, Any]] = [
        {"kind": RECEIPT, "payload": {"order_id": 1}},
        {"kind": "billing.jobs.charge"},
    ]
    with pytest.raises(UnknownKind, match=r"'billing\.jobs\.charge'"):
        enqueue_many(batch)
    assert not Job.objects.exists()


@REFUSE
def test_allow_unregistered_enqueues_another_services_kind():
    job = enqueue("billing.jobs.charge", {"invoice": 7}, allow_unregistered=True)
    assert Job.objects.get().kind == job.kind == "billing.jobs.charge"
    (other,) = enqueue_many([{"kind": "billing.jobs.refund", "allow_unregistered": True}])
    assert other.kind == "billing.jobs.refund"
    # The kind was accepted (and its defaults cached) once; the refusal still holds without it.
    with pytest.raises(UnknownKind):
        enqueue("billing.jobs.charge", {"invoice": 8})


def test_the_setting_enqueues_any_kind():
    with override_settings(JOBQ={"ENQUEUE_UNREGISTERED_KINDS": True}):
        enqueue("billing.jobs.charge")
    assert Job.objects.get().kind == "billing.jobs.charge"


@REFUSE
def test_registered_kinds_handlers_and_tasks_enqueue_as_before():
    enqueue(RECEIPT, {"order_id": 1})
    jobs.mistakes_send_receipt.enqueue(order_id=2)
    tasks.add.enqueue(1, 2)
    assert Job.objects.count() == 3


@REFUSE
def test_a_schedule_of_a_kind_unknown_here_still_enqueues_its_ticks():
    """Its kind was warned of by manage.py check (W001); another service may run it."""
    scheduled = ScheduledJob(
        name="billing-nightly",
        kind="billing.jobs.nightly",
        timetable=Timetable("0 3 * * *", "UTC"),
        payload={},
        catch_up=1,
        origin="JOBQ['SCHEDULES']['billing-nightly']",
    )
    enqueue_many([scheduled.prepare(datetime(2026, 1, 1, 3, tzinfo=UTC))])
    assert Job.objects.get().kind == "billing.jobs.nightly"


@REFUSE
def test_redrive_runs_dead_letters_of_kinds_unknown_here():
    """A web process redrives the dead letters of any service's kinds."""
    letter = DeadLetter.objects.create(
        job_id=1,
        queue="default",
        kind="billing.jobs.charge",
        payload={"invoice": 7},
        attempts=1,
        max_attempts=5,
        visibility_timeout="00:00:30",
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
        reason="unknown kind",
    )
    assert redrive([letter.pk]) == 1
    assert Job.objects.get().kind == "billing.jobs.charge"


# -- @job and @task where workers do not look ------------------------------------------------


def warnings_by_id():
    return {warning.id: warning for warning in check_definitions()}


def test_a_job_and_a_task_outside_the_discovered_modules_are_w002_and_w003():
    found = warnings_by_id()
    job_warning, task_warning = found["django_jobq.W002"], found["django_jobq.W003"]
    assert "tests.testapp.views_jobs defines @job handlers that workers do not import" in (
        job_warning.msg
    )
    assert "'tests.testapp.views_jobs.mistakes_misplaced_job'" in job_warning.msg
    assert job_warning.hint == (
        "Move them to tests.testapp.jobs (or import tests.testapp.views_jobs from it)."
    )
    assert "'tests.testapp.views_jobs.mistakes_misplaced_task'" in task_warning.msg
    assert task_warning.hint == (
        "Move them to tests.testapp.tasks (or import tests.testapp.views_jobs from it)."
    )


def test_jobs_and_tasks_of_discovered_modules_and_modules_they_import_are_not_warned_of():
    messages = " ".join(warning.msg for warning in check_definitions())
    for kind in (RECEIPT, "tests.testapp.mistakes_more_jobs.mistakes_imported_by_jobs"):
        assert kind not in messages
    assert "tests.testapp.tasks" not in messages


def test_a_module_imported_before_jobs_py_and_by_it_is_not_warned_of(monkeypatch):
    # models.py (or AppConfig.ready) imported it first: jobs.py's own import of it then ran
    # nothing, yet a worker importing jobs.py has its handlers.
    import sys
    import types

    from django_jobq import registry
    from tests.testapp import jobs as testapp_jobs

    with registry.isolated():
        early = types.ModuleType("tests.testapp.mistakes_early")
        monkeypatch.setitem(sys.modules, early.__name__, early)
        exec(  # noqa: S102 - the module's body, run outside jobs.py's import
            "from django_jobq import job\n\n@job\ndef mistakes_early_job() -> None: ...\n",
            vars(early),
        )
        assert "tests.testapp.mistakes_early" in " ".join(w.msg for w in check_definitions())
        # jobs.py imports it:
        monkeypatch.setattr(testapp_jobs, "mistakes_early", early, raising=False)
        assert "tests.testapp.mistakes_early" not in " ".join(w.msg for w in check_definitions())


def run_manage(*args, **env):
    """``manage.py <args>`` in a fresh process on the test settings; returns it finished."""
    from tests.conftest import subprocess_env

    return subprocess.run(
        [sys.executable, str(REPO_ROOT / "testproject" / "manage.py"), *args],
        env=subprocess_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.acceptance
def test_manage_py_check_warns_of_a_job_and_a_task_defined_in_views():
    misplaced = run_manage("check", JOBQ_TEST_MISPLACED="1")
    assert misplaced.returncode == 0, misplaced.stderr  # warnings do not stop a start
    output = misplaced.stdout + misplaced.stderr
    assert "(django_jobq.W002) tests.testapp.views_jobs defines @job handlers" in output
    assert "(django_jobq.W003) tests.testapp.views_jobs defines @task functions" in output
    assert "HINT: Move them to tests.testapp.jobs" in output

    clean = run_manage("check")
    assert clean.returncode == 0, clean.stderr
    assert "django_jobq.W00" not in clean.stdout + clean.stderr


# -- a task whose function the worker does not have -------------------------------------------


@pytest.mark.acceptance
def test_a_task_the_worker_cannot_import_fails_by_the_frameworks_contract(manage):
    """The task's module is imported here (as a view would), not in the worker nor in a
    fresh process: the worker fails its result, sends task_finished (the receiver in
    tests/testapp/tasks.py records it, in the worker), and get_result elsewhere raises
    TaskResultDoesNotExist."""
    result = views_jobs.mistakes_misplaced_task.enqueue("lost")
    # The worker never claims the task's job (it lacks the kind); after the grace its
    # maintenance sweep dead-letters it.
    worker = manage("jobq_worker", "--poll-interval", "0.05", JOBQ_TEST_UNKNOWN_KIND_GRACE="1")
    try:
        dead = wait_until(DeadLetter.objects.first, what="the unknown kind's dead letter")
        wait_until(lambda: Effect.objects.exists(), what="task_finished in the worker")
    finally:
        worker.send_signal(signal.SIGTERM)
        _, stderr = worker.communicate(timeout=60)
    assert worker.returncode == 0, stderr

    assert dead.reason.startswith("unknown kind: no live worker of queue default has registered")
    result.refresh()  # this process has the task
    assert result.status == TaskResultStatus.FAILED
    (error,) = result.errors
    assert error.exception_class is TaskNotRun
    assert "has registered" in error.traceback
    assert list(Effect.objects.values_list("label", flat=True)) == [f"finished {result.id} FAILED"]

    fresh = run_manage(
        "shell",
        "-c",
        "from django_jobq.task_framework import task_backends\n"
        "try:\n"
        f"    task_backends['default'].get_result({result.id!r})\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc)\n",
    )
    assert fresh.returncode == 0, fresh.stderr
    assert "TaskResultDoesNotExist result " in fresh.stdout
    assert "tests.testapp.views_jobs.mistakes_misplaced_task, which is not defined" in fresh.stdout


def stored_result(task_path, status=TaskResultStatus.READY):
    return StoredTaskResult.objects.create(
        id="r" * 32,
        task_path=task_path,
        backend="default",
        queue="default",
        priority=0,
        status=status,
    )


def test_get_result_of_a_task_not_defined_here_raises_task_result_does_not_exist():
    stored = stored_result("tests.testapp.gone.mistakes_removed")
    with pytest.raises(TaskResultDoesNotExist, match="not defined in this process"):
        tasks.add.get_backend().get_result(stored.id)


@pytest.fixture
def finished():
    """The ``task_finished`` signals sent during the test: ``(sender, task result)``."""
    sent = []

    def receive(sender, task_result, **kwargs):
        sent.append((sender, task_result))

    task_finished.connect(receive)
    yield sent
    task_finished.disconnect(receive)


def unrun_letter(kind, payload, error="no handler is registered for this kind"):
    return DeadLetter(kind=kind, payload=payload, reason="unknown kind", last_error=error)


def test_fail_unrun_fails_the_results_of_dead_lettered_tasks_and_announces_them(
    queue_cursor, finished
):
    """What a sweep that dead-letters unknown kinds calls for their tasks' results."""
    path = "tests.testapp.gone.mistakes_removed"
    stored = stored_result(path)
    letters = [
        unrun_letter(path, {"result_id": stored.id, "args": [], "kwargs": {}}),
        unrun_letter("billing.jobs.charge", {"invoice": 7}),  # a plain job: no result
        unrun_letter("tests.testapp.tasks.add", {"result_id": stored.id}),  # not its task
    ]
    (failed,) = fail_unrun(queue_cursor, letters)
    assert failed.id == stored.id
    stored.refresh_from_db()
    assert stored.status == TaskResultStatus.FAILED
    assert stored.finished_at is not None
    (error,) = stored.errors
    assert error["exception_class_path"] == "django_jobq.task_results.TaskNotRun"
    assert error["traceback"] == "unknown kind: no handler is registered for this kind"

    ((sender, announced),) = finished
    assert issubclass(sender, JobqBackend)
    assert announced.id == stored.id
    assert announced.status == TaskResultStatus.FAILED
    assert announced.task.module_path == path  # a stand-in of the same path
    assert announced.errors[0].exception_class is TaskNotRun

    assert fail_unrun(queue_cursor, letters) == []  # a finished result is left alone
    assert len(finished) == 1


def test_fail_unrun_without_announce_leaves_the_signal_to_the_caller(queue_cursor, finished):
    stored = stored_result("tests.testapp.gone.mistakes_removed")
    letter = unrun_letter(stored.task_path, {"result_id": stored.id})
    with queue_cursor.connection.transaction():
        (failed,) = fail_unrun(queue_cursor, [letter], announce=False)
    assert failed.status == TaskResultStatus.FAILED
    assert finished == []


# -- the docs -----------------------------------------------------------------------------------


@REFUSE
def test_the_deploying_pages_example_enqueues_another_services_kind():
    page = (REPO_ROOT / "docs" / "deploying.md").read_text()
    section = page.split("## Mistakes that fail where they are made", 1)[1].split("\n## ", 1)[0]
    (example,) = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    namespace: dict[str, Any] = {"enqueue": enqueue}
    exec(example, namespace)  # noqa: S102 - the page's own example
    job = Job.objects.get()
    assert (job.kind, job.queue, job.payload) == (
        "billing.jobs.charge",
        "billing",
        {"invoice_id": 7},
    )
    assert namespace["JOBQ"] == {"ENQUEUE_UNREGISTERED_KINDS": True}
