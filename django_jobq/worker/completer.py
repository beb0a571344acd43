"""Applies verdicts: ack successes in one batch, retry or dead-letter the rest.

Every write is fenced by the job's attempt (see :mod:`django_jobq.leases`); a write that
matches nothing means the lease was lost (another attempt holds the job) and is only logged.
The jobs of Django tasks are recorded by :func:`django_jobq.task_results.complete` (their
statements also write the task's result); this module logs and counts them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .. import faults, leases, task_results
from .executor import Action, Outcome
from .observer import Observer, log_fields, outcome_name

logger = logging.getLogger("django_jobq.worker")


@dataclass
class Tally:
    """Counts of applied outcomes since the worker started."""

    succeeded: int = 0
    retried: int = 0
    dead_lettered: int = 0
    lease_lost: int = 0


class Completer:
    """Records outcomes on the worker's queue connection.

    Outcomes wait in :attr:`pending` until :meth:`flush` applies them; ``on_applied`` is
    called with each one applied (or found to need no statement), and the observer records
    each (metrics, rollups, signals).
    """

    def __init__(self, on_applied: Callable[[Outcome], None], observer: Observer) -> None:
        self._on_applied = on_applied
        self._observer = observer
        self.pending: list[Outcome] = []
        self.tally = Tally()

    def flush(self, cursor: leases.Cursor) -> None:
        """Apply every pending outcome: all acks in one statement, then each retry and dead
        letter. An outcome whose job's row another transaction has locked (busy, see
        :mod:`django_jobq.leases`) is not written and stays pending for the next call.

        Raises:
            psycopg.Error: a statement failed (e.g. the connection was lost). Outcomes not
                applied yet stay pending for the next call; none is lost. An ack whose commit
                happened but whose reply was lost is refused when re-sent (the job is gone)
                and logged as a lost lease.
        """
        if not self.pending:
            return
        others = self._complete_tasks(cursor)  # a task whose job's row is locked stays pending
        succeeded = [o for o in others if o.action is Action.ACK]
        if succeeded:
            faults.reached("after_handler")
            acked = leases.ack_many(cursor, [o.job.lease for o in succeeded])
            if acked:
                faults.reached("after_ack")
            # A job whose row another transaction holds stays pending (busy, not lost).
            succeeded = [o for o in succeeded if o.job.id not in acked.busy]
            for outcome in succeeded:
                applied = outcome.job.id in acked
                self._log(outcome, "succeeded", "", applied=applied)
                self.tally.succeeded += applied
            self._applied(succeeded)
        for outcome in [o for o in others if o.action is not Action.ACK]:
            try:
                self._apply_one(cursor, outcome)
            except leases.LeaseBusy:
                continue  # stays pending for the next flush
            self._applied([outcome])

    def _applied(self, outcomes: Sequence[Outcome]) -> None:
        done = {id(outcome) for outcome in outcomes}
        self.pending = [o for o in self.pending if id(o) not in done]
        for outcome in outcomes:
            self._on_applied(outcome)

    def _apply_one(self, cursor: leases.Cursor, outcome: Outcome) -> None:
        if outcome.action is Action.RETRY:
            applied = leases.retry(
                cursor, *outcome.job.lease, delay=outcome.retry_delay, error=outcome.error
            )
            self._log(outcome, "failed", f", retrying in {outcome.retry_delay:.3g} s", applied)
            self.tally.retried += applied
        elif outcome.action is Action.ACKED_BY_HANDLER:
            self._log(outcome, "succeeded", " (acked in its transaction)", applied=True)
            self.tally.succeeded += 1
        elif outcome.action is Action.LEASE_LOST:
            self._log(outcome, "rolled back", "", applied=False)
        elif outcome.action is Action.DEAD_LETTER:
            applied = leases.dead_letter(
                cursor,
                *outcome.job.lease,
                reason=outcome.reason,
                error=outcome.error,
                traceback=outcome.traceback,
                ran=outcome.ran,
            )
            self._log(outcome, "dead-lettered", f" ({outcome.reason})", applied)
            self.tally.dead_lettered += applied

    def _complete_tasks(self, cursor: leases.Cursor) -> list[Outcome]:
        """Record the pending outcomes of Django tasks' jobs (their statements also write the
        task results), leaving the others pending; return the others."""
        others, recorded = task_results.complete(cursor, self.pending)
        for outcome, applied in recorded:
            if outcome.action is Action.ACK:
                self._log(outcome, "succeeded", " (task result stored)", applied)
                self.tally.succeeded += applied
            elif outcome.action is Action.RETRY:
                self._log(
                    outcome, "failed", f", task retrying in {outcome.retry_delay:.3g} s", applied
                )
                self.tally.retried += applied
            else:
                self._log(outcome, "dead-lettered", f" ({outcome.reason}), task failed", applied)
                self.tally.dead_lettered += applied
        self._applied([outcome for outcome, _ in recorded])
        return others

    def _log(self, outcome: Outcome, what: str, detail: str, applied: bool) -> None:
        """One line per job: ``job 12 shop.jobs.x attempt 1/5 succeeded in 3.1 ms``, with
        structured fields (``extra``, see :func:`.observer.log_fields`); then the observer
        records the outcome (metrics, rollup, signal)."""
        job = outcome.job
        name = outcome_name(outcome, applied)
        fields = log_fields(outcome, name)
        if not applied:
            self.tally.lease_lost += 1
            logger.warning(
                "job %s %s attempt %s: lease lost, outcome (%s%s) not recorded",
                job.id,
                job.kind,
                job.attempt,
                what,
                detail,
                extra=fields,
            )
            self._observer.record(outcome, name)
            return
        logger.debug(
            "job %s %s attempt %s/%s %s in %.1f ms%s%s",
            job.id,
            job.kind,
            job.attempt,
            job.max_attempts,
            what,
            outcome.duration * 1000,
            detail,
            f": {outcome.error[:500]}" if outcome.error else "",
            extra=fields,
        )
        self._observer.record(outcome, name)
