"""Claims: leasing due jobs to a worker, and the probe that keeps its claim positions true.

:func:`claim` runs one statement of :mod:`django_jobq.sql.claims` (sometimes two or three,
see there) on a psycopg 3 cursor on the queue database; each claim starts an attempt whose
number is the lease's fencing token (:class:`~django_jobq.leases.Lease`). The writes about
a claimed job are in :mod:`django_jobq.leases` and :mod:`django_jobq.outcomes`.
"""

from __future__ import annotations

import enum
import json
import math
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple, TypeVar

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import args_row, class_row

from . import db, sql
from .claim_positions import FROM_THE_START, ClaimPositions, Probe
from .leases import Lease

R = TypeVar("R")


@dataclass
class FlowGuard:
    """What a claim's caller read of flow control (:mod:`django_jobq.flow_state`): the
    ``digest`` of the pauses and limits (``sql.flow.FLOW_DIGEST``). A claim leases nothing
    when the database's digest differs, and sets ``changed``: read them again, claim again.
    Each claim statement also sets ``checked`` (the caller resets it): the digest was
    compared, with or without a change."""

    digest: str
    changed: bool = False
    checked: bool = False


@dataclass(frozen=True)
class ClaimedJob:
    """A job as a worker holds it after a claim.

    ``attempt`` is the attempt this claim started (1 for the first run) and the lease's
    fencing token; ``lease_deadline`` is when the lease lapses unless extended; ``expired``
    is true when the job's ``expires_at`` had passed at the claim (it must not run).
    ``reclaimed`` is true when the claim took the job from a lapsed lease, and
    ``pickup_latency`` is the seconds from when the job became claimable (its
    ``GREATEST(run_at, created_at)``, or for a reclaim its lapsed deadline) to the claim, on
    the database clock (see ``sql.claims.CLAIM_JOBS_*``).

    ``poison`` says why the row must not run when it holds what ``enqueue`` never writes
    (a payload that is not a JSON object or cannot be decoded, an infinite time, a visibility
    timeout out of range), else ``""``. Such a job's ``payload`` is ``{}`` and its times are
    clamped: the worker dead-letters it unrun without reading them.

    ``trace_context`` is the job's stored OpenTelemetry context as JSON text (``None``: none
    was recorded), the parent of the attempt's span (:mod:`django_jobq.tracing`).

    ``ordering_key`` is the job's lane (``None``: in none; docs/flow-control.md);
    ``abort_requested`` is true when an operator had asked a running attempt of it to stop
    before this claim (a reclaim of an aborted job: it must not run).
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
    trace_context: str | None = None
    ordering_key: str | None = None
    abort_requested: bool = False

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
    cursor: psycopg.Cursor[Any],
    *,
    worker_id: str,
    limit: int,
    queues: Collection[str] | None = None,
    kinds: Collection[str] | None = None,
    positions: ClaimPositions | None = None,
    excluded_queues: Collection[str] = (),
    flow: FlowGuard | None = None,
    first_front: FrontClaim | None = None,
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
        excluded_queues: with ``queues=None``, the queues not to claim from (paused or
            limited ones).
        flow: what the caller read of pauses and limits; the claim leases nothing if they
            changed since (and sets ``flow.changed``). ``None``: no flow control: pauses and
            limits are the caller's business (the worker's claims honour them,
            :mod:`django_jobq.limited_claims`).
        first_front: what the claim's first statement took, when the caller ran it
            (:func:`send_front`, with the same arguments): the claim goes on from there.

    A ready job in a lane (``ordering_key``) is claimed only while no job of its lane runs.

    Jobs whose lease lapsed (their worker died or stalled) are claimable again, before
    ready jobs; such a reclaim consumes an attempt. A reclaimed job whose lapsed attempt was
    its last has ``attempts_exhausted`` set: the caller dead-letters it instead of running it.

    A row no ``enqueue`` wrote (see ``ClaimedJob.poison``) never makes the claim fail: it is
    leased like the others and returned with ``poison`` set.

    Cost: one small statement (``sql.claims.CLAIM_JOBS_*``) reads the first ``limit *
    sql.claims.CLAIM_FRONT_FACTOR`` due jobs from the positions (the front) and leases the lapsed
    ones and those of the front whose kind is in ``kinds``. When that claimed fewer than
    ``limit`` and the front was full: if other claimers held the rest of it and the
    positions moved past it, the same statement reads on from there (at most
    :data:`CLAIM_FRONT_TRIES` statements in all); if jobs of other kinds were at the front,
    or the positions could not move (none kept, or jobs of the last
    ``claim_positions.COMMIT_LAG`` seconds), a larger statement (``sql.claims.CLAIM_JOBS_WALK_*``:
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
    statements, params = _queue_params(queues, kinds, excluded_queues)
    params["worker_id"] = worker_id
    params["flow_digest"] = None if flow is None else flow.digest
    params["claim_note"] = None
    jobs: list[ClaimedJob] = []
    for _ in range(CLAIM_FRONT_TRIES):
        scan = FROM_THE_START if positions is None else positions.params()
        if first_front is None:
            rows = _execute_with_lane_retry(
                cursor,
                statements.front,
                {**params, **scan, **_limits(limit - len(jobs))},
                _front_row,
            )
            _saw_job_table_size(cursor, rows)
            front = _take_front(rows, limit - len(jobs), positions, flow)
        else:
            front, first_front = first_front, None
        jobs += front.jobs
        if front.after is FrontAfter.DONE:
            break
        if front.after is FrontAfter.WALK:
            jobs += _execute_with_lane_retry(
                cursor,
                statements.walk,
                {**params, **scan, **_limits(limit - len(jobs))},
                _claimed_job,
            )
            break
        # Every job of the front was the worker's, other claimers held the rest, and the
        # positions moved past them: read on from there.
    return _in_claim_order(jobs)


def send_front(
    cursor: psycopg.Cursor[Any],
    *,
    worker_id: str,
    limit: int,
    queues: Collection[str] | None = None,
    kinds: Collection[str] | None = None,
    positions: ClaimPositions | None = None,
    excluded_queues: Collection[str] = (),
    flow: FlowGuard | None = None,
    note: str | None = None,
) -> Callable[[], FrontClaim]:
    """Send the first statement of :func:`claim` (its arguments; ``limit`` at least 1)
    without waiting for its result: inside a pipeline, it travels with the statements
    around it (:mod:`django_jobq.limited_claims` sends a whole limited claim so). The
    function returned reads the result once the pipeline has synced, moves ``positions``
    on and checks ``flow`` as :func:`claim` does, and returns a :class:`FrontClaim`:
    ``after`` says what :func:`claim` would have run next, which the caller does in a
    transaction of its own (:func:`claim` with ``first_front``), or not. ``note``: keep
    the leases taken in the session, after ``note``, for a statement sent next in the same
    round trip (``claim_noted`` in ``sql.claims``).

    Raises:
        psycopg.Error: from the function returned, when the statement failed (a second
            running job in a lane included: the caller's transaction is aborted).
    """
    statements, params = _queue_params(queues, kinds, excluded_queues)
    params["worker_id"] = worker_id
    params["flow_digest"] = None if flow is None else flow.digest
    params["claim_note"] = note
    scan = FROM_THE_START if positions is None else positions.params()
    # A cursor of its own, not the kept one: a pipeline may send other claim statements
    # before this one's rows are read.
    front_cursor = db.LongStatementCursor(cursor.connection, row_factory=args_row(_front_row))
    front_cursor.execute_named(statements.front, {**params, **scan, **_limits(limit)})

    def read() -> FrontClaim:
        with front_cursor:
            rows = front_cursor.fetchall()
        _saw_job_table_size(cursor, rows)
        front = _take_front(rows, limit, positions, flow)
        return front._replace(jobs=_in_claim_order(front.jobs))

    return read


class FrontAfter(enum.Enum):
    """What a claim does after reading a front (``sql.claims.CLAIM_JOBS_*``)."""

    #: Nothing: it took all it asked for, the front held every due job it could take, or
    #: the pauses and limits changed.
    DONE = "done"
    #: Read on from the positions: the front held only the worker's jobs, other claimers
    #: held those it did not take, and the positions moved past them.
    READ_ON = "read on"
    #: Walk the worker's kinds (``sql.claims.CLAIM_JOBS_WALK_*``): jobs of other kinds were
    #: at the front, or the positions could not move past the rows other claimers held.
    WALK = "walk"


class FrontClaim(NamedTuple):
    """What one front statement claimed (``jobs``), and what a claim runs next (``after``)."""

    jobs: list[ClaimedJob]
    after: FrontAfter


def _take_front(
    rows: list[_FrontRow],
    wanted: int,
    positions: ClaimPositions | None,
    flow: FlowGuard | None,
) -> FrontClaim:
    """The jobs of a front statement's ``rows`` (it asked for ``wanted``); moves
    ``positions`` on and checks ``flow`` (see :func:`claim`)."""
    front = rows[0].front
    if flow is not None:
        flow.checked = True
        if front.flow_digest != flow.digest:
            flow.changed = True  # nothing was leased: the caller reads the change first
            return FrontClaim([], FrontAfter.DONE)
    claimed = [row.job for row in rows if row.job is not None]
    moved = positions is not None and positions.advance(
        claimed_at=front.claimed_at,
        seen=zip(
            front.position_priorities or (),
            front.position_run_ats or (),
            front.position_ids or (),
            strict=True,
        ),
        lapsed_seen_all=sum(job.reclaimed for job in claimed) < wanted,
    )
    if not front.front_full or len(claimed) >= wanted:
        return FrontClaim(claimed, FrontAfter.DONE)
    if front.front_unserved or not moved:
        return FrontClaim(claimed, FrontAfter.WALK)
    return FrontClaim(claimed, FrontAfter.READ_ON)


def _saw_job_table_size(cursor: psycopg.Cursor[Any], rows: list[_FrontRow]) -> None:
    """Tell a worker's connection the size of ``jobq_job`` its front statement read (see
    :class:`django_jobq.db.WatchedConnection`)."""
    if isinstance(cursor.connection, db.WatchedConnection):
        cursor.connection.saw_job_table_size(rows[0].front.job_table_size)


def _in_claim_order(jobs: list[ClaimedJob]) -> list[ClaimedJob]:
    """UPDATE ... RETURNING does not keep the CTEs' order: jobs are handed out in claim order."""
    return sorted(jobs, key=lambda job: (-job.priority, job.run_at, job.id))


def _execute_with_lane_retry(
    cursor: psycopg.Cursor[Any], statement: str, params: dict[str, Any], row: Callable[..., R]
) -> list[R]:
    """Run a claim statement; once more if PostgreSQL refused it a second running job in a
    lane (``jobq_job_one_running_per_lane``: two ready jobs of one lane, claimed at once by
    two claimers). The statement leased nothing then; run again, it sees the other claim's
    job running and leaves its lane alone. Inside a transaction the refusal is raised (the
    transaction is aborted)."""
    for attempt in range(2):
        try:
            # Kept by a worker's connection; its rows are made from the columns in order (a
            # test ties the functions' parameters to the statements' column names).
            claim_cursor = db.kept_cursor(cursor.connection, "claims", db.LongStatementCursor)
            claim_cursor.row_factory = args_row(row)
            claim_cursor.execute_named(statement, params)
            return claim_cursor.fetchall()
        except psycopg.errors.UniqueViolation as exc:
            aborted = cursor.connection.info.transaction_status == TransactionStatus.INERROR
            if attempt or aborted or exc.diag.constraint_name != LANE_CONSTRAINT:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


#: The unique index that keeps a lane to one running job (``models.Job``).
LANE_CONSTRAINT = "jobq_job_one_running_per_lane"


class _ClaimStatements(NamedTuple):
    """A queue mode's claim statements: the front's, the walk, and the positions' probe."""

    front: str
    walk: str
    probe: str


_ANY_QUEUE = _ClaimStatements(
    sql.claims.CLAIM_JOBS_ANY_QUEUE,
    sql.claims.CLAIM_JOBS_WALK_ANY_QUEUE,
    sql.claims.PROBE_CLAIM_POSITIONS_ANY_QUEUE,
)
_ONE_QUEUE = _ClaimStatements(
    sql.claims.CLAIM_JOBS_ONE_QUEUE,
    sql.claims.CLAIM_JOBS_WALK_ONE_QUEUE,
    sql.claims.PROBE_CLAIM_POSITIONS_ONE_QUEUE,
)
_QUEUES = _ClaimStatements(
    sql.claims.CLAIM_JOBS_QUEUES,
    sql.claims.CLAIM_JOBS_WALK_QUEUES,
    sql.claims.PROBE_CLAIM_POSITIONS_QUEUES,
)
_QUEUES_BUT = _ClaimStatements(
    sql.claims.CLAIM_JOBS_QUEUES_BUT,
    sql.claims.CLAIM_JOBS_WALK_QUEUES_BUT,
    sql.claims.PROBE_CLAIM_POSITIONS_QUEUES_BUT,
)


#: How many times one claim reads a front (``sql.claims.CLAIM_JOBS_*``) when other claimers hold the
#: rest of the one before.
CLAIM_FRONT_TRIES = 3


def _limits(limit: int) -> dict[str, int]:
    """A claim statement's ``limit`` and ``front`` parameters."""
    return {"limit": limit, "front": limit * sql.claims.CLAIM_FRONT_FACTOR}


def _queue_params(
    queues: Collection[str] | None,
    kinds: Collection[str] | None,
    excluded_queues: Collection[str] = (),
) -> tuple[_ClaimStatements, dict[str, Any]]:
    """The claim statements for ``queues`` (with ``None``, every queue but
    ``excluded_queues``) and their ``queue(s)``, ``excluded_queues`` and ``kinds`` parameters
    (``kinds=None``: :func:`django_jobq.registry.claimable_kinds`)."""
    if kinds is None:
        from .registry import claimable_kinds  # here: registry loads the models

        kinds = claimable_kinds()
    params: dict[str, Any] = {"kinds": list(kinds)}
    if queues is None and excluded_queues:
        params["excluded_queues"] = list(excluded_queues)
        return _QUEUES_BUT, params
    if queues is None:
        return _ANY_QUEUE, params
    if len(queues) == 1:
        params["queue"] = next(iter(queues))
        return _ONE_QUEUE, params
    params["queues"] = list(queues)
    return _QUEUES, params


def probe_claim_positions(
    cursor: psycopg.Cursor[Any],
    positions: ClaimPositions,
    *,
    queues: Collection[str] | None = None,
    kinds: Collection[str] | None = None,
    excluded_queues: Collection[str] = (),
) -> bool:
    """Look for claimable rows before ``positions`` from the start of the claim order
    (``sql.claims.PROBE_CLAIM_POSITIONS_*``, read without locks) and move the positions back to
    them (see :mod:`django_jobq.claim_positions`).

    Args:
        cursor: an autocommit cursor on the queue database (one statement, no locks).
        positions: the worker's positions; moved back in place, and told how long the
            probe took (its next interval).
        queues, kinds, excluded_queues: as for :func:`claim` (the same worker's).

    Returns:
        Whether a position moved back (a job waits behind it: claim again).

    Raises:
        psycopg.Error: the statement failed; the positions are unchanged.
    """
    statements, params = _queue_params(queues, kinds, excluded_queues)
    started = time.monotonic()
    with cursor.connection.cursor(row_factory=class_row(_ProbeRow)) as probe_cursor:
        probe_cursor.execute(statements.probe, params)
        (row,) = probe_cursor.fetchall()
    found = Probe(
        ready=None
        if row.id is None or row.priority is None
        else (row.priority, row.run_at, row.id),
        lapsed=row.lapsed,
        lapsed_since=row.lapsed_since,
    )
    return positions.lower(found, seconds=time.monotonic() - started)


_JSON_TYPES = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}


def _claimed_job(
    id: int,
    queue: str,
    kind: str,
    payload: str,
    priority: int,
    run_at: datetime,
    attempts: int,
    max_attempts: int,
    visibility_timeout: timedelta,
    lease_deadline: datetime,
    expired: bool,
    reclaimed: bool,
    pickup_latency: float,
    poison: str | None,
    trace_context: str | None,
    ordering_key: str | None,
    abort_requested: bool,
) -> ClaimedJob:
    """One row of ``sql.claims.CLAIM_JOBS_WALK_*`` (or the job columns of a row of
    ``sql.claims.CLAIM_JOBS_*``) as a job, its payload decoded; never raises for the row's
    values (``poison``
    says what is wrong with them)."""
    decoded, problem = _decode_payload(payload)
    if not poison and problem:
        poison = problem
    return ClaimedJob(
        id=id,
        queue=queue,
        kind=kind,
        payload=decoded if not poison else {},
        priority=priority,
        run_at=run_at,
        attempt=attempts,
        max_attempts=max_attempts,
        visibility_timeout=visibility_timeout,
        lease_deadline=lease_deadline,
        expired=expired,
        reclaimed=reclaimed,
        pickup_latency=pickup_latency if math.isfinite(pickup_latency) and not poison else 0.0,
        poison=poison or "",
        trace_context=trace_context,
        ordering_key=ordering_key,
        abort_requested=abort_requested,
    )


@dataclass(frozen=True)
class _Front:
    """What the first claim statement says about the front it read (see
    ``sql.claims.CLAIM_JOBS_*``)."""

    front_full: bool
    front_unserved: bool
    claimed_at: datetime
    position_priorities: list[int] | None
    position_run_ats: list[datetime | None] | None
    position_ids: list[int] | None
    flow_digest: str
    job_table_size: int


class _FrontRow(NamedTuple):
    """A row of ``sql.claims.CLAIM_JOBS_*``: the front, and a job claimed (``None`` in the
    one row of a claim that leased nothing)."""

    front: _Front
    job: ClaimedJob | None


def _front_row(
    front_full: bool,
    front_unserved: bool,
    claimed_at: datetime,
    position_priorities: list[int] | None,
    position_run_ats: list[datetime | None] | None,
    position_ids: list[int] | None,
    flow_digest: str,
    job_table_size: int,
    *job: Any,
) -> _FrontRow:
    front = _Front(
        front_full,
        front_unserved,
        claimed_at,
        position_priorities,
        position_run_ats,
        position_ids,
        flow_digest,
        job_table_size,
    )
    return _FrontRow(front, _claimed_job(*job) if job[0] is not None else None)


@dataclass(frozen=True)
class _ProbeRow:
    """The row of ``sql.claims.PROBE_CLAIM_POSITIONS_*``: the first claimable ready job
    (all ``None`` when there is none; ``run_at`` too when outside what Python holds), and
    whether a lapsed lease was found and since when."""

    priority: int | None
    run_at: datetime | None
    id: int | None
    lapsed: bool
    lapsed_since: datetime | None


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
