"""Applies outcomes: ack successes in one batch, retry or dead-letter failures.

Every write is fenced by the job's attempt (see :mod:`django_jobq.leases`); a write that
matches nothing means the lease was lost (another attempt holds the job) and is only logged.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from .. import leases
from ..models import DeadLetter
from .executor import Outcome, Result

logger = logging.getLogger("django_jobq.worker")


@dataclass
class Tally:
    """Counts of applied outcomes since the worker started."""

    succeeded: int = 0
    retried: int = 0
    dead_lettered: int = 0
    lease_lost: int = 0


class Completer:
    """Records outcomes on the worker's own connection. Failed attempts are retried
    ``retry_delay`` seconds later until the job's ``max_attempts``, then dead-lettered."""

    def __init__(self, cursor: leases.Cursor, *, retry_delay: float) -> None:
        self._cursor = cursor
        self._retry_delay = retry_delay
        self.tally = Tally()

    def complete(self, outcomes: Sequence[Outcome]) -> None:
        succeeded = [o for o in outcomes if o.result is Result.SUCCEEDED]
        acked = leases.ack_many(self._cursor, [o.job.lease for o in succeeded])
        for outcome in succeeded:
            self._log(outcome, "succeeded", applied=outcome.job.id in acked)
            self.tally.succeeded += outcome.job.id in acked
        for outcome in outcomes:
            if outcome.result is Result.UNKNOWN_KIND:
                self._dead_letter(outcome, DeadLetter.Reason.UNKNOWN_KIND)
            elif outcome.result is Result.ATTEMPTS_EXHAUSTED:
                self._dead_letter(outcome, DeadLetter.Reason.LEASE_EXPIRED_ON_FINAL_ATTEMPT)
            elif outcome.result is Result.FAILED:
                if outcome.job.is_final_attempt:
                    self._dead_letter(outcome, DeadLetter.Reason.MAX_ATTEMPTS_EXCEEDED)
                else:
                    applied = leases.retry(
                        self._cursor,
                        *outcome.job.lease,
                        delay=self._retry_delay,
                        error=outcome.error,
                    )
                    self._log(outcome, f"failed, retry in {self._retry_delay:g} s", applied)
                    self.tally.retried += applied

    def _dead_letter(self, outcome: Outcome, reason: str) -> None:
        applied = leases.dead_letter(
            self._cursor,
            *outcome.job.lease,
            reason=reason,
            error=outcome.error,
            traceback=outcome.traceback,
        )
        self._log(outcome, f"dead-lettered ({reason})", applied)
        self.tally.dead_lettered += applied

    def _log(self, outcome: Outcome, what: str, applied: bool) -> None:
        job = outcome.job
        if not applied:
            self.tally.lease_lost += 1
            logger.warning(
                "job %s %s attempt %s: lease lost, outcome (%s) not recorded",
                job.id,
                job.kind,
                job.attempt,
                what,
            )
            return
        logger.debug(
            "job %s %s attempt %s/%s %s in %.1f ms%s",
            job.id,
            job.kind,
            job.attempt,
            job.max_attempts,
            what,
            outcome.duration * 1000,
            f": {outcome.error}" if outcome.error else "",
        )
