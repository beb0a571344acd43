"""Claim, heartbeat, ack, retry, dead-letter and release: the fenced writes about a job.

Each function takes a cursor (a psycopg 3 cursor or a Django cursor on the queue database)
and runs one statement from :mod:`django_jobq.sql`. A write about a running job is fenced
by ``(job id, attempt)``: if another attempt holds the job now (its lease lapsed and it was
reclaimed) the write matches nothing and the function reports that it did not apply. These
functions never raise for a lost lease; they raise only for database errors.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple, Protocol

from . import sql, text


class Cursor(Protocol):
    """The part of a DB-API cursor these functions use."""

    def execute(self, query: Any, params: Any = ..., /) -> Any: ...
    def fetchall(self) -> list[Any]: ...
    @property
    def description(self) -> Any: ...


class Lease(NamedTuple):
    """A job id with the attempt that holds its lease: the key of every fenced write."""

    job_id: int
    attempt: int


@dataclass(frozen=True)
class ClaimedJob:
    """A job as a worker holds it after a claim.

    ``attempt`` is the attempt this claim started (1 for the first run) and the lease's
    fencing token; ``lease_deadline`` is when the lease lapses unless extended; ``expired``
    is true when the job's ``expires_at`` had passed at the claim (it must not run).
    ``reclaimed`` is true when the claim took the job from a lapsed lease, and
    ``pickup_latency`` is the seconds from when the job became claimable (its
    ``GREATEST(run_at, created_at)``, or for a reclaim its lapsed deadline) to the claim, on
    the database clock (see ``sql.CLAIM_JOBS_*``).
    """

    id: int
    queue: str
    kind: str
    payload: dict[str, Any]
    priority: int
    run_at: datetime
    attempt: int
    max_attempts: int
    visibility_timeout: timedelta
    lease_deadline: datetime
    expired: bool = False
    reclaimed: bool = False
    pickup_latency: float = 0.0

    @property
    def lease(self) -> Lease:
        return Lease(self.id, self.attempt)

    @property
    def is_final_attempt(self) -> bool:
        return self.attempt >= self.max_attempts

    @property
    def attempts_exhausted(self) -> bool:
        """True for a job reclaimed after its final attempt's lease lapsed: it must not run."""
        return self.attempt > self.max_attempts


def claim(
    cursor: Cursor, *, worker_id: str, limit: int, queues: Collection[str] | None = None
) -> list[ClaimedJob]:
    """Lease up to ``limit`` due jobs, highest priority first, then oldest ``run_at``, then id.

    Args:
        worker_id: recorded on each claimed job (shown in the admin).
        limit: the most jobs to claim; ``limit <= 0`` returns ``[]`` without a query.
        queues: claim only from these queues; ``None`` means every queue.

    Jobs whose lease lapsed (their worker died or stalled) are claimable again, before
    ready jobs; such a reclaim consumes an attempt. A reclaimed job whose lapsed attempt was
    its last has ``attempts_exhausted`` set: the caller dead-letters it instead of running it.

    Returns:
        The claimed jobs in claim order. Rows locked by another claimer are skipped, never
        waited for, so concurrent claimers never receive the same job.
    """
    if limit <= 0:
        return []
    params: dict[str, Any] = {"limit": limit, "worker_id": worker_id}
    if queues is None:
        cursor.execute(sql.CLAIM_JOBS_ANY_QUEUE, params)
    elif len(queues) == 1:
        cursor.execute(sql.CLAIM_JOBS_ONE_QUEUE, {**params, "queue": next(iter(queues))})
    else:
        cursor.execute(sql.CLAIM_JOBS_QUEUES, {**params, "queues": list(queues)})
    jobs = [ClaimedJob(*row) for row in cursor.fetchall()]
    # UPDATE ... RETURNING does not keep the CTEs' order; hand jobs out in claim order.
    jobs.sort(key=lambda job: (-job.priority, job.run_at, job.id))
    return jobs


def _lease_arrays(leases: Sequence[Lease]) -> dict[str, list[int]]:
    return {
        "ids": [lease.job_id for lease in leases],
        "attempts": [lease.attempt for lease in leases],
    }


def ack_many(cursor: Cursor, leases: Sequence[Lease]) -> set[int]:
    """Delete finished jobs in one statement; return the ids whose lease was still held."""
    if not leases:
        return set()
    cursor.execute(sql.ACK_JOBS, _lease_arrays(leases))
    return {row[0] for row in cursor.fetchall()}


def ack(cursor: Cursor, job_id: int, attempt: int) -> bool:
    """Delete a finished job; ``False`` if ``attempt`` no longer holds its lease."""
    return job_id in ack_many(cursor, [Lease(job_id, attempt)])


def heartbeat(cursor: Cursor, leases: Sequence[Lease]) -> dict[int, datetime]:
    """Extend held leases to ``now() + visibility_timeout`` in one statement.

    Returns ``{job id: new lease deadline}`` for the leases extended. A lease missing from the
    result is lost: another attempt holds the job, or its deadline had already passed
    (a lapsed lease is never revived, since another worker may be reclaiming it).
    """
    if not leases:
        return {}
    cursor.execute(sql.HEARTBEAT_JOBS, _lease_arrays(leases))
    return {job_id: deadline for job_id, deadline in cursor.fetchall()}


def retry(cursor: Cursor, job_id: int, attempt: int, *, delay: float, error: str) -> bool:
    """Make a job ready again ``delay`` seconds from now, recording ``error`` (fitted to
    its column by :func:`django_jobq.text.fit`).

    Returns ``False`` (and changes nothing) if ``attempt`` no longer holds the lease.
    """
    cursor.execute(
        sql.RETRY_JOB,
        {"id": job_id, "attempt": attempt, "delay_seconds": float(delay), "error": text.fit(error)},
    )
    return bool(cursor.fetchall())


def dead_letter(
    cursor: Cursor,
    job_id: int,
    attempt: int,
    *,
    reason: str,
    error: str = "",
    traceback: str = "",
    ran: bool = True,
) -> bool:
    """Move a job to the dead letters with ``reason``, ``error`` and ``traceback``, each
    fitted to its column (:mod:`django_jobq.text`: a long reason is cut, with a marker).

    ``ran`` says whether this attempt ran the handler; the dead letter's ``attempts``
    counts only attempts that ran. The copy and the delete are one statement. Returns
    ``False`` (and moves nothing) if ``attempt`` no longer holds the lease.
    """
    cursor.execute(
        sql.DEAD_LETTER_JOB,
        {
            "id": job_id,
            "attempt": attempt,
            "ran": ran,
            **dead_letter_texts(reason, error, traceback),
        },
    )
    return bool(cursor.fetchall())


def dead_letter_texts(reason: str, error: str, traceback: str) -> dict[str, str]:
    """The text parameters of a dead-letter statement, each fitted to its column."""
    return {
        "reason": text.reason(reason),
        "error": text.fit(error),
        "traceback": text.fit(traceback),
    }


def release(cursor: Cursor, leases: Sequence[Lease]) -> set[int]:
    """Return leased, never-started jobs to the ready state without consuming an attempt.

    Returns the ids released (those whose lease the caller still held).
    """
    if not leases:
        return set()
    cursor.execute(sql.RELEASE_JOBS, _lease_arrays(leases))
    return {row[0] for row in cursor.fetchall()}
