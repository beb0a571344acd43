"""A backend for Django's Tasks framework: ``@task`` functions run on django-jobq.

::

    TASKS = {
        "default": {
            "BACKEND": "django_jobq.tasks_backend.JobqBackend",
            "QUEUES": ["default", "emails"],
            "OPTIONS": {"MAX_ATTEMPTS": 3},   # optional; see docs/tasks.md
        }
    }

    @task(queue_name="emails", priority=10, max_attempts=5)   # max_attempts: 6.1+, backport
    def send_receipt(order_id: int) -> str: ...

    with transaction.atomic():
        order = Order.objects.create(...)
        result = send_receipt.enqueue(order.pk)   # TaskResult, status READY, id: result.id
    send_receipt.get_result(result.id).status     # from any process

Each enqueue writes a job (kind: the task's module path) and its result row in the caller's
transaction, as :func:`django_jobq.enqueue` does; ``task_enqueued`` is sent once that commits.
``manage.py jobq_worker`` runs the job with every django-jobq guarantee (leases, heartbeats,
retries with backoff, dead letters, redrive) through the
:class:`~django_jobq.task_runner.TaskRunner` this backend registers for each task; the
result is recorded in the same statements as the job's outcome
(:mod:`django_jobq.task_results`). Works with ``django.tasks`` (Django 6.0+) and with the
``django-tasks`` backport on Django 5.2 (:mod:`django_jobq.task_framework`).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from datetime import timedelta
from typing import Any, ParamSpec, TypeVar

from django.db import transaction
from django.utils.crypto import get_random_string

from . import conf, enqueueing, registry, sql, task_results, validation
from .backoff import BackoffPolicy, ExponentialBackoff, default_backoff
from .decorator import JobDefinition
from .enqueueing import EnqueueOptions
from .models import StoredTaskResult
from .task_framework import (
    BaseTaskBackend,
    InvalidTask,
    InvalidTaskBackend,
    Task,
    TaskBase,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_enqueued,
)
from .task_runner import TaskRunner

P = ParamSpec("P")
R = TypeVar("R")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class JobqTask(TaskBase):
    """The backend's ``task_class``: a ``Task`` with django-jobq's retry options.

    On Django 6.1+ and the backport, ``@task(max_attempts=..., ...)`` sets them; Django 6.0's
    ``@task`` refuses unknown keywords, so there they come from the backend's ``OPTIONS``.
    ``None`` means the backend's ``OPTIONS``, then the ``JOBQ`` setting.

    Attributes:
        max_attempts: attempts before the task's job becomes a dead letter (>= 1).
        visibility_timeout: lease length, seconds or a timedelta (> 0).
        backoff: retry delay policy, ``attempt -> seconds`` (see :mod:`django_jobq.backoff`).
    """

    max_attempts: int | None = None
    visibility_timeout: float | timedelta | None = None
    backoff: BackoffPolicy | None = None


def _option(task: Task[..., Any], name: str) -> Any:
    """A :class:`JobqTask` option of ``task`` (``None`` for a plain ``Task``)."""
    return getattr(task, name, None)


class JobqBackend(BaseTaskBackend):
    """Runs tasks on django-jobq. All four capability flags are true: ``run_after``
    (deferral), async task functions, results from any process, and priorities (kept
    exactly, -100 to 100; higher runs first).

    ``QUEUES`` lists the queue names tasks may use (default ``["default"]``); ``OPTIONS``
    holds task defaults (``MAX_ATTEMPTS``, ``VISIBILITY_TIMEOUT``, ``RETRY_BACKOFF_BASE``,
    ``RETRY_BACKOFF_CAP``; absent keys fall back to ``JOBQ``). Invalid values are reported
    by ``manage.py check`` (``django_jobq.E010``) and raise ``InvalidTaskBackend`` when a
    task is defined or enqueued.
    """

    task_class = JobqTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self._problems = [message for _, message in conf.validate_tasks_backend(alias, params)]

    # -- definition ------------------------------------------------------------------------

    def validate_task(self, task: Task[..., Any]) -> None:
        """The framework's rules, then django-jobq's; registers the task for the worker.

        Raises:
            InvalidTaskBackend: this backend's settings are invalid (``django_jobq.E010``).
            InvalidTask: the framework refuses the task (not module-level, a queue not in
                ``QUEUES``, priority outside -100..100, a naive ``run_after`` with
                ``USE_TZ``...), or an option of :class:`JobqTask` is invalid, or a ``@job``
                already has the task's module path as its kind, or the function is an async
                generator (async functions are supported: the worker runs them with
                ``async_to_sync``).
        """
        if self._problems:
            raise InvalidTaskBackend("; ".join(self._problems) + " (django_jobq.E010)")
        super().validate_task(task)
        if inspect.isasyncgenfunction(task.func):  # the framework would call it, not iterate it
            raise InvalidTask(
                f"{task.module_path} is an async generator function; a task function is a "
                f"plain or async function returning a JSON value."
            )
        try:
            validation.validate_options(
                kind=task.module_path,
                queue=task.queue_name,
                max_attempts=_option(task, "max_attempts"),
                visibility_timeout=_option(task, "visibility_timeout"),
            )
            backoff = _option(task, "backoff")
            if backoff is not None and not callable(backoff):
                raise TypeError(f"backoff must be a callable attempt -> seconds, not {backoff!r}.")
        except (TypeError, ValueError) as exc:
            raise InvalidTask(f"{task.module_path}: {exc}") from None
        _register(task)

    # -- enqueue ---------------------------------------------------------------------------

    def enqueue(
        self, task: Task[P, R], args: list[Any], kwargs: dict[str, Any]
    ) -> TaskResult[P, R]:
        """Write the task's job and its READY result in the caller's transaction; return the
        result. ``task_enqueued`` is sent once that transaction commits (at once outside
        one), never after a rollback.

        Raises:
            TypeError: an argument is not JSON (the message names it: ``args[0]``,
                ``kwargs['user']``), or the arguments do not fit the task function.
            InvalidTask, InvalidTaskBackend: as :meth:`validate_task`.
        """
        self.validate_task(task)
        args, kwargs = list(args), dict(kwargs)
        _check_arguments(task, args, kwargs)
        result_id = get_random_string(32)
        options: EnqueueOptions = {"queue": task.queue_name, "priority": task.priority}
        if task.run_after is not None:
            options["run_at"] = task.run_after
        max_attempts = _option(task, "max_attempts") or self._setting("MAX_ATTEMPTS")
        if max_attempts is not None:
            options["max_attempts"] = max_attempts
        visibility_timeout = _option(task, "visibility_timeout") or self._setting(
            "VISIBILITY_TIMEOUT"
        )
        if visibility_timeout is not None:
            options["visibility_timeout"] = visibility_timeout
        payload = {"result_id": result_id, "backend": self.alias, "args": args, "kwargs": kwargs}
        prepared = enqueueing.prepare_job(task.module_path, payload, **options)
        (job,), commit_alias = enqueueing.insert([prepared], statement=sql.tasks.INSERT_TASK_JOBS)
        result: TaskResult[P, R] = TaskResult(
            task=task,
            id=result_id,
            status=TaskResultStatus.READY,
            enqueued_at=job.created_at if job.pk is not None else None,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=args,
            kwargs=kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )

        def announce() -> None:
            if result.enqueued_at is None:  # the insert was deferred to this commit
                object.__setattr__(result, "enqueued_at", job.created_at)
            task_enqueued.send(type(self), task_result=result)

        transaction.on_commit(announce, using=commit_alias)
        return result

    def _setting(self, key: str) -> Any:
        """``OPTIONS[key]`` of this backend, or ``None``."""
        return self.options.get(key)

    def backoff(self) -> BackoffPolicy:
        """The retry delay policy of tasks without their own: ``OPTIONS``' base and cap,
        each falling back to ``JOBQ``'s."""
        base, cap = self._setting("RETRY_BACKOFF_BASE"), self._setting("RETRY_BACKOFF_CAP")
        if base is None and cap is None:
            return default_backoff()
        jobq = conf.get_settings()
        return ExponentialBackoff(
            base=conf.duration_seconds(base) or jobq.RETRY_BACKOFF_BASE,
            cap=conf.duration_seconds(cap) or jobq.RETRY_BACKOFF_CAP,
        )

    # -- results ---------------------------------------------------------------------------

    def get_result(self, result_id: str) -> TaskResult[..., Any]:
        """The result with this id, as stored now, from any process.

        Raises:
            TaskResultDoesNotExist: no such result (never enqueued, or pruned after
                ``JOBQ['TASK_RESULT_RETENTION']``), or its task is not defined in this
                process (its module is neither imported nor an installed app's ``tasks``
                module: a framework result cannot exist without its task; the message
                says so, and the stored row is kept).
        """
        stored = (
            StoredTaskResult.objects.using(conf.get_settings().DATABASE)
            .filter(pk=result_id)
            .first()
        )
        if stored is None:
            raise TaskResultDoesNotExist(result_id)
        return to_task_result(stored)


def _check_arguments(task: Task[..., Any], args: list[Any], kwargs: dict[str, Any]) -> None:
    """Arguments must be JSON and fit the task function (checked here, not in the worker)."""
    for name, value in (("args", args), ("kwargs", kwargs)):
        found = validation.find_unencodable(value, name, encoder=json.JSONEncoder)
        if found:
            path, problem = found
            raise TypeError(
                f"{task.module_path}: {path}: {problem}. Task arguments are JSON; pass ids "
                f"or plain values instead."
            )
    parameters = list(inspect.signature(task.func).parameters.values())
    signature = inspect.Signature(parameters[1:] if task.takes_context else parameters)
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise TypeError(f"{task.module_path}: {exc}") from None


def _register(task: Task[..., Any]) -> None:
    """Register the task's runner under its module path, unless a variant of the same task
    (``task.using(...)``) came first: the first definition, the decorated one, stays."""
    existing = registry.get(task.module_path)
    if existing is not None:
        if isinstance(existing.func, TaskRunner):
            return
        raise InvalidTask(
            f"{task.module_path} is already registered as a @job handler's kind; a function "
            f"is either a @job or a @task."
        )
    registry.register(
        JobDefinition(
            func=TaskRunner(task, backend=JobqBackend),
            kind=task.module_path,
            takes_context=True,
            backoff=_Backoff(task),
        )
    )


@dataclasses.dataclass(frozen=True)
class _Backoff:
    """A task's retry delay policy, resolved when a retry is due (so settings changes
    apply): the task's own ``backoff``, else its backend's (:meth:`JobqBackend.backoff`)."""

    task: Task[..., Any]

    def __call__(self, attempt: int) -> float:
        policy: BackoffPolicy | None = _option(self.task, "backoff")
        if policy is None:
            backend = self.task.get_backend()
            policy = backend.backoff() if isinstance(backend, JobqBackend) else default_backoff()
        return policy(attempt)


def to_task_result(stored: StoredTaskResult) -> TaskResult[..., Any]:
    """The framework's ``TaskResult`` for a stored result.

    Its ``task`` is the registered task, as enqueued (queue, priority, backend, run_after)
    when that is still valid.

    Raises:
        TaskResultDoesNotExist: the task is not defined in this process, even after
            importing the installed apps' ``tasks`` modules (the framework's
            ``get_result`` contract: a ``TaskResult`` cannot be made without its task).
    """
    runner = task_results.handler(stored.task_path)
    if runner is None:
        task_results.discover()
        runner = task_results.handler(stored.task_path)
    if not isinstance(runner, TaskRunner):
        raise TaskResultDoesNotExist(
            f"result {stored.id} is of task {stored.task_path}, which is not defined in this "
            f"process: define it in an installed app's tasks module, or import its module "
            f"there (manage.py check warns of such tasks: django_jobq.W003)."
        )
    return runner.result_of(stored)


task_results.provide_stand_in(
    lambda task_path: TaskRunner.of_missing(task_path, backend=JobqBackend)
)


__all__ = ["JobqBackend", "JobqTask", "to_task_result"]
