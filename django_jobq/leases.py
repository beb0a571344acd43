"""Claim, heartbeat, ack, retry, dead-letter and release: the fenced writes about a job.

Each function takes a cursor (a psycopg 3 cursor or a Django cursor on the queue database)
and runs one statement from :mod:`django_jobq.sql`. A write about a running job is fenced
by ``(job id, attempt)``: if another attempt holds the job now (its lease lapsed and it was
reclaimed) the write matches nothing and the function reports that it did not apply. These
functions never raise for a lost lease; they raise only for database errors (and
:class:`LeaseBusy`, below).

None of them waits for a row lock another transaction holds (an operator's ``SELECT ... FOR
UPDATE``, a handler's ``ctx.atomic()``), except :func:`ack`, which runs in the handler's
transaction: a locked row is skipped and reported *busy* (nothing written; try again
later), so one locked row never stalls the writes about a worker's other jobs. Batch writes
lock their rows in id order (see ``sql.ACK_JOBS``).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple, Protocol

from . import sql, text
from .claim_positions import FROM_THE_START, ClaimPositions, Probe


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

    ``poison`` says why the row must not run when it holds what ``enqueue`` never writes
    (a payload that is not a JSON object or cannot be decoded, an infinite time, a visibility
    timeout out of range), else ``""``. Such a job's ``payload`` is ``{}`` and its times are
    clamped: the worker dead-letters it unrun without reading them.
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
    poison: str = ""

    @property
    def lease(self) -> Lease:
        return Lease(self.id, self.attempt)

    @property
    def is_final_attempt(self) -> bool:
        return self.attempt >= self.max_attempts

    @property
    def attempts_exhausted(self) -> bool:
        """True when this claim's attempt is above ``max_attempts``: it must not run. Either
        the job was reclaimed after its final attempt's lease lapsed (``reclaimed``), or it
        was ready with no attempt left (its ``attempts`` set by SQL, say)."""
        return self.attempt > self.max_attempts


def claim(
    cursor: Cursor,
    *,
    worker_id: str,
    limit: int,
    queues: Collection[str] | None = None,
    kinds: Collection[str] | None = None,
    positions: ClaimPositions | None = None,
) -> list[ClaimedJob]:
    """Lease up to ``limit`` due jobs, highest priority first, then oldest ``run_at``, then id.

    Args:
        worker_id: recorded on each claimed job (shown in the admin).
        limit: the most jobs to claim; ``limit <= 0`` returns ``[]`` without a query.
        queues: claim only from these queues; ``None`` means every queue.
        kinds: claim only jobs of these kinds (a worker passes its registry); ``None``
            means :func:`django_jobq.registry.claimable_kinds` of this process. Jobs of
            other kinds are left ready for a worker that has them, and cost the claim one
            index seek per (queue, kind), not a walk over them.
        positions: where to start reading (a worker's :class:`ClaimPositions`, moved on
            by this claim; see :mod:`django_jobq.claim_positions`); ``None`` reads the
            queues from the start and keeps no positions.

    Jobs whose lease lapsed (their worker died or stalled) are claimable again, before
    ready jobs; such a reclaim consumes an attempt. A reclaimed job whose lapsed attempt was
    its last has ``attempts_exhausted`` set: the caller dead-letters it instead of running it.

    A row no ``enqueue`` wrote (see ``ClaimedJob.poison``) never makes the claim fail: it is
    leased like the others and returned with ``poison`` set.

    Cost: one small statement (``sql.CLAIM_JOBS_*``) reads the first ``limit *
    sql.CLAIM_FRONT_FACTOR`` due jobs from the positions (the front) and leases the lapsed
    ones and those of the front whose kind is in ``kinds``. When that claimed fewer than
    ``limit`` and the front was full: if other claimers held the rest of it and the
    positions moved past it, the same statement reads on from there (at most
    :data:`CLAIM_FRONT_TRIES` statements in all); if jobs of other kinds were at the front,
    or the positions could not move (none kept, or jobs of the last
    ``claim_positions.COMMIT_LAG`` seconds), a larger statement (``sql.CLAIM_JOBS_WALK_*``:
    longer to plan, one index seek per (queue, kind) of ready jobs, from the start) walks
    the worker's kinds for the rest. Each statement is atomic on its own (in autocommit,
    each commits): should a later one fail, the jobs the earlier ones leased stay leased
    until their leases lapse, then are reclaimed.

    Returns:
        The claimed jobs in claim order. Rows locked by another claimer are skipped, never
        waited for, so concurrent claimers never receive the same job.
    """
    if limit <= 0:
        return []
    statements, params = _queue_params(queues, kinds)
    params["worker_id"] = worker_id
    jobs: list[ClaimedJob] = []
    for _ in range(CLAIM_FRONT_TRIES):
        scan = FROM_THE_START if positions is None else positions.params()
        cursor.execute(statements.front, {**params, **scan, **_limits(limit - len(jobs))})
        rows = cursor.fetchall()
        front_full, front_unserved, claimed_at, priorities, run_ats, ids = rows[0][:6]
        claimed = [_claimed_job(*row[6:]) for row in rows if row[6] is not None]
        moved = positions is not None and positions.advance(
            claimed_at=claimed_at,
            seen=zip(priorities or (), run_ats or (), ids or (), strict=True),
            lapsed_seen_all=sum(job.reclaimed for job in claimed) < limit - len(jobs),
        )
        jobs += claimed
        if not front_full or len(jobs) >= limit:
            break
        if front_unserved or not moved:
            # Jobs of other kinds at the front, or rows other claimers hold where the
            # positions cannot pass them (none kept; jobs of the last COMMIT_LAG seconds):
            # the walk finds the worker's jobs behind them.
            cursor.execute(statements.walk, {**params, **scan, **_limits(limit - len(jobs))})
            jobs += [_claimed_job(*row) for row in cursor.fetchall()]
            break
        # Every job of the front was the worker's, other claimers held the rest, and the
        # positions moved past them: read on from there.
    # UPDATE ... RETURNING does not keep the CTEs' order; hand jobs out in claim order.
    jobs.sort(key=lambda job: (-job.priority, job.run_at, job.id))
    return jobs


class _ClaimStatements(NamedTuple):
    """A queue mode's claim statements: the front's, the walk, and the positions' probe."""

    front: str
    walk: str
    probe: str


_ANY_QUEUE = _ClaimStatements(
    sql.CLAIM_JOBS_ANY_QUEUE, sql.CLAIM_JOBS_WALK_ANY_QUEUE, sql.PROBE_CLAIM_POSITIONS_ANY_QUEUE
)
_ONE_QUEUE = _ClaimStatements(
    sql.CLAIM_JOBS_ONE_QUEUE, sql.CLAIM_JOBS_WALK_ONE_QUEUE, sql.PROBE_CLAIM_POSITIONS_ONE_QUEUE
)
_QUEUES = _ClaimStatements(
    sql.CLAIM_JOBS_QUEUES, sql.CLAIM_JOBS_WALK_QUEUES, sql.PROBE_CLAIM_POSITIONS_QUEUES
)


#: How many times one claim reads a front (``sql.CLAIM_JOBS_*``) when other claimers hold the
#: rest of the one before.
CLAIM_FRONT_TRIES = 3


def _limits(limit: int) -> dict[str, int]:
    """A claim statement's ``limit`` and ``front`` parameters."""
    return {"limit": limit, "front": limit * sql.CLAIM_FRONT_FACTOR}


def _queue_params(
    queues: Collection[str] | None, kinds: Collection[str] | None
) -> tuple[_ClaimStatements, dict[str, Any]]:
    """The claim statements for ``queues`` and their ``queue(s)`` and ``kinds`` parameters
    (``kinds=None``: :func:`django_jobq.registry.claimable_kinds`)."""
    if kinds is None:
        from .registry import claimable_kinds  # here: registry loads the models

        kinds = claimable_kinds()
    params: dict[str, Any] = {"kinds": list(kinds)}
    if queues is None:
        return _ANY_QUEUE, params
    if len(queues) == 1:
        params["queue"] = next(iter(queues))
        return _ONE_QUEUE, params
    params["queues"] = list(queues)
    return _QUEUES, params


def probe_claim_positions(
    cursor: Cursor,
    positions: ClaimPositions,
    *,
    queues: Collection[str] | None = None,
    kinds: Collection[str] | None = None,
) -> bool:
    """Look for claimable rows before ``positions`` from the start of the claim order
    (``sql.PROBE_CLAIM_POSITIONS_*``, read without locks) and move the positions back to
    them (see :mod:`django_jobq.claim_positions`).

    Args:
        cursor: an autocommit cursor on the queue database (one statement, no locks).
        positions: the worker's positions; moved back in place, and told how long the
            probe took (its next interval).
        queues, kinds: as for :func:`claim` (the same worker's).

    Returns:
        Whether a position moved back (a job waits behind it: claim again).

    Raises:
        psycopg.Error: the statement failed; the positions are unchanged.
    """
    statements, params = _queue_params(queues, kinds)
    started = time.monotonic()
    cursor.execute(statements.probe, params)
    priority, run_at, job_id, lapsed, lapsed_since = cursor.fetchall()[0]
    found = Probe(
        ready=None if job_id is None else (priority, run_at, job_id),
        lapsed=lapsed,
        lapsed_since=lapsed_since,
    )
    return positions.lower(found, seconds=time.monotonic() - started)


class LeaseBusy(Exception):
    """A single-job write (:func:`retry`, :func:`dead_letter`) found the job's row locked by
    another transaction (or, in the worker, a table it writes locked for longer than a short
    wait): nothing was written, the lease may still be held. Try again later."""

    def __init__(self, job_id: int) -> None:
        super().__init__(f"job {job_id}: its row is locked by another transaction")
        self.job_id = job_id


class Written(set[int]):
    """The ids a batch write applied to (the lease was held); :attr:`busy` holds the ids it
    skipped because another transaction holds their row lock (nothing written). An id in
    neither is a lost lease."""

    def __init__(self, applied: Iterable[int] = (), busy: Iterable[int] = ()) -> None:
        super().__init__(applied)
        self.busy = frozenset(busy)


class Extended(dict[int, datetime]):
    """``{job id: new lease deadline}`` of the leases a heartbeat extended; :attr:`busy`
    holds the ids it skipped because another transaction holds their row lock. A lease in
    neither is lost."""

    def __init__(self, deadlines: Iterable[tuple[int, datetime]], busy: Iterable[int]) -> None:
        super().__init__(deadlines)
        self.busy = frozenset(busy)


_JSON_TYPES = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}


def _claimed_job(
    id: int,
    queue: str,
    kind: str,
    payload_text: str,
    priority: int,
    run_at: datetime,
    attempt: int,
    max_attempts: int,
    visibility_timeout: timedelta,
    lease_deadline: datetime,
    expired: bool,
    reclaimed: bool,
    pickup_latency: float,
    poison: str | None,
) -> ClaimedJob:
    """One row of ``sql.CLAIM_JOBS_WALK_*`` (or of ``sql.CLAIM_JOBS_*``, its first column
    dropped) as a job, its payload decoded; never raises for the row's values (``poison``
    says what is wrong with them)."""
    payload, problem = _decode_payload(payload_text)
    if not poison and problem:
        poison = problem
    return ClaimedJob(
        id,
        queue,
        kind,
        payload if not poison else {},
        priority,
        run_at,
        attempt,
        max_attempts,
        visibility_timeout,
        lease_deadline,
        expired,
        reclaimed,
        pickup_latency if math.isfinite(pickup_latency) and not poison else 0.0,
        poison or "",
    )


def _decode_payload(text: str) -> tuple[dict[str, Any], str]:
    """``(payload, "")``, or ``({}, problem)`` for a payload that is not a JSON object or
    that Python cannot decode (nested too deep for its recursion limit)."""
    try:
        payload = json.loads(text)
    except (RecursionError, ValueError) as exc:
        return {}, f"payload could not be decoded: {type(exc).__name__}: {str(exc)[:200]}"
    if not isinstance(payload, dict):
        return {}, f"payload is {_JSON_TYPES.get(type(payload), 'a number')}, not a JSON object"
    return payload, ""


def _lease_arrays(leases: Sequence[Lease]) -> dict[str, list[int]]:
    return {
        "ids": [lease.job_id for lease in leases],
        "attempts": [lease.attempt for lease in leases],
    }


def _written(rows: Iterable[Sequence[Any]]) -> Written:
    """A ``Written`` of the ``(id, busy)`` rows of a locked write (see ``sql.ACK_JOBS``)."""
    applied: list[int] = []
    busy: list[int] = []
    for job_id, skipped, *_ in rows:
        (busy if skipped else applied).append(job_id)
    return Written(applied, busy)


def applied_once(job_id: int, rows: Iterable[Sequence[Any]]) -> bool:
    """Whether a single-job locked write applied.

    Raises:
        LeaseBusy: the row was locked by another transaction.
    """
    written = _written(rows)
    if written.busy:
        raise LeaseBusy(job_id)
    return bool(written)


def ack_many(cursor: Cursor, leases: Sequence[Lease]) -> Written:
    """Delete finished jobs in one statement, without waiting for a locked row.

    Returns the ids whose lease was still held (acked); ``.busy``: those whose row another
    transaction had locked (not acked; ack them again later).
    """
    if not leases:
        return Written()
    cursor.execute(sql.ACK_JOBS, _lease_arrays(leases))
    return _written(cursor.fetchall())


def ack(cursor: Cursor, job_id: int, attempt: int) -> bool:
    """Delete a finished job; ``False`` if ``attempt`` no longer holds its lease. Unlike the
    other writes it waits for a row lock another transaction holds: it is the ack of
    ``ctx.atomic()``, in the handler's own transaction (``sql.ACK_JOB_IN_TRANSACTION``)."""
    cursor.execute(sql.ACK_JOB_IN_TRANSACTION, {"id": job_id, "attempt": attempt})
    return bool(cursor.fetchall())


def heartbeat(cursor: Cursor, leases: Sequence[Lease]) -> Extended:
    """Extend held leases to ``now() + visibility_timeout`` in one statement, without waiting
    for a locked row.

    Returns ``{job id: new lease deadline}`` for the leases extended, and in ``.busy`` the
    ids whose row another transaction had locked (not extended; try again soon). A lease
    in neither is lost: another attempt holds the job, or its deadline had already passed
    (a lapsed lease is never revived, since another worker may be reclaiming it).
    """
    if not leases:
        return Extended((), ())
    cursor.execute(sql.HEARTBEAT_JOBS, _lease_arrays(leases))
    rows = cursor.fetchall()
    return Extended(
        ((job_id, deadline) for job_id, busy, deadline in rows if not busy),
        (job_id for job_id, busy, _ in rows if busy),
    )


def retry(cursor: Cursor, job_id: int, attempt: int, *, delay: float, error: str) -> bool:
    """Make a job ready again ``delay`` seconds from now, recording ``error`` (fitted to
    its column by :func:`django_jobq.text.fit`).

    Returns ``False`` (and changes nothing) if ``attempt`` no longer holds the lease.

    Raises:
        LeaseBusy: another transaction holds the job's row lock (nothing changed).
    """
    cursor.execute(
        sql.RETRY_JOB,
        {"id": job_id, "attempt": attempt, "delay_seconds": float(delay), "error": text.fit(error)},
    )
    return applied_once(job_id, cursor.fetchall())


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

    Raises:
        LeaseBusy: another transaction holds the job's row lock (nothing moved).
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
    return applied_once(job_id, cursor.fetchall())


def dead_letter_texts(reason: str, error: str, traceback: str) -> dict[str, str]:
    """The text parameters of a dead-letter statement, each fitted to its column."""
    return {
        "reason": text.reason(reason),
        "error": text.fit(error),
        "traceback": text.fit(traceback),
    }


def release(cursor: Cursor, leases: Sequence[Lease]) -> Written:
    """Return leased, never-started jobs to the ready state without consuming an attempt,
    without waiting for a locked row.

    Returns the ids released (those whose lease the caller still held); ``.busy``: those
    whose row another transaction had locked (not released; try again later).
    """
    if not leases:
        return Written()
    cursor.execute(sql.RELEASE_JOBS, _lease_arrays(leases))
    return _written(cursor.fetchall())
