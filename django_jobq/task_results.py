"""The worker's side of Django tasks: finding them, and recording their results.

A task enqueued through :class:`~django_jobq.tasks_backend.JobqBackend` is a job whose kind
is the task's module path and whose payload is ``{"result_id", "backend", "args",
"kwargs"}``; its result is a :class:`~django_jobq.models.StoredTaskResult` row. The worker
runs it like any other job (leases, heartbeats, retries, dead letters). What differs is
recorded here:

- :func:`claim_and_start` claims and marks the results of the claim's tasks RUNNING in one
  round trip (fenced), for the task runner to take (:func:`take_started`);
  :func:`start_claimed` does the same in a statement of its own, right after a claim;
  :func:`start_attempt` marks one RUNNING as its attempt starts, where no worker claimed it
  (a test's ``run_jobs``); :func:`release` undoes the start of jobs released unrun;
- :class:`TaskOutcomes` is the hook of the outcome recorder (:mod:`django_jobq.outcomes`):
  it gives a task's job's outcome its task part, which the recorder's statement writes in
  the same statement as the ack (SUCCESSFUL, with the return value), the retry (READY
  again, with the attempt's error) or the dead letter (FAILED, with the error), and
  announces the results that finished.

Tasks are found in the registry of job kinds, where the backend registers each task it
validates (a task is validated when it is defined). :func:`discover` imports every installed
app's ``tasks`` module at worker start, so the worker knows the tasks those modules define.
Nothing is ever imported from a name found in the database: a job whose task this worker
does not know is dead-lettered as "unknown kind", its result marked FAILED (a
:class:`TaskNotRun` error) and ``task_finished`` sent for it all the same, with a stand-in
task of the same module path (:func:`announce_finished`, through the stand-in
:mod:`django_jobq.tasks_backend` provides). :func:`fail_unrun` does the
same for jobs that another statement dead-lettered unrun (a maintenance sweep).

This module does not import Django's Tasks framework, so a worker runs on a Django without
it; :mod:`django_jobq.tasks_backend` and :mod:`django_jobq.task_runner` do, and are imported
only when configured. Neither is imported from here.
"""

from __future__ import annotations

import itertools
import json
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple, Protocol

import psycopg
from django.conf import settings
from django.db import connections
from django.utils.module_loading import autodiscover_modules, import_string
from psycopg.pq import TransactionStatus

from . import claims, db, leases, registry, sql, text
from .claims import ClaimedJob
from .conf import get_settings
from .leases import Lease, Written
from .models import StoredTaskResult, stored_task_result_from_json
from .outcomes import Action, FinishedResult, Outcome

#: The ``TASKS`` backend path of django-jobq's backend (:mod:`django_jobq.tasks_backend`).
BACKEND = "django_jobq.tasks_backend.JobqBackend"

logger = logging.getLogger("django_jobq.worker")


class TaskNotRun(Exception):
    """The error a task's result records when its job ended without running the attempt:
    dead-lettered because its task is not registered in the worker ("unknown kind") or the
    lease of its final attempt lapsed (the worker died), or cancelled by an operator
    (``sql.operations.CANCEL_JOBS`` names this class). The error's traceback holds the reason."""


#: How to announce the end of a task this process does not define: a handler of a stand-in
#: task of that module path, provided by :mod:`django_jobq.tasks_backend` when imported.
_stand_in: Callable[[str], TaskJobHandler] | None = None


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
        except ImportError:
            if path.startswith("django_jobq."):
                raise
            continue  # another backend, or a typo the framework itself reports
        if isinstance(backend, type) and any(
            f"{base.__module__}.{base.__qualname__}" == BACKEND for base in backend.__mro__
        ):
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


#: The results the worker marked RUNNING at their jobs' claim (:func:`start_claimed`), by
#: lease, as the JSON text the start returned (read by the runner that takes it, on its
#: handler thread, not by the main loop), with the ``time.monotonic()`` until which the
#: lease surely holds (a third of the job's visibility timeout after the claim: the
#: heartbeater's interval), until the task runner takes them (:func:`take_started`) or the
#: job is released (:func:`release`). Shared by the worker's main loop and its handler
#: threads (a dict's single operations are atomic).
_started: dict[Lease, tuple[str, float]] = {}


class TasksClaim(NamedTuple):
    """What a worker's plain claim took, and which of its tasks it started or left to their
    runners (:func:`claim_and_start`)."""

    #: The claimed jobs, in claim order.
    jobs: list[ClaimedJob]
    #: The leases :func:`start_claimed` passes over: their start was tried with the claim
    #: (started, or refused by the statement's fence or filter), or is left to each task's
    #: runner (:func:`start_attempt`, on its handler thread).
    tried: frozenset[Lease]
    #: The error of the start sent with the claim, if it failed: nothing started, each
    #: task's runner starts its own. A connection fault (:func:`django_jobq.db.is_connection_fault`)
    #: ends the claim there: the worker hands its jobs on, then reconnects.
    start_error: psycopg.Error | None = None
    #: Whether that start found ``jobq_task_result`` locked (a migration's lock, or a long
    #: transaction holding a result row): each task's runner starts its own, and the
    #: caller should leave the start of its next claims' tasks to their runners too, for
    #: :data:`START_APART_AFTER_LOCK` seconds.
    results_locked: bool = False


def claim_and_start(
    cursor: psycopg.Cursor[Any], *, task_kinds: Sequence[str], **claim_arguments: Any
) -> TasksClaim:
    """:func:`django_jobq.claims.claim` (``claim_arguments``) on the worker's connection
    ``cursor``, whose first statement's tasks start in the same round trip: ``BEGIN``, the
    claim's first statement (:func:`django_jobq.claims.send_front`, noting its leases in the
    session), ``COMMIT``, then ``sql.tasks.START_NOTED_TASK_ATTEMPTS`` in a transaction of
    its own. So a claim of tasks costs one round trip, as a claim of plain jobs does, and
    its transactions are those of a claim followed by :func:`start_claimed`: the start never
    holds the claim back. A lock on ``jobq_task_result`` (a migration's) fails the start
    after ``sql.tasks.SET_START_LOCK_TIMEOUT`` (``results_locked``); the claim's tasks are
    then left to their runners, which wait for the lock on their own threads. The note
    lives in the session: only for a connection that keeps session state between
    transactions (PostgreSQL itself, or a pool in session mode).

    If the claim's first statement failed for its data (a lane's refusal, say), nothing
    was leased: the claim is made again as :func:`django_jobq.claims.claim` makes it, and
    its tasks are left to :func:`start_claimed`. If the connection failed after the claim's
    ``COMMIT`` came back, the jobs it leased are returned with the error
    (``start_error``).

    Raises:
        psycopg.Error: the claim failed (see :func:`django_jobq.claims.claim`), or the
            connection did before the claim's ``COMMIT`` came back (the leases it may have
            committed lapse, and are reclaimed).
    """
    connection = cursor.connection
    note = f"{next(_claim_notes)}:"
    start_error: psycopg.Error | None = None
    with connection.cursor() as committing, connection.cursor() as starting:
        try:
            with connection.pipeline():
                connection.execute(sql.transactions.BEGIN)
                read_front = claims.send_front(cursor, note=note, **claim_arguments)
                committing.execute(sql.transactions.COMMIT)
                connection.execute(sql.tasks.SET_START_LOCK_TIMEOUT)
                starting.execute(
                    sql.tasks.START_NOTED_TASK_ATTEMPTS,
                    {"claim_note": note, "kinds": list(task_kinds)},
                )
        except psycopg.Error as exc:
            if committing.statusmessage != "COMMIT":
                # The claim's first statement failed (or the connection did before its
                # commit came back): nothing leased that the worker could know of.
                if connection.info.transaction_status in _OPEN:
                    connection.execute(sql.transactions.ROLLBACK)
                if db.is_connection_fault(exc):
                    raise
                return TasksClaim(claims.claim(cursor, **claim_arguments), frozenset())
            start_error = exc  # the claim committed; its start did not, or its result was lost
        front = read_front()
        if start_error is None:
            _keep_started(front.jobs, starting.fetchall())
    tried = frozenset(job.lease for job in front.jobs)
    if isinstance(start_error, psycopg.errors.LockNotAvailable):
        # Each task's runner starts its own, off the main loop: those the claim's later
        # statements take too.
        jobs = claims.claim(cursor, first_front=front, **claim_arguments)
        return TasksClaim(jobs, frozenset(job.lease for job in jobs), results_locked=True)
    if start_error is not None and db.is_connection_fault(start_error):
        # The worker hands these on, then reconnects: the claim goes no further.
        return TasksClaim(front.jobs, tried, start_error)
    jobs = claims.claim(cursor, first_front=front, **claim_arguments)
    return TasksClaim(jobs, tried, start_error)


#: The transaction states a failed pipeline may leave open on the connection: a statement
#: failed in it, or psycopg failed before its end was sent.
_OPEN = (TransactionStatus.INERROR, TransactionStatus.INTRANS)


#: Seconds for which a worker whose claim found ``jobq_task_result`` locked leaves the
#: start of its claims' tasks to their runners, and its claims name no task result; then a
#: claim tries again, waiting for the lock at most 10 ms (``sql.tasks.SET_START_LOCK_TIMEOUT``).
START_APART_AFTER_LOCK = 10.0


#: Distinct notes for the claims of a process (``claim_and_start``).
_claim_notes = itertools.count(1)


def start_claimed(
    cursor: psycopg.Cursor[Any], jobs: Sequence[ClaimedJob], *, tried: Collection[Lease] = ()
) -> None:
    """Mark RUNNING, in one statement on the worker's connection ``cursor``, the results of
    the claimed ``jobs`` that are tasks' jobs and will run (not poison rows, aborted,
    expired or past their attempts: those are dead-lettered unrun), appending the worker's
    id; keep them for the task runner (:func:`take_started`). Called by the worker right
    after a claim: one statement per claim instead of one per task on its handler thread. A
    no-op (no statement) when no job is a task's but those of ``tried``
    (``TasksClaim.tried``).

    Its commit does not wait for the disk (see ``sql.tasks.START_TASK_ATTEMPTS``): this write
    only informs (status, start time, worker id), and a durable commit per claim would slow
    the claims. Only a crash of the database server can lose it, and then only the last such
    writes; every outcome is written durably.

    Raises:
        psycopg.Error: the statement failed; nothing was written.
    """
    starting = [job.lease for job in jobs if job.lease not in tried and _runs_as_task(job)]
    if starting:
        with cursor.connection.cursor() as plain:
            plain.execute(sql.tasks.START_TASK_ATTEMPTS, leases.lease_arrays(starting))
            _keep_started(jobs, plain.fetchall())


def _runs_as_task(job: ClaimedJob) -> bool:
    """Whether ``job`` is a task's job that the worker will run (the others are
    dead-lettered unrun: poison rows, aborted, expired, past their attempts)."""
    return handler(job.kind) is not None and not (
        job.poison or job.abort_requested or job.expired or job.attempts_exhausted
    )


def _keep_started(jobs: Sequence[ClaimedJob], rows: Sequence[tuple[int, str]]) -> None:
    """Keep for the task runner the results a start statement returned (``rows`` of job id
    and the started columns as JSON text) of the claimed ``jobs`` that will run as tasks,
    unread: reading them is the runner's work, on its handler thread."""
    returned = dict(rows)
    now = time.monotonic()
    for job in jobs:
        task_result = returned.get(job.id)
        if task_result is None or not _runs_as_task(job):
            continue
        surely_held_until = now + job.visibility_timeout.total_seconds() / 3
        _started[job.lease] = (task_result, surely_held_until)


class StartedResult(NamedTuple):
    """What a start returned of a task's result (``sql.tasks.START_TASK_ATTEMPTS``): the
    columns its job does not hold, in the statement's order. Times are timezone-aware
    ``datetime`` s at the session's UTC offset (or ``None``);
    ``errors`` and ``worker_ids`` are lists as stored, ``return_value`` any JSON value. The
    task's path, backend and arguments are in the job's payload."""

    id: str
    status: str
    enqueued_at: datetime | None
    started_at: datetime | None
    last_attempted_at: datetime | None
    run_after: datetime | None
    queue: str
    priority: int
    errors: list[Any]
    worker_ids: list[Any]
    return_value: Any


def _started_from_json(text: str) -> StartedResult:
    """A :class:`StartedResult` from the JSON array a start returned.

    Raises:
        ValueError: the text is not the array a start returns, or a time is not one
            Python holds (``'infinity'``: written by hand); ``RecursionError``: JSON nested
            deeper than Python's recursion limit.
    """
    columns = json.loads(text)
    if not isinstance(columns, list) or len(columns) != len(StartedResult._fields):
        raise ValueError(f"not a started task result: {text[:100]!r}")
    for index in _STARTED_TIMES:
        value = columns[index]
        if value is not None:
            if not isinstance(value, str):
                raise ValueError(f"a task result's time is not a time: {value!r}")
            columns[index] = datetime.fromisoformat(value)
    return StartedResult(*columns)


#: The positions of :class:`StartedResult`'s times.
_STARTED_TIMES = tuple(
    StartedResult._fields.index(name)
    for name in ("enqueued_at", "started_at", "last_attempted_at", "run_after")
)


def take_started(lease: Lease) -> tuple[StartedResult, bool] | None:
    """The result :func:`start_claimed` marked RUNNING for ``lease`` (its columns the
    job does not hold), forgotten here, and whether the lease surely still holds: taken
    within a third of the job's visibility timeout of the claim, before its deadline
    could pass. After that (the job waited long in the prefetch, or the process was
    stopped) another worker may have reclaimed it, and the runner must check the lease
    before calling the task. ``None`` if it started none (the job was not claimed by a
    worker of this process), or if the result holds a value Python cannot read (JSON
    nested deeper than its recursion limit, a time of ``'infinity'``: written by hand):
    its runner then starts the task again, meets the value, and that attempt fails with
    it (:func:`start_attempt`)."""
    taken = _started.pop(lease, None)
    if taken is None:
        return None
    started, surely_held_until = taken
    try:
        result = _started_from_json(started)
    except (RecursionError, ValueError):
        return None
    return result, time.monotonic() < surely_held_until


def _readable(task_result: str) -> StoredTaskResult | None:
    """A result from the JSON text a statement returned (``row_to_json``), or ``None`` if it
    holds a value Python cannot (JSON nested deeper than its recursion limit, a time of
    ``'infinity'``: written by hand)."""
    try:
        return stored_task_result_from_json(task_result)
    except (RecursionError, ValueError):
        return None


def release(cursor: psycopg.Cursor[Any], released: Sequence[Lease]) -> Written:
    """:func:`django_jobq.leases.release`, for a worker whose claims may have started tasks
    (:func:`start_claimed`): their results become READY again in the same statement, without
    the worker id their start appended.

    Returns, and raises, as :func:`django_jobq.leases.release`.
    """
    started = any(lease in _started for lease in released)
    written = leases.release(cursor, released, results=started)
    for lease in released:
        if lease.job_id not in written.busy:
            _started.pop(lease, None)
    return written


def start_attempt(job_id: int, attempt: int) -> StartedResult | None:
    """Mark the result of a task's job RUNNING for attempt ``attempt`` (appending the worker's
    id), on Django's connection to the queue database; return the result's columns the job
    does not hold. For an attempt no worker's claim started (:func:`start_claimed`): a test's
    ``run_jobs``.

    Its commit does not wait for the disk, as :func:`start_claimed`'s. Outside a transaction
    it is one round trip.

    Returns ``None`` (and writes nothing) if that attempt no longer holds the job's lease.

    Raises:
        ValueError, RecursionError: the result holds a value Python cannot (see
            ``sql.tasks.START_TASK_ATTEMPTS``); the attempt fails with it.
    """
    alias = get_settings().DATABASE
    with connections[alias].cursor() as cursor:
        cursor.execute(sql.tasks.START_TASK_ATTEMPTS, {"ids": [job_id], "attempts": [attempt]})
        rows = cursor.fetchall()
    return _started_from_json(rows[0][1]) if rows else None


def is_task_outcome(outcome: Outcome) -> bool:
    """A task's job whose outcome is an ack, retry or dead letter, whose statement writes
    its result too (see :class:`TaskOutcomes`). A dead letter of an unknown kind with a
    task's payload counts too: its result must fail (the statement updates no result if
    there is none of that kind)."""
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
    cursor: psycopg.Cursor[Any], dead_letters: Iterable[DeadLettered], *, announce: bool = True
) -> list[StoredTaskResult]:
    """Make FAILED the results of tasks' jobs that were dead-lettered without running (for
    a sweep that dead-letters jobs of unknown kinds with a statement of its own), with a
    :class:`TaskNotRun` error quoting each dead letter's reason and error, in one statement
    (``sql.tasks.FAIL_UNRUN_TASK_RESULTS``); then, with ``announce``, send ``task_finished`` for
    each (:func:`announce_finished`).

    ``dead_letters`` may hold any dead letters: those whose payload names no result of
    their kind (plain jobs), or whose result is finished already, are left alone. With the
    cursor in autocommit (a worker's connections are) the results are committed before
    they are announced; in a transaction, pass ``announce=False`` and call
    :func:`announce_finished` with the returned results after the commit.

    Returns:
        The results made FAILED (but one holding a value Python cannot, see
        ``sql.tasks.FAIL_UNRUN_TASK_RESULTS``: failed, not announced).

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
    with cursor.connection.cursor() as plain:
        plain.execute(
            sql.tasks.FAIL_UNRUN_TASK_RESULTS,
            {"result_ids": result_ids, "task_paths": task_paths, "task_errors": task_errors},
        )
        rows = plain.fetchall()
    results = [result for (task_result,) in rows if (result := _readable(task_result)) is not None]
    if announce:
        announce_finished(results)
    return results


class TaskOutcomes:
    """The outcome recorder's hook for Django tasks (:class:`django_jobq.outcomes.TaskResults`):
    the task part of a task's job's outcome, and the announcement of finished results.

    ``announce`` is handed the results each outcome finished, once committed, unread: by
    default they are read and announced at once (:func:`read_and_announce`); the worker
    hands them to its announcer thread (:mod:`django_jobq.worker.announcer`)."""

    def __init__(self, announce: Callable[[Sequence[FinishedResult]], None] | None = None):
        self._announce = announce or read_and_announce

    def part(self, outcome: Outcome) -> str | None:
        """The return value (JSON text, as the task runner returns it) of a task's ack, the
        framework's error record (JSON text) of a task's retry or dead letter; ``None`` for
        a plain job's outcome (its statement then writes no result)."""
        if not is_task_outcome(outcome):
            return None
        if outcome.action is Action.ACK:
            # As returned: a ReturnValue (the runner's) spares the ack returning the row.
            returned = outcome.returned
            return returned if isinstance(returned, str) else str(returned)
        return _task_error(outcome)

    def finished(self, results: Sequence[FinishedResult]) -> None:
        """Announce ``results`` (committed: the worker's connection is in autocommit, or the
        statement ran in a transaction that has committed)."""
        self._announce(results)


def read_finished(results: Iterable[FinishedResult]) -> list[StoredTaskResult]:
    """The results outcome statements finished, read from their JSON text (those returned
    without it, see :class:`~django_jobq.outcomes.FinishedResult`, are left out). One Python
    cannot read (a time of ``'infinity'``, JSON nested deeper than its recursion limit:
    written by hand) is logged and left out: its outcome stands, only its ``task_finished``
    is not sent."""
    read = []
    for finished in results:
        if finished.json is None:
            continue
        try:
            read.append(stored_task_result_from_json(finished.json))
        except (RecursionError, ValueError) as exc:
            logger.warning(
                "job %s: the task result its outcome finished cannot be read (%s: %s); its "
                "task_finished signal is not sent",
                finished.job,
                type(exc).__name__,
                text.first_line(str(exc))[:200],
            )
    return read


def read_and_announce(results: Sequence[FinishedResult]) -> None:
    """Send ``task_finished`` for the results outcome statements finished, in order, on the
    caller's thread: :func:`announce_finished` of those :func:`read_finished` reads, and,
    for an ack's result returned without its row, through its return value
    (:meth:`django_jobq.outcomes.ReturnValue.announce`). Never raises for a receiver's
    ``Exception`` or a row Python cannot read (both are logged)."""
    for finished in results:
        value, finished_at = finished.return_value, finished.finished_at
        if finished.json is not None:
            announce_finished(read_finished([finished]))
        elif value is None or finished_at is None:  # a statement's bug: say so, go on
            logger.warning(
                "job %s: its task's result came back with neither its row nor the return "
                "value that would make it; its task_finished signal is not sent",
                finished.job,
            )
        else:
            try:
                value.announce(finished_at)
            except Exception:
                logger.exception("job %s: announcing its task's end failed", finished.job)


def announce_finished(results: Iterable[StoredTaskResult]) -> None:
    """Send the framework's ``task_finished`` for each SUCCESSFUL or FAILED (and committed)
    result: through its task's handler, or, for a task not defined in this process (a job
    dead-lettered as "unknown kind"), with a stand-in task of the same module path (see
    :func:`provide_stand_in`; none without :mod:`django_jobq.tasks_backend`, then its end
    is only logged). Never raises (receivers are user code); a failure is logged."""
    for result in results:
        try:
            task = handler(result.task_path)
            if task is None and _stand_in is not None:
                task = _stand_in(result.task_path)
            if task is None:
                logger.warning(
                    "task %s result %s: its end is not announced: no TASKS backend of "
                    "django_jobq is loaded in this process",
                    result.task_path,
                    result.id,
                )
                continue
            task.finished(result)
        except Exception:
            logger.exception(
                "task %s result %s: announcing its end failed", result.task_path, result.id
            )


def provide_stand_in(make: Callable[[str], TaskJobHandler]) -> None:
    """Set how :func:`announce_finished` announces the end of a task this process does not
    define: ``make(task_path)`` returns the handler of a stand-in task (called by
    :mod:`django_jobq.tasks_backend` when it is imported)."""
    global _stand_in
    _stand_in = make
