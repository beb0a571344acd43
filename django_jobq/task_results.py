"""The worker's side of Django tasks: finding them, and recording their results.

A task enqueued through :class:`~django_jobq.tasks_backend.JobqBackend` is a job whose kind
is the task's module path and whose payload is ``{"result_id", "backend", "args",
"kwargs"}``; its result is a :class:`~django_jobq.models.StoredTaskResult` row. The worker
runs it like any other job (leases, heartbeats, retries, dead letters). What differs is
recorded here:

- :func:`start_attempt` marks the result RUNNING as an attempt starts (fenced);
- :func:`ack` and :func:`record` record the outcomes of tasks' jobs with statements that
  write the result in the same statement as the ack (SUCCESSFUL, with the return value),
  the retry (READY again, with the attempt's error) or the dead letter (FAILED, with the
  error); the worker's completer calls them for the outcomes :func:`is_task_outcome`
  picks and records the others itself.

Tasks are found in the registry of job kinds, where the backend registers each task it
validates (a task is validated when it is defined). :func:`discover` imports every installed
app's ``tasks`` module at worker start, so the worker knows the tasks those modules define.
Nothing is ever imported from a name found in the database: a job whose task this worker
does not know is dead-lettered as "unknown kind", its result marked FAILED (a
:class:`TaskNotRun` error) and ``task_finished`` sent for it all the same, with a stand-in
task of the same module path (:func:`announce_finished`). :func:`fail_unrun` does the
same for jobs that another statement dead-lettered unrun (a maintenance sweep).

This module does not import Django's Tasks framework, so a worker runs on a Django without
it; :mod:`django_jobq.tasks_backend` does, and is imported only when configured.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from django.conf import settings
from django.db import connections
from django.utils.module_loading import autodiscover_modules, import_string

from . import db, leases, registry, sql, text
from .conf import get_settings
from .models import StoredTaskResult
from .worker.executor import Action, Outcome

logger = logging.getLogger("django_jobq.worker")


class TaskNotRun(Exception):
    """The error a task's result records when its job ended without running the attempt:
    dead-lettered because its task is not registered in the worker ("unknown kind") or the
    lease of its final attempt lapsed (the worker died), or cancelled by an operator
    (``sql.operations.CANCEL_JOBS`` names this class). The error's traceback holds the reason."""


class TaskJobHandler:
    """Base of the handler the Tasks backend registers for each task (the ``func`` of its
    :class:`~django_jobq.registry.KindDefinition`): how the worker tells tasks' jobs apart."""

    def finished(self, result: StoredTaskResult) -> None:
        """Called by the worker once ``result`` is SUCCESSFUL or FAILED (committed)."""
        raise NotImplementedError


def jobq_backends() -> dict[str, Any]:
    """The ``TASKS`` entries whose backend is ``JobqBackend`` (or a subclass), by alias.

    Raises:
        ImportError: an entry names a ``django_jobq`` backend that cannot be imported
            (on Django 5.2: the django-tasks backport is not installed).
    """
    found: dict[str, Any] = {}
    for alias, params in (getattr(settings, "TASKS", None) or {}).items():
        path = params.get("BACKEND") if isinstance(params, dict) else None
        if not isinstance(path, str):
            continue
        try:
            backend = import_string(path)  # a setting, written by the project: trusted
            from .tasks_backend import JobqBackend
        except ImportError:
            if path.startswith("django_jobq."):
                raise
            continue  # another backend, or a typo the framework itself reports
        if isinstance(backend, type) and issubclass(backend, JobqBackend):
            found[alias] = params
    return found


def discover() -> None:
    """Import every installed app's ``tasks`` module if a ``TASKS`` backend is a
    ``JobqBackend``, so that their tasks are registered (as ``jobs`` modules are imported
    for ``@job`` handlers). A no-op otherwise.

    Raises:
        ImportError: as :func:`jobq_backends`, or raised by a ``tasks`` module.
    """
    if jobq_backends():
        autodiscover_modules("tasks")


def handler(kind: str) -> TaskJobHandler | None:
    """The task handler registered for ``kind``, or ``None`` (not a task, or unknown)."""
    definition = registry.get(kind)
    func = definition.func if definition is not None else None
    return func if isinstance(func, TaskJobHandler) else None


def start_attempt(job_id: int, attempt: int) -> StoredTaskResult | None:
    """Mark the result of a task's job RUNNING for attempt ``attempt`` (appending the
    worker's id), on Django's connection to the queue database; return the result.

    Its commit does not wait for the disk (see ``sql.START_TASK_ATTEMPT``): a durable commit
    per task would cap each handler thread at a few hundred tasks per second (2-3 ms each,
    FACTS.md), and this write only informs (status, start time, worker id). Only a crash of
    the database server can lose it, and then only the last such writes; every outcome is
    written durably. Outside a transaction (a worker's handler thread is) it is one round trip.

    Returns ``None`` (and writes nothing) if that attempt no longer holds the job's lease.
    """
    alias = get_settings().DATABASE
    with connections[alias].cursor() as cursor:
        cursor.execute(sql.START_TASK_ATTEMPT, {"job_id": job_id, "attempt": attempt})
        names = [column.name for column in cursor.description]
        rows = cursor.fetchall()
    return db.from_rows(StoredTaskResult, alias, names, rows)[0] if rows else None


def is_task_outcome(outcome: Outcome) -> bool:
    """A task's job whose outcome is an ack, retry or dead letter, to record with
    :func:`ack` or :func:`record`. A dead letter of an unknown kind with a task's payload
    counts too: its result must fail (the statement updates no result if there is none of
    that kind)."""
    if outcome.action not in (Action.ACK, Action.RETRY, Action.DEAD_LETTER):
        return False
    if handler(outcome.job.kind) is not None:
        return True
    return (
        outcome.action is Action.DEAD_LETTER
        and registry.get(outcome.job.kind) is None
        and "result_id" in outcome.job.payload
    )


def _task_error(outcome: Outcome) -> str:
    """The framework's error record of a failed attempt, as JSON text."""
    if not outcome.exception_class_path:  # dead-lettered unrun: no exception of the task's own
        return _unrun_error(outcome.reason, outcome.error)
    error = {
        "exception_class_path": outcome.exception_class_path,
        "traceback": text.fit(outcome.traceback),
    }
    return json.dumps(error)


def _unrun_error(reason: str, error: str) -> str:
    """The error record (JSON text) of a task's job that ended without running: a
    :class:`TaskNotRun` whose traceback is the dead letter's reason and error."""
    return json.dumps(
        {
            "exception_class_path": f"{TaskNotRun.__module__}.{TaskNotRun.__qualname__}",
            "traceback": text.fit(f"{reason}: {error}" if error else reason),
        }
    )


class DeadLettered(Protocol):
    """What :func:`fail_unrun` reads of a dead-lettered job (a
    :class:`~django_jobq.models.DeadLetter` has it all)."""

    @property
    def kind(self) -> str: ...
    @property
    def payload(self) -> Any: ...
    @property
    def reason(self) -> str: ...
    @property
    def last_error(self) -> str: ...


def fail_unrun(
    cursor: leases.Cursor, dead_letters: Iterable[DeadLettered], *, announce: bool = True
) -> list[StoredTaskResult]:
    """Make FAILED the results of tasks' jobs that were dead-lettered without running (for
    a sweep that dead-letters jobs of unknown kinds with a statement of its own), with a
    :class:`TaskNotRun` error quoting each dead letter's reason and error, in one statement
    (``sql.FAIL_UNRUN_TASK_RESULTS``); then, with ``announce``, send ``task_finished`` for
    each (:func:`announce_finished`).

    ``dead_letters`` may hold any dead letters: those whose payload names no result of
    their kind (plain jobs), or whose result is finished already, are left alone. With the
    cursor in autocommit (a worker's connections are) the results are committed before
    they are announced; in a transaction, pass ``announce=False`` and call
    :func:`announce_finished` with the returned results after the commit.

    Returns:
        The results made FAILED.

    Raises:
        psycopg.Error: the statement failed; nothing was written.
    """
    unrun = [
        (letter.payload["result_id"], letter.kind, _unrun_error(letter.reason, letter.last_error))
        for letter in dead_letters
        if isinstance(letter.payload, Mapping) and isinstance(letter.payload.get("result_id"), str)
    ]
    if not unrun:
        return []
    result_ids, task_paths, task_errors = (list(column) for column in zip(*unrun, strict=True))
    cursor.execute(
        sql.FAIL_UNRUN_TASK_RESULTS,
        {"result_ids": result_ids, "task_paths": task_paths, "task_errors": task_errors},
    )
    names = [column.name for column in cursor.description]
    results = _results(names, cursor.fetchall())
    if announce:
        announce_finished(results)
    return results


def _results(names: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[StoredTaskResult]:
    """Result rows read on a worker's psycopg connection (jsonb already decoded)."""
    return [StoredTaskResult(**dict(zip(names, row, strict=True))) for row in rows]


def ack(cursor: leases.Cursor, outcomes: Sequence[Outcome]) -> leases.Written:
    """Ack tasks' jobs (outcomes of :func:`is_task_outcome` with action ACK) in one statement
    that also makes their results SUCCESSFUL with their return values; announce each
    finished result to its task handler (which sends the framework's ``task_finished``).
    Fenced and locked like :func:`django_jobq.leases.ack_many`.

    Returns:
        The ids of the jobs acked; ``.busy``: those whose row another transaction had locked
        (nothing written, ack them again later). An id in neither: the lease was lost.

    Raises:
        psycopg.Error: the statement failed; nothing was written for any of ``outcomes``.
    """
    if not outcomes:
        return leases.Written()
    cursor.execute(
        sql.ACK_TASK_JOBS,
        {
            "ids": [outcome.job.id for outcome in outcomes],
            "attempts": [outcome.job.attempt for outcome in outcomes],
            "return_values": [outcome.returned for outcome in outcomes],  # JSON text
        },
    )
    names, rows = _after_busy(cursor)
    busy = {job_id for job_id, is_busy, *_ in rows if is_busy}
    results = _results(names, [row[2:] for row in rows if not row[1]])
    announce_finished(results)
    return leases.Written((result.job_id for result in results if result.job_id is not None), busy)


def record(cursor: leases.Cursor, outcome: Outcome) -> bool:
    """Retry or dead-letter a task's job (an outcome of :func:`is_task_outcome`) with the
    statement that also writes its result (READY again or FAILED, with this attempt's
    error); announce a FAILED result. Each write is fenced and locked like its plain-job
    twin in :mod:`django_jobq.leases`, and its texts fitted as there.

    Returns:
        Whether it applied (``False``: the lease was lost, nothing was written).

    Raises:
        django_jobq.leases.LeaseBusy: another transaction holds the job's row lock (nothing
            was written; record it again later).
        psycopg.Error: the statement failed; nothing was written.
    """
    params: dict[str, Any] = {
        "id": outcome.job.id,
        "attempt": outcome.job.attempt,
        "task_error": _task_error(outcome),
    }
    if outcome.action is Action.RETRY:
        params.update(error=text.fit(outcome.error), delay_seconds=outcome.retry_delay)
        cursor.execute(sql.RETRY_TASK_JOB, params)
        return leases.applied_once(outcome.job.id, cursor.fetchall())
    texts = leases.dead_letter_texts(outcome.reason, outcome.error, outcome.traceback)
    cursor.execute(sql.DEAD_LETTER_TASK_JOB, {**params, **texts, "ran": outcome.ran})
    names, rows = _after_busy(cursor)
    applied = leases.applied_once(outcome.job.id, rows)
    failed = [row[2:] for row in rows if not row[1] and row[2] is not None]
    announce_finished(_results(names, failed))
    return applied


def _after_busy(cursor: leases.Cursor) -> tuple[list[str], list[Any]]:
    """The result columns' names (after the job id and ``busy``) and the rows of a locked
    task statement (see ``sql.ACK_TASK_JOBS``)."""
    names = [column.name for column in cursor.description][2:]
    return names, cursor.fetchall()


def announce_finished(results: Iterable[StoredTaskResult]) -> None:
    """Send the framework's ``task_finished`` for each SUCCESSFUL or FAILED (and committed)
    result: through its task's handler, or, for a task not defined in this process (a job
    dead-lettered as "unknown kind"), with a stand-in task of the same module path (see
    :func:`django_jobq.tasks_backend.missing_task`). Never raises (receivers are user
    code); a failure is logged."""
    for result in results:
        try:
            task = handler(result.task_path)
            if task is None:
                from .tasks_backend import TaskRunner

                task = TaskRunner.of_missing(result.task_path)
            task.finished(result)
        except Exception:
            logger.exception(
                "task %s result %s: announcing its end failed", result.task_path, result.id
            )
