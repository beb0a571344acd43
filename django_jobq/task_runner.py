"""The worker's side of Django tasks: the job handler that runs a task (:class:`TaskRunner`),
and the framework's signals it sends.

The Tasks backend (:mod:`django_jobq.tasks_backend`, the web side) registers a runner for
each task it validates, as the handler of the task's jobs; the worker calls it like any job
handler. Its results are recorded with the job's outcome (:mod:`django_jobq.task_results`).
Imports Django's Tasks framework (:mod:`django_jobq.task_framework`).
"""

from __future__ import annotations

import dataclasses
import decimal
import json
import logging
from datetime import datetime
from typing import Any

from django.dispatch import Signal

from . import task_results, validation
from .context import JobContext
from .exceptions import Fail
from .idempotency import LeaseLost
from .leases import Lease
from .models import StoredTaskResult
from .outcomes import ReturnValue
from .task_framework import (
    BaseTaskBackend,
    InvalidTask,
    InvalidTaskBackend,
    Task,
    TaskBase,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultStatus,
    task_finished,
    task_started,
)

logger = logging.getLogger("django_jobq.tasks")


class TaskRunner(task_results.TaskJobHandler):
    """The job handler of one task: what the worker runs for the task's jobs.

    Called with the job's context and payload, it takes the result the worker marked
    RUNNING at the claim (or, outside a worker, marks it RUNNING itself), sends
    ``task_started``, calls the task function (async ones through ``async_to_sync``) and
    returns its return value as JSON text, which the worker stores with the job's ack.
    """

    def __init__(self, task: Task[..., Any], *, backend: type[BaseTaskBackend]) -> None:
        """``backend``: the class its signals are sent as when the task's own backend is
        not configured (any more)."""
        self.task = task
        self.backend = backend
        # The registry names a handler by module and qualified name: the task's.
        self.__module__ = task.func.__module__
        self.__qualname__ = task.func.__qualname__

    def __call__(
        self,
        context: JobContext,
        result_id: str,
        backend: str,
        args: list[Any],
        kwargs: dict[str, Any],
    ) -> str:
        """Run one attempt; return the JSON text of the task's return value, with the result
        it started (for the worker to announce its end without reading it back).

        Raises:
            LeaseLost: the attempt no longer holds the job (the task is not called).
            Fail: the return value is not JSON (the job dead-letters at once: retrying
                would only repeat the task's effects).
            Exception: whatever the task raises (the worker retries or dead-letters).
        """
        taken = task_results.take_started(Lease(context.job_id, context.attempt))
        if taken is None:
            started = task_results.start_attempt(context.job_id, context.attempt)
        else:
            # Started at the claim; if its lease may have lapsed since, a heartbeat (fenced,
            # refused past the deadline) says whether this attempt still holds the job.
            started, surely_held = taken
            if not surely_held and not context.heartbeat():
                started = None
        if started is None or context.lease_lost:
            raise LeaseLost(f"job {context.job_id} attempt {context.attempt}: lease lost")
        # The job's arguments, which the task gets (the framework copies them, normalised).
        result = self._result(started, backend=backend, args=args, kwargs=kwargs, finished_at=None)
        _send(task_started, result, self.backend)
        if self.task.takes_context:
            value = self.task.call(TaskContext(task_result=result), *args, **kwargs)
        else:
            value = self.task.call(*args, **kwargs)
        found = validation.find_unencodable(value, "return value", encoder=json.JSONEncoder)
        if found:
            path, problem = found
            raise Fail(f"{self.task.module_path}: {path}: {problem}; task results are JSON")
        return _Returned(json.dumps(value, allow_nan=False), started=result, runner=self)

    def finished(self, result: StoredTaskResult) -> None:
        """Send ``task_finished`` for a SUCCESSFUL or FAILED result (once it committed)."""
        _send(task_finished, self.result_of(result), self.backend)

    @classmethod
    def of_missing(cls, task_path: str, *, backend: type[BaseTaskBackend]) -> TaskRunner:
        """The runner of a stand-in for a task not defined in this process (a job
        dead-lettered as "unknown kind"), so its end can be announced: the stand-in has the
        task's module path, and its function raises :class:`TaskNotRun` if called."""
        module, _, name = task_path.rpartition(".")

        def missing(*args: Any, **kwargs: Any) -> Any:
            raise task_results.TaskNotRun(f"{task_path} is not defined in this process")

        missing.__module__, missing.__qualname__, missing.__name__ = module, name, name
        return cls(_MissingTask(func=missing), backend=backend)

    def result_of(self, stored: StoredTaskResult) -> TaskResult[..., Any]:
        """The framework's ``TaskResult`` for a stored result of this task: its ``task``
        is this one as enqueued (queue, priority, backend, run_after) when that is still
        valid."""
        return self._result(
            stored,
            backend=stored.backend,
            args=stored.args,
            kwargs=stored.kwargs,
            finished_at=stored.finished_at,
        )

    def _result(
        self,
        columns: StoredTaskResult | task_results.StartedResult,
        *,
        backend: str,
        args: list[Any],
        kwargs: dict[str, Any],
        finished_at: datetime | None,
    ) -> TaskResult[..., Any]:
        """The ``TaskResult`` of a stored result's ``columns`` (all of them, or those a
        start returns) and the others given."""
        result: TaskResult[..., Any] = TaskResult(
            task=_as_enqueued(self.task, columns, backend),
            id=columns.id,
            status=TaskResultStatus(columns.status),
            enqueued_at=columns.enqueued_at,
            started_at=columns.started_at,
            finished_at=finished_at,
            last_attempted_at=columns.last_attempted_at,
            args=args,
            kwargs=kwargs,
            backend=backend,
            errors=[TaskError(**error) for error in columns.errors],
            worker_ids=list(columns.worker_ids),
        )
        object.__setattr__(result, "_return_value", columns.return_value)
        return result


class _Returned(ReturnValue):
    """What :meth:`TaskRunner.__call__` returns: the return value's JSON text, which the ack
    stores, with the result the attempt started (``started``), from which the finished
    result is made when the ack has committed (:meth:`announce`)."""

    def __new__(cls, text: str, *, started: TaskResult[..., Any], runner: TaskRunner) -> _Returned:
        returned = super().__new__(cls, text)
        returned.started, returned.runner = started, runner
        return returned

    started: TaskResult[..., Any]
    runner: TaskRunner

    def announce(self, finished_at: datetime) -> None:
        """Send ``task_finished`` for the started result made SUCCESSFUL at ``finished_at``
        with this return value: the row the ack wrote (no other statement writes a result
        while its attempt holds the job, see ``sql.outcomes.ACK_JOBS_WITH_RESULTS``). The
        return value is read from this JSON text as the ORM reads it back from the
        ``jsonb`` column (:func:`_jsonb_number`)."""
        finished = _copy(self.started)
        object.__setattr__(finished, "status", TaskResultStatus.SUCCESSFUL)
        object.__setattr__(finished, "finished_at", finished_at)
        value = json.loads(self, parse_float=_jsonb_number)
        object.__setattr__(finished, "_return_value", value)
        _send(task_finished, finished, self.runner.backend)

    def __reduce__(self) -> tuple[type[str], tuple[str]]:
        """Copied or pickled (a test keeping ``run_jobs``' results), it is the plain JSON
        text: the started result and its runner stay with the worker."""
        return str, (str(self),)


def _jsonb_number(token: str) -> float | int:
    """A JSON number with a fraction or an exponent as ``jsonb`` gives it back: ``jsonb``
    keeps the number's decimal digits and prints it without an exponent, so one with no
    digits after the point once its exponent is applied comes back as an integer (``1e+16``,
    as Python writes every float of 1e16 or more, as ``10000000000000000``), any other as a
    float (``1.0``, ``1e-07``)."""
    number = decimal.Decimal(token)
    exponent = number.as_tuple().exponent
    return int(number) if isinstance(exponent, int) and exponent >= 0 else float(token)


def _copy(result: TaskResult[..., Any]) -> TaskResult[..., Any]:
    """A copy of ``result``, field by field (the framework's ``TaskResult`` is a frozen
    dataclass): a third of the cost of ``dataclasses.replace``, which runs ``__init__``
    (1.6 against 5.7 microseconds, ``timeit`` on the benchmark host)."""
    copied = object.__new__(TaskResult)
    for name in _TASK_RESULT_FIELDS:
        object.__setattr__(copied, name, getattr(result, name))
    return copied


#: The fields of the framework's ``TaskResult``, ``_return_value`` included.
_TASK_RESULT_FIELDS = tuple(field.name for field in dataclasses.fields(TaskResult))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _MissingTask(TaskBase):
    """A stand-in for a task whose function this process does not have: neither validated
    nor registered (it must not become a handler), only announced."""

    def __post_init__(self) -> None:
        pass


def _as_enqueued(
    task: Task[..., Any], columns: StoredTaskResult | task_results.StartedResult, backend: str
) -> Task[..., Any]:
    """``task`` with the queue, priority, ``backend`` and run_after it was enqueued with;
    the task as defined if those are no longer valid (settings changed since)."""
    if (task.queue_name, task.priority, task.backend, task.run_after) == (
        columns.queue,
        columns.priority,
        backend,
        columns.run_after,
    ):
        return task
    try:
        return task.using(
            queue_name=columns.queue,
            priority=columns.priority,
            backend=backend,
            run_after=columns.run_after,
        )
    except (InvalidTask, InvalidTaskBackend):
        return task


def _send(signal: Signal, result: TaskResult[..., Any], backend: type[BaseTaskBackend]) -> None:
    """Send a framework signal from the worker, as the task's backend class. Receivers are
    user code: their errors are logged, never allowed to derail the worker."""
    try:
        sender: type[BaseTaskBackend] = type(result.task.get_backend())
    except InvalidTaskBackend:
        sender = backend
    for receiver, response in signal.send_robust(sender, task_result=result):
        if isinstance(response, Exception):
            logger.error(
                "task %s result %s: signal receiver %r raised %r",
                result.task.module_path,
                result.id,
                receiver,
                response,
                exc_info=response,
            )


__all__ = ["TaskRunner"]
