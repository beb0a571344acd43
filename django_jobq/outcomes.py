"""Outcomes: how an attempt ended (:class:`Outcome`), and the one recorder of outcomes for
plain jobs and Django tasks' jobs alike.

An outcome is written by one statement of :mod:`django_jobq.sql.outcomes`: the acks of a
batch together (:func:`ack`), a retry (:func:`retry`) or a dead letter (:func:`dead_letter`)
one job at a time. Each is fenced by the job's lease (``(id, attempt)``, status running) and
skips a row another transaction has locked (reported *busy*, see
:class:`~django_jobq.leases.Written`). A task's job has its result written in the same
statement: the statement takes the task's part (the return value, or the attempt's error)
and returns the results it finished. :class:`Recorder` turns outcomes into these
statements; a :class:`TaskResults` hook supplies the task's part and hears of the finished
results (:mod:`django_jobq.task_results`). :func:`ack_in_transaction` is the ack of
``ctx.atomic()``, in the handler's own transaction.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple, Protocol

import psycopg
from psycopg.rows import kwargs_row

from . import db, sql, text
from .claims import ClaimedJob
from .db import Cursor
from .leases import Lease, LeaseBusy, Written, lease_arrays


class Action(enum.Enum):
    """What the completer must do with a job once its handler ran (or could not run)."""

    ACK = "ack"
    RETRY = "retry"
    DEAD_LETTER = "dead letter"
    ACKED_BY_HANDLER = "acked by handler"  # in its transaction (JobContext.atomic)
    LEASE_LOST = "lease lost"  # the handler's transaction found another attempt in charge


@dataclass(frozen=True)
class Outcome:
    """The verdict on one claimed job. ``duration`` and ``retry_delay`` are in seconds;
    ``reason`` is set for dead letters. ``exception_class_path`` (``module.QualName``) names
    the exception of a failed attempt, ``returned`` is what a successful handler returned
    (kept as the result of a Django task's job, see :mod:`django_jobq.task_results`).
    ``exception`` is the exception itself, for :mod:`django_jobq.testing` to raise in the
    test; the worker records only its text."""

    job: ClaimedJob
    action: Action
    duration: float = 0.0
    retry_delay: float = 0.0
    reason: str = ""
    error: str = ""
    traceback: str = ""
    ran: bool = True  # False: dead-lettered without running this attempt
    exception_class_path: str = ""
    returned: Any = None
    exception: BaseException | None = field(default=None, repr=False, compare=False)


class ReturnValue(str):
    """A task's return value as JSON text, from the runner that called the task, which holds
    the rest of the result the ack finishes (the result its attempt started): given one, an
    ack returns the time it finished the result, not the row (:class:`FinishedResult`), and
    :meth:`announce` sends the finished result's ``task_finished``. A return value given as
    a plain ``str`` has its row returned and read back. Subclassed by
    :mod:`django_jobq.task_runner`."""

    def announce(self, finished_at: datetime) -> None:
        """Send ``task_finished`` for the result, SUCCESSFUL with this value since
        ``finished_at`` (committed). Never raises for a receiver's exception (logged)."""
        raise NotImplementedError


class FinishedResult(NamedTuple):
    """A task result an outcome statement made SUCCESSFUL or FAILED, unread: its job's id and
    the row as the statement returned it, JSON text (``row_to_json``), or, for an ack whose
    return value was a :class:`ReturnValue`, ``None`` with the time the ack finished the
    result (``finished_at``, a timezone-aware ``datetime``) and that ``return_value``.
    Reading the row is a model instance per result, Python work the worker leaves to its
    announcer thread (:func:`django_jobq.task_results.read_and_announce`)."""

    job: int
    json: str | None
    finished_at: datetime | None = None
    return_value: ReturnValue | None = None


class Recorded(Written):
    """A :class:`~django_jobq.leases.Written` of an outcome statement, with the task results
    it finished (:attr:`results`: SUCCESSFUL for an ack, FAILED for a dead letter)."""

    def __init__(
        self,
        applied: Iterable[int] = (),
        busy: Iterable[int] = (),
        results: Iterable[FinishedResult] = (),
    ) -> None:
        super().__init__(applied, busy)
        self.results = tuple(results)


class _Row(NamedTuple):
    """A row of an outcome statement: the job written (or busy) and the result it finished
    (JSON text; or only its finish time, see ``sql.outcomes.ACK_JOBS_WITH_RESULTS``)."""

    job: int
    busy: bool
    task_result: str | None = None
    finished_at: datetime | None = None


def _recorded(
    cursor: psycopg.Cursor[Any],
    statement: str,
    params: dict[str, Any],
    return_values: Mapping[int, ReturnValue] | None = None,
) -> Recorded:
    """Run an outcome statement; ``return_values``: the :class:`ReturnValue` s of its
    acks, by job id, which its rows without the result's JSON finished."""
    known = return_values or {}
    typed = db.kept_cursor(cursor.connection, "outcomes", psycopg.Connection.cursor)
    typed.row_factory = kwargs_row(_Row)
    typed.execute(statement, params)
    rows = typed.fetchall()
    return Recorded(
        (row.job for row in rows if not row.busy),
        (row.job for row in rows if row.busy),
        (
            FinishedResult(row.job, row.task_result)
            if row.task_result is not None
            else FinishedResult(row.job, None, row.finished_at, known.get(row.job))
            for row in rows
            if row.task_result is not None or row.finished_at is not None
        ),
    )


def _once(job_id: int, recorded: Recorded) -> Recorded:
    """``recorded`` of a single-job write, or :class:`LeaseBusy` if its row was locked."""
    if recorded.busy:
        raise LeaseBusy(job_id)
    return recorded


def ack(
    cursor: psycopg.Cursor[Any],
    leases: Sequence[Lease],
    *,
    return_values: Sequence[str | None] | None = None,
) -> Recorded:
    """Delete finished jobs in one statement, without waiting for a locked row; a task's job
    (its ``return_values`` entry, JSON text, not ``None``) has its result made SUCCESSFUL
    with that value in the same statement (``sql.outcomes.ACK_JOBS_WITH_RESULTS``; a batch
    of plain jobs only runs ``sql.outcomes.ACK_JOBS``, which touches no result).

    A return value that is a :class:`ReturnValue` gets its result back as its finish time
    only (``FinishedResult.json`` is ``None``), unless the ack recreated the result (then as
    a plain ``str``'s: the row as JSON text).

    Returns the ids whose lease was still held (acked); ``.busy``: those whose row another
    transaction had locked (not acked; ack them again later); ``.results``: the results
    made SUCCESSFUL.

    Raises:
        psycopg.Error: the statement failed; nothing was written.
    """
    if not leases:
        return Recorded()
    params: dict[str, Any] = {**lease_arrays(leases)}
    if return_values is None or all(value is None for value in return_values):
        return _recorded(cursor, sql.outcomes.ACK_JOBS, params)
    params["return_values"] = list(return_values)
    known: dict[int, ReturnValue] = {}
    read_back: list[int] = []
    for lease, value in zip(leases, return_values, strict=True):
        if isinstance(value, ReturnValue):
            known[lease.job_id] = value
        elif value is not None:
            read_back.append(lease.job_id)
    params["read_back"] = read_back
    return _recorded(cursor, sql.outcomes.ACK_JOBS_WITH_RESULTS, params, known)


def retry(
    cursor: psycopg.Cursor[Any],
    job_id: int,
    attempt: int,
    *,
    delay: float,
    error: str,
    task_error: str | None = None,
) -> Recorded:
    """Make a job ready again ``delay`` seconds from now, recording ``error`` (fitted to
    its column by :func:`django_jobq.text.fit`); a task's job (``task_error``, the
    framework's error record as JSON text) has its result made READY again with that error
    appended, in the same statement (``sql.outcomes.RETRY_JOB_WITH_RESULT``; a plain job's
    retry, ``sql.outcomes.RETRY_JOB``, names no result).

    Returns the id if applied; empty (and nothing changed) if ``attempt`` no longer holds
    the lease.

    Raises:
        LeaseBusy: another transaction holds the job's row lock (nothing changed).
    """
    params = {
        "id": job_id,
        "attempt": attempt,
        "delay_seconds": float(delay),
        "error": text.fit(error),
        "task_error": task_error,
    }
    statement = sql.outcomes.RETRY_JOB if task_error is None else sql.outcomes.RETRY_JOB_WITH_RESULT
    return _once(job_id, _recorded(cursor, statement, params))


def dead_letter(
    cursor: psycopg.Cursor[Any],
    job_id: int,
    attempt: int,
    *,
    reason: str,
    error: str = "",
    traceback: str = "",
    ran: bool = True,
    task_error: str | None = None,
) -> Recorded:
    """Move a job to the dead letters with ``reason``, ``error`` and ``traceback``, each
    fitted to its column (:mod:`django_jobq.text`: a long reason is cut, with a marker);
    a task's job (``task_error``, as for :func:`retry`) has its result made FAILED in the
    same statement (``sql.outcomes.DEAD_LETTER_JOB_WITH_RESULT``; a plain job's,
    ``sql.outcomes.DEAD_LETTER_JOB``, names no result).

    ``ran`` says whether this attempt ran the handler; the dead letter's ``attempts``
    counts only attempts that ran. The copy and the delete are one statement. Returns the
    id if applied (``.results``: the result made FAILED); empty (and nothing moved) if
    ``attempt`` no longer holds the lease.

    Raises:
        LeaseBusy: another transaction holds the job's row lock (nothing moved).
    """
    params = {
        "id": job_id,
        "attempt": attempt,
        "ran": ran,
        "reason": text.reason(reason),
        "error": text.fit(error),
        "traceback": text.fit(traceback),
        "task_error": task_error,
    }
    statement = (
        sql.outcomes.DEAD_LETTER_JOB
        if task_error is None
        else sql.outcomes.DEAD_LETTER_JOB_WITH_RESULT
    )
    return _once(job_id, _recorded(cursor, statement, params))


def ack_in_transaction(cursor: Cursor, job_id: int, attempt: int) -> bool:
    """Delete a finished job; ``False`` if ``attempt`` no longer holds its lease. Unlike
    :func:`ack` it waits for a row lock another transaction holds: it is the ack of
    ``ctx.atomic()``, on Django's cursor in the handler's own transaction
    (``sql.outcomes.ACK_JOB_IN_TRANSACTION``)."""
    cursor.execute(sql.outcomes.ACK_JOB_IN_TRANSACTION, {"id": job_id, "attempt": attempt})
    return bool(cursor.fetchall())


class TaskResults(Protocol):
    """The hook through which :class:`Recorder` writes and announces Django tasks' results
    (implemented by :class:`django_jobq.task_results.TaskOutcomes`)."""

    def part(self, outcome: Outcome) -> str | None:
        """The task's part of ``outcome``'s statement (JSON text): the return value of an
        ack, the error of a retry or dead letter; ``None`` for a plain job's outcome."""
        ...

    def finished(self, results: Sequence[FinishedResult]) -> None:
        """Hear of the results an outcome made SUCCESSFUL or FAILED (committed)."""
        ...


class Recorder:
    """Writes outcomes, a task's result with its job's (its part through ``tasks``, if
    given). Each write is fenced and skips a locked row, as the functions above; see them
    for what is raised. The caller :meth:`announce` s what a write returns once it has
    committed (at once in autocommit).
    """

    def __init__(self, tasks: TaskResults | None = None) -> None:
        self._tasks = tasks

    def _part(self, outcome: Outcome) -> str | None:
        return self._tasks.part(outcome) if self._tasks is not None else None

    def announce(self, recorded: Recorded) -> None:
        """Hand the task results ``recorded`` finished to the hook (committed)."""
        if self._tasks is not None and recorded.results:
            self._tasks.finished(recorded.results)

    def ack(self, cursor: psycopg.Cursor[Any], outcomes: Sequence[Outcome]) -> Recorded:
        """Ack ``outcomes`` (all ``Action.ACK``) in one statement; see :func:`ack`."""
        return ack(
            cursor,
            [outcome.job.lease for outcome in outcomes],
            return_values=[self._part(outcome) for outcome in outcomes],
        )

    def record(self, cursor: psycopg.Cursor[Any], outcome: Outcome) -> Recorded:
        """Run the statement ``outcome`` needs (none for an ack made in the handler's
        transaction or a rolled-back one); the job's id is in the result if the lease
        still held.

        Raises:
            LeaseBusy: another transaction holds the job's row lock; nothing was written.
        """
        job = outcome.job
        if outcome.action is Action.ACKED_BY_HANDLER:
            return Recorded([job.id])
        if outcome.action is Action.LEASE_LOST:
            return Recorded()
        if outcome.action is Action.ACK:
            return _once(job.id, self.ack(cursor, [outcome]))
        if outcome.action is Action.RETRY:
            return retry(
                cursor,
                *job.lease,
                delay=outcome.retry_delay,
                error=outcome.error,
                task_error=self._part(outcome),
            )
        return dead_letter(
            cursor,
            *job.lease,
            reason=outcome.reason,
            error=outcome.error,
            traceback=outcome.traceback,
            ran=outcome.ran,
            task_error=self._part(outcome),
        )
