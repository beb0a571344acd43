"""Limited claims: claiming the jobs of queues and kinds with a fleet-wide concurrency or
rate limit (docs/flow-control.md).

A plain claim (:func:`django_jobq.claims.claim`) leaves limited queues and kinds out. A
limited claim takes their jobs in one transaction:

1. lock the rows of the limited queues and kinds it may claim for (``sql.flow.LOCK_LIMIT_STATES``,
   skipping those another worker's limited claim holds: it never waits; a row that is gone,
   deleted by hand, is written again for the next claim);
2. count their jobs holding a live lease, and their recent starts, fleet-wide
   (``sql.flow.COUNT_LIMITED``): a new
   statement, so it sees every claim committed before the lock, and no other claim can
   take jobs under these limits until this transaction ends;
3. claim, per limited queue and kind (and per pair of both), at most what the limits leave
   (``claims.claim``, so lapsed leases first, lanes and pauses honoured);
4. log the starts for the rate limits (``jobq_limit_start``, ``sql.flow.RECORD_STARTS``), and
   commit.

Each rate-limited job's handler thread then stamps its entry with the moment the handler
starts (:func:`confirm_start`, ``sql.flow.CONFIRM_START``) before it runs: the logs count
starts, not claims, so a handler that starts late behind its claim (a busy machine) still
counts from its start.

So the limits are exact: never more jobs of a limited queue or kind running at once than its
concurrency limit, never more started in any window than its rate limit, whichever worker
claims. A lapsed lease (its worker died) holds no slot: its job is claimable, and reclaiming
it counts again. A rate limit counts starts over its window widened by
:func:`rate_window` (2 %, at most a second): the margin covers the moment between a start's
stamp and its handler's first line, and clocks that differ by less than it. Limited jobs are
claimed only for idle handler slots, never prefetched: a job held in one worker's prefetch
would hold a slot of the limit while another worker sat idle.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from . import claims, sql
from .claims import ClaimedJob
from .conf import get_settings
from .flow_state import FlowState, Limits, ensure_limit_states, served_limited_queues

#: A rate limit's window is widened by this fraction of it (at most
#: :data:`MAX_RATE_WINDOW_MARGIN` seconds), see the module docs.
RATE_WINDOW_MARGIN = 0.02
MAX_RATE_WINDOW_MARGIN = 1.0


def rate_window(window: float) -> float:
    """Seconds over which a rate limit of ``window`` seconds counts starts."""
    return window + min(window * RATE_WINDOW_MARGIN, MAX_RATE_WINDOW_MARGIN)


@dataclass(frozen=True)
class LimitedClaim:
    """What a limited claim did: the ``jobs`` it claimed (claim order within each limited
    queue or kind); ``held_elsewhere``: a limit's row was locked by another worker's
    limited claim, or was gone (try again soon); ``next_start_in``: seconds until a rate limit that
    stopped this claim lets a job start again (``None``: none did); ``rated``: per job id,
    the rate-limited ``(scope, name)`` keys its start is stamped in (:func:`confirm_start`)."""

    jobs: list[ClaimedJob]
    held_elsewhere: bool = False
    next_start_in: float | None = None
    rated: dict[int, tuple[tuple[str, str], ...]] = field(default_factory=dict)


def claim_limited(
    connection: psycopg.Connection[Any],
    *,
    worker_id: str,
    limit: int,
    queues: Sequence[str] | None,
    kinds: Collection[str],
    state: FlowState,
) -> LimitedClaim:
    """Claim up to ``limit`` jobs of the limited queues and kinds the worker serves, within
    their limits (see the module docs).

    Args:
        connection: the worker's autocommit psycopg connection to the queue database; the
            claim runs in one transaction of its own on it.
        worker_id: recorded on the claimed jobs.
        limit: the most jobs to claim (the worker's idle handler slots).
        queues: the queues the worker serves (``None``: every queue).
        kinds: the kinds it has.
        state: what it loaded of flow control; if the claim finds it out of date, it
            claims nothing and ``state.guard.changed`` is set.

    Returns:
        A :class:`LimitedClaim`.

    Raises:
        psycopg.Error: a statement failed; the transaction rolled back, nothing was claimed.
    """
    queue_keys = served_limited_queues(state, queues)
    kind_keys = sorted(kind for kind in kinds if kind in state.kind_limits)
    if limit <= 0 or not (queue_keys or kind_keys):
        return LimitedClaim([])
    with connection.transaction():
        cursor = connection.cursor()
        cursor.execute(sql.flow.LOCK_LIMIT_STATES, {"queues": queue_keys, "kinds": kind_keys})
        locked: list[tuple[str, str]] = [(scope, name) for scope, name in cursor.fetchall()]
        keys = [("queue", name) for name in queue_keys] + [("kind", name) for name in kind_keys]
        missing = [key for key in keys if key not in locked]
        # Rows another worker's limited claim holds, or rows gone (deleted by hand): write
        # those gone, for the next claim.
        ensure_limit_states(cursor, missing)
        held_elsewhere = bool(missing)
        if not locked:
            return LimitedClaim([], held_elsewhere=True)
        rates = [_limits(state, key).rate for key in locked]
        cursor.execute(
            sql.flow.COUNT_LIMITED,
            {
                "scopes": [scope for scope, _ in locked],
                "names": [name for _, name in locked],
                "windows": [rate and rate_window(rate.window) for rate in rates],
                "counts": [rate and rate.count for rate in rates],
            },
        )
        room: dict[tuple[str, str], int] = {}
        next_start_in: float | None = None
        for scope, name, live, recent, frees_in in cursor.fetchall():
            key = (scope, name)
            room[key], wait = _room(_limits(state, key), live, recent, frees_in)
            if wait is not None:
                next_start_in = wait if next_start_in is None else min(next_start_in, wait)
        jobs = _claim_within(cursor, worker_id, limit, queues, kinds, state, room)
        if state.guard.changed:
            return LimitedClaim([], held_elsewhere=held_elsewhere)
        rated = _record_starts(cursor, state, room, jobs)
    return LimitedClaim(
        jobs, held_elsewhere=held_elsewhere, next_start_in=next_start_in, rated=rated
    )


def _limits(state: FlowState, key: tuple[str, str]) -> Limits:
    scope, name = key
    return (state.queue_limits if scope == "queue" else state.kind_limits)[name]


def _room(
    limits: Limits, live: int, recent: int, frees_in: float | None
) -> tuple[int, float | None]:
    """How many jobs a limited queue or kind may start now, given its jobs holding a live
    lease and its starts within the rate window; and, when its rate limit allows none, the
    seconds until it allows one (``frees_in``, from ``sql.flow.COUNT_LIMITED``)."""
    room = limits.concurrency - live if limits.concurrency is not None else 1 << 31
    wait = None
    if limits.rate is not None:
        rate_room = limits.rate.count - recent
        if rate_room <= 0:
            wait = max(0.0, frees_in or 0.0)
        room = min(room, rate_room)
    return max(room, 0), wait


def _claim_within(
    cursor: psycopg.Cursor[Any],
    worker_id: str,
    limit: int,
    queues: Sequence[str] | None,
    kinds: Collection[str],
    state: FlowState,
    room: dict[tuple[str, str], int],
) -> list[ClaimedJob]:
    """Claim, for each locked limited queue, then each kind, then each pair of both, what
    the room of all its limits allows; decrement ``room`` by what was claimed. A job under a
    limit whose row was not locked (another worker holds it) is left alone."""
    limited_kinds = set(state.kind_limits)
    excluded = state.excluded_queues()
    locked_queues = [name for scope, name in room if scope == "queue"]
    locked_kinds = [name for scope, name in room if scope == "kind"]
    unlimited_kinds = [kind for kind in kinds if kind not in limited_kinds]
    open_queues = None if queues is None else [q for q in queues if q not in excluded]
    plans: list[tuple[list[tuple[str, str]], list[str] | None, list[str]]] = []
    plans += [([("queue", q)], [q], unlimited_kinds) for q in locked_queues]
    plans += [([("kind", k)], open_queues, [k]) for k in locked_kinds]
    plans += [([("queue", q), ("kind", k)], [q], [k]) for q in locked_queues for k in locked_kinds]
    jobs: list[ClaimedJob] = []
    for keys, plan_queues, plan_kinds in plans:
        allowed = min([limit - len(jobs), *(room[key] for key in keys)])
        if allowed <= 0 or not plan_kinds or plan_queues == []:
            continue
        claimed = claims.claim(
            cursor,
            worker_id=worker_id,
            limit=allowed,
            queues=plan_queues,
            kinds=plan_kinds,
            excluded_queues=excluded if plan_queues is None else (),
            flow=state.guard,
        )
        if state.guard.changed:
            return []
        for key in keys:
            room[key] -= len(claimed)
        jobs += claimed
    return jobs


def _record_starts(
    cursor: psycopg.Cursor[Any],
    state: FlowState,
    room: dict[tuple[str, str], int],
    jobs: list[ClaimedJob],
) -> dict[int, tuple[tuple[str, str], ...]]:
    """Log the claimed jobs' starts for their rate-limited queues and kinds
    (``sql.flow.RECORD_STARTS``); return each such job's keys."""
    rated: dict[int, tuple[tuple[str, str], ...]] = {}
    for job in jobs:
        keys = tuple(
            key
            for key in (("queue", job.queue), ("kind", job.kind))
            if key in room and _limits(state, key).rate is not None
        )
        if keys:
            rated[job.id] = keys
    entries = [(key, job) for job in jobs for key in rated.get(job.id, ())]
    if not entries:
        return rated
    windows = [_limits(state, key).rate for key, _ in entries]
    cursor.execute(
        sql.flow.RECORD_STARTS,
        {
            "scopes": [scope for (scope, _), _ in entries],
            "names": [name for (_, name), _ in entries],
            "job_ids": [job.id for _, job in entries],
            "attempts": [job.attempt for _, job in entries],
            "windows": [rate_window(rate.window) for rate in windows if rate],
        },
    )
    return rated


def confirm_start(job_id: int, attempt: int, keys: Sequence[tuple[str, str]]) -> None:
    """Stamp the start of a rate-limited job's attempt for ``keys`` (its rate-limited queue
    and kind, as :attr:`LimitedClaim.rated` gives them) with the database's clock, in a
    statement of its own on this thread's Django connection to the queue database
    (``sql.flow.CONFIRM_START``). The handler thread calls it just before the handler.

    Raises:
        django.db.Error: the statement failed (the attempt fails like a handler that raised).
    """
    from django.db import connections  # here: the claim side runs on psycopg alone

    with connections[get_settings().DATABASE].cursor() as cursor:
        cursor.execute(
            sql.flow.CONFIRM_START,
            {
                "job_id": job_id,
                "attempt": attempt,
                "scopes": [scope for scope, _ in keys],
                "names": [name for _, name in keys],
            },
        )
