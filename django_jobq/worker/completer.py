"""Applies verdicts: ack successes in one batch, retry or dead-letter the rest.

Every write is made by the outcome recorder (:mod:`django_jobq.outcomes`), fenced by the
job's attempt; a write that matches nothing means the lease was lost (another attempt holds
the job) and is only logged. The jobs of Django tasks are recorded by the same statements,
which also write the task's result (the recorder's hook, :mod:`django_jobq.task_results`).

A write that fails is that job's problem, unless the connection is (see :meth:`Completer.flush`):
the others are recorded, and the job gets a dead letter "outcome could not be recorded: …".
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg

from .. import crash_points, db, outcomes, sql, task_results, text
from ..leases import LeaseBusy
from ..models import DeadLetter
from ..outcomes import Action, Outcome
from .observer import Observer, log_fields, outcome_name

logger = logging.getLogger("django_jobq.worker")

#: How each action reads in the log (the tense of "job 12 ... attempt 1/5 <what>").
_WHAT = {
    Action.ACK: "succeeded",
    Action.ACKED_BY_HANDLER: "succeeded",
    Action.RETRY: "failed",
    Action.DEAD_LETTER: "dead-lettered",
    Action.LEASE_LOST: "rolled back",
}


@dataclass
class OutcomeCounts:
    """How many outcomes of each kind the worker recorded since it started."""

    succeeded: int = 0
    retried: int = 0
    dead_lettered: int = 0
    lease_lost: int = 0


def _problem(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {text.first_line(str(exc))}"


class Completer:
    """Records outcomes on the worker's queue connection.

    Outcomes wait in :attr:`pending` until :meth:`flush` applies them; ``on_applied`` is
    called with each one applied (or found to need no statement, or given up on), and the
    observer records each (metrics, rollups, signals). ``announce`` is handed the task
    results each write finished, once committed (by default read and announced at once;
    see :class:`~django_jobq.task_results.TaskOutcomes`).
    """

    def __init__(
        self,
        on_applied: Callable[[Outcome], None],
        observer: Observer,
        announce: Callable[[Sequence[outcomes.FinishedResult]], None] | None = None,
    ) -> None:
        self._on_applied = on_applied
        self._observer = observer
        self.pending: list[Outcome] = []
        self.outcome_counts = OutcomeCounts()
        self._recorder = outcomes.Recorder(task_results.TaskOutcomes(announce))
        self._let_go: set[int] = set()  # id() of the pending outcomes done with in this flush

    def flush(self, cursor: psycopg.Cursor[Any]) -> None:
        """Apply every pending outcome: the acks in one statement, then each retry and dead
        letter. An outcome whose job's row another transaction has locked (busy, see
        :mod:`django_jobq.leases`) is not written and stays pending for the next call.

        A statement that fails for a reason of the job's data (``psycopg.DatabaseError``
        other than ``OperationalError``: a value the column refuses, a constraint or a
        trigger raising) costs only that job: a failed batched ack is redone one job at a
        time, and a job whose own write fails gets a dead letter "outcome could not be
        recorded: …" instead. If even that fails, the error is logged and the outcome
        dropped: the job's lease lapses and another attempt runs it.

        Raises:
            psycopg.OperationalError: the connection was lost (or a statement was cancelled,
                see :func:`django_jobq.db.is_connection_fault`). Outcomes not applied yet
                stay pending for the next call; none is lost. An ack whose commit happened
                but whose reply was lost is refused when re-sent (the job is gone) and
                logged as a lost lease.
            psycopg.InterfaceError: a bug of the worker's.
        """
        if not self.pending:
            return
        acks = [outcome for outcome in self.pending if outcome.action is Action.ACK]
        others = [outcome for outcome in self.pending if outcome.action is not Action.ACK]
        try:
            if acks:
                if crash_points.reach is not None:
                    crash_points.reach("after_handler")
                if self._ack(cursor, acks) and crash_points.reach is not None:
                    crash_points.reach("after_ack")
            for outcome in others:
                self._record(cursor, outcome)
        finally:
            self.pending = [o for o in self.pending if id(o) not in self._let_go]
            self._let_go.clear()

    def _ack(self, cursor: psycopg.Cursor[Any], batch: Sequence[Outcome]) -> set[int]:
        """Ack ``batch`` in one statement; return the ids acked. If the statement fails for
        one job's data, record the jobs one at a time instead."""
        try:
            acked = self._recorder.ack(cursor, batch)
        except psycopg.DatabaseError as exc:
            if db.is_connection_fault(exc):
                raise
            logger.warning(
                "ack of %s job(s) in one statement failed (%s); recording them one by one",
                len(batch),
                _problem(exc),
            )
            for outcome in batch:
                self._record(cursor, outcome)
            return set()
        self._recorder.announce(acked)
        for outcome in batch:
            if outcome.job.id not in acked.busy:  # a busy one stays pending (not lost)
                self._done(outcome, outcome.job.id in acked)
        return acked

    def _record(self, cursor: psycopg.Cursor[Any], outcome: Outcome) -> None:
        """Record one outcome; if its statement fails for its data, its dead letter."""
        try:
            applied = self._write(cursor, outcome)
        except LeaseBusy:
            return  # another transaction holds the job's row: stays pending, not lost
        except psycopg.DatabaseError as exc:
            if db.is_connection_fault(exc):
                raise
            self._record_unrecordable(cursor, outcome, exc)
            return
        self._done(outcome, applied)

    def _record_unrecordable(
        self, cursor: psycopg.Cursor[Any], outcome: Outcome, exc: psycopg.DatabaseError
    ) -> None:
        """Dead-letter a job whose outcome's statement failed with ``exc``; if that fails
        too, log it and give the job up (its lease lapses, another attempt runs it)."""
        job = outcome.job
        problem = _problem(exc)
        logger.warning(
            "job %s %s attempt %s/%s: its outcome (%s) could not be recorded (%s); "
            "dead-lettering it instead",
            job.id,
            job.kind,
            job.attempt,
            job.max_attempts,
            outcome.action.value,
            problem,
        )
        original = f"; its reason: {outcome.reason}" if outcome.reason else ""
        error = f"the {outcome.action.value} could not be recorded: {problem}{original}"
        fallback = dataclasses.replace(
            outcome,
            action=Action.DEAD_LETTER,
            reason=text.reason(f"{DeadLetter.Reason.OUTCOME_NOT_RECORDED}: {problem}"),
            error=text.fit(f"{error}\n{outcome.error}" if outcome.error else error),
        )
        try:
            applied = self._write(cursor, fallback)
        except LeaseBusy:
            return  # the original outcome stays pending and is tried again
        except psycopg.DatabaseError as again:
            if db.is_connection_fault(again):
                raise
            logger.error(
                "job %s %s attempt %s/%s: its dead letter could not be recorded either (%s); "
                "giving it up: its lease will lapse and another attempt will run it",
                job.id,
                job.kind,
                job.attempt,
                job.max_attempts,
                _problem(again),
            )
            self._applied(outcome)
            return
        self._let_go.add(id(outcome))  # recorded as ``fallback``
        self._done(fallback, applied)

    def _write(self, cursor: psycopg.Cursor[Any], outcome: Outcome) -> bool:
        """Record ``outcome`` alone (a retry or dead letter waiting briefly for a table
        lock, see :func:`_waiting_briefly_for_table_locks`); whether the lease still held.

        Raises:
            django_jobq.leases.LeaseBusy: another transaction holds the job's row lock (or
                the table lock outlasted the wait); nothing was written.
        """
        if outcome.action not in (Action.RETRY, Action.DEAD_LETTER):
            recorded = self._recorder.record(cursor, outcome)
        else:
            with _waiting_briefly_for_table_locks(cursor, outcome.job.id):
                recorded = self._recorder.record(cursor, outcome)
        self._recorder.announce(recorded)  # committed: a task's result is final
        return outcome.job.id in recorded

    def _done(self, outcome: Outcome, applied: bool) -> None:
        """Count and log a recorded (or refused) outcome, and let it go."""
        name = outcome_name(outcome, applied)
        if name == "succeeded":
            self.outcome_counts.succeeded += 1
        elif name == "retried":
            self.outcome_counts.retried += 1
        elif name == "dead_lettered":
            self.outcome_counts.dead_lettered += 1
        else:
            self.outcome_counts.lease_lost += 1
        self._log(outcome, name)
        self._observer.record(outcome, name)
        self._applied(outcome)

    def _applied(self, outcome: Outcome) -> None:
        self._let_go.add(id(outcome))
        self._on_applied(outcome)

    def _log(self, outcome: Outcome, name: str) -> None:
        """One line per job, with structured fields (``extra``, see
        :func:`.observer.log_fields`): a failed attempt is a WARNING, a dead letter an
        ERROR, a success DEBUG (docs/operations.md lists them)."""
        job = outcome.job
        fields = log_fields(outcome, name)
        what = _WHAT[outcome.action]
        if name == "lease_lost":
            logger.warning(
                "job %s %s attempt %s: lease lost, outcome (%s) not recorded",
                job.id,
                job.kind,
                job.attempt,
                what,
                extra=fields,
            )
        elif name == "retried":
            logger.warning(
                "job %s %s attempt %s/%s failed: %s; next run in %.3g s",
                job.id,
                job.kind,
                job.attempt,
                job.max_attempts,
                text.first_line(outcome.error),
                outcome.retry_delay,
                extra=fields,
            )
        elif name == "dead_lettered":
            logger.error(
                "job %s %s attempt %s/%s dead-lettered: %s%s",
                job.id,
                job.kind,
                job.attempt,
                job.max_attempts,
                text.first_line(outcome.reason, text.MAX_REASON_LENGTH),
                f" (last error: {text.first_line(outcome.error)})" if outcome.error else "",
                extra=fields,
            )
        else:
            logger.debug(
                "job %s %s attempt %s/%s %s in %.1f ms%s",
                job.id,
                job.kind,
                job.attempt,
                job.max_attempts,
                what,
                outcome.duration * 1000,
                " (acked in its transaction)" if outcome.action is Action.ACKED_BY_HANDLER else "",
                extra=fields,
            )


@contextmanager
def _waiting_briefly_for_table_locks(cursor: psycopg.Cursor[Any], job_id: int) -> Iterator[None]:
    """Run one job's retry or dead letter in a transaction that waits at most
    ``sql.outcomes.SET_SHORT_LOCK_TIMEOUT`` for a table lock (a ``CREATE INDEX`` or
    ``LOCK TABLE`` on ``jobq_dead_letter`` or ``jobq_task_result``): the other jobs'
    outcomes and the claims go on meanwhile.

    Raises:
        django_jobq.leases.LeaseBusy: the lock was not granted in time; nothing was written
            (the outcome stays pending and is written again later).
    """
    try:
        with cursor.connection.transaction():
            cursor.execute(sql.outcomes.SET_SHORT_LOCK_TIMEOUT)
            yield
    except psycopg.errors.LockNotAvailable as exc:
        raise LeaseBusy(job_id) from exc
