"""``@task`` functions used by tests/test_tasks.py, written against Django's standard API
(autodiscovered by the worker like any app's ``tasks`` module)."""

from __future__ import annotations

import inspect
import os
import signal
from typing import TYPE_CHECKING, Any

from django.db import connection

from django_jobq.backoff import FixedBackoff

if TYPE_CHECKING:  # django-stubs describe the core module; the backport has the same API.
    from django.tasks import TaskContext
    from django.tasks import task as task  # re-exported: tests call tasks.task(...)
else:
    try:
        from django.tasks import TaskContext, task
    except ImportError:  # Django 5.2: the django-tasks backport
        from django_tasks import TaskContext, task

from .models import Effect

#: Django 6.1+ and the backport pass extra ``@task(...)`` keywords to the backend's task
#: class; Django 6.0's ``@task`` refuses them.
TASK_OPTIONS_SUPPORTED = any(
    parameter.kind is inspect.Parameter.VAR_KEYWORD
    for parameter in inspect.signature(task).parameters.values()
)


@task
def add(a: int, b: int) -> int:
    return a + b


@task
def echo(value: Any) -> Any:
    """Return ``value`` as given (a JSON value)."""
    return value


@task(queue_name="tasks", priority=-100)
def record(label: str) -> dict[str, str]:
    Effect.objects.create(label=label)
    return {"recorded": label}


@task(takes_context=True)
def flaky(context: TaskContext[Any, Any], label: str, failures: int) -> int:
    """Fail the first ``failures`` attempts, then record the attempt and return it."""
    if context.attempt <= failures:
        raise ConnectionError(f"{label}: attempt {context.attempt} failed")
    Effect.objects.create(label=f"{label} attempt {context.attempt}")
    return context.attempt


@task
async def async_double(value: int) -> int:
    return 2 * value


@task
def always_fails() -> None:
    raise ValueError("never works")


@task
def returns_a_set() -> set[int]:
    return {1, 2}


@task(queue_name="crash", takes_context=True)
def crash_once(context: TaskContext[Any, Any], lock_id: int) -> str:
    """Attempt 1 waits for the test's advisory lock (the test kills the worker meanwhile);
    later attempts record and succeed."""
    if context.attempt == 1:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(%s)", [lock_id])
        os.kill(os.getpid(), signal.SIGKILL)  # not reached when the test kills us first
    Effect.objects.create(label=f"crash_once attempt {context.attempt}")
    return f"survived attempt {context.attempt}"


if TASK_OPTIONS_SUPPORTED:
    # django-stubs type Django 6.0's @task, which takes no backend options.
    @task(max_attempts=2, backoff=FixedBackoff(0), visibility_timeout=45)  # type: ignore[call-overload, untyped-decorator]
    def two_attempts(label: str) -> None:
        Effect.objects.create(label=label)
        raise RuntimeError(label)


@task
def outcomes_echo(label: str) -> str:
    return label


if TYPE_CHECKING:
    from django.tasks import TaskResult
    from django.tasks.signals import task_finished
else:
    try:
        from django.tasks.signals import task_finished
    except ImportError:  # Django 5.2: the django-tasks backport
        from django_tasks.signals import task_finished


def mistakes_record_finished(
    sender: object, task_result: TaskResult[Any, Any], **kwargs: object
) -> None:
    """Record, in whichever process sends it, ``task_finished`` for the tasks of
    tests/testapp/views_jobs.py (which workers do not have): ``"finished <id> <status>"``."""
    if task_result.task.module_path.startswith("tests.testapp.views_jobs."):
        Effect.objects.create(label=f"finished {task_result.id} {task_result.status}")


task_finished.connect(mistakes_record_finished, dispatch_uid="mistakes_record_finished")
