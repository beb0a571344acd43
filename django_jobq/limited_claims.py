"""Limited claims: claiming the jobs of queues and kinds with a fleet-wide concurrency or
rate limit (docs/flow-control.md).

A plain claim (:func:`django_jobq.claims.claim`) leaves limited queues and kinds out. A
limited claim takes their jobs in one transaction:

1. lock the rows of the limited queues and kinds it may claim for (``sql.flow.LOCK_LIMIT_STATES``);
   a claim for idle handler threads waits at most 100 ms for those another worker's limited
   claim holds (it holds them a few milliseconds), a claim for the prefetch alone not at
   all; a row not locked is left to that worker, the claim goes on with the others, and the
   worker tries it again soon (:func:`_lock_and_count`);
2. count their jobs holding a live lease, and their recent starts, fleet-wide
   (``sql.flow.COUNT_LIMITED``): a new statement, so it sees every claim committed before
   the lock, and no other claim can take jobs under these limits until this transaction
   ends;
3. claim, per limited queue and kind (and per pair of both), at most what the limits leave
   (``claims.claim``, so lapsed leases first, lanes and pauses honoured);
4. log the starts for the rate limits (``jobq_limit_start``, ``sql.flow.RECORD_STARTS``:
   one row per rate limit, counting the jobs the claim took under it), and commit.

Steps 1 and 2 travel with the ``BEGIN`` in one round trip, step 4 with the ``COMMIT``
(:mod:`django_jobq.pipelined_transaction`): three round trips in all for a claim of one
limited queue, where each statement on its own took six, and the locks other workers' limited
claims wait for are held for two of them (:func:`_count_then_claim`).

Far from the limits (``FlowState.claim_first``: the worker's last count found every limit
far from binding), the order changes (:func:`_claim_then_count`): step 3 comes first,
without the locks, then step 1; instead of steps 2 and 4, one statement
(``sql.flow.ADMIT_CLAIMED``) counts, holding the claim's own jobs (found server-side) as
running, logs their starts, and fails when they do not fit a limit (or a limit's row is
gone), so the ``COMMIT`` never runs: the claim is rolled back and made again in the first
order. A claim of one limited queue or kind sends all of it, ``BEGIN`` to ``COMMIT``, in
one round trip, as a plain claim does (its first claim statement only: when more would have
followed, the claim comes back short and the worker claims again at once); a claim of
several sends ``BEGIN`` with its first claim statement, and the locks, the admission and
``COMMIT`` after its last. The locks are then held only while PostgreSQL runs those
statements: never through a claim statement, nor while the worker waits for its turn on a
busy machine, so many worker processes do not queue behind each other's claims.

The logs count starts, not claims: the row a claim writes counts its jobs' starts for as
long as they may begin after it (:class:`RatedStart`); a rate-limited job whose handler
starts later than that moves its start out of that row into one of its own, stamped with
the moment it starts (:func:`confirm_start`, ``sql.flow.CONFIRM_START``), before it runs,
so a handler that starts late behind its claim (a busy machine, a long wait in the
prefetch) still counts from its start. A prompt start costs no statement.

So the limits are exact: never more jobs of a limited queue or kind running at once than its
concurrency limit, never more started in any window than its rate limit, whichever worker
claims. A lapsed lease (its worker died) holds no slot: its job is claimable, and reclaiming
it counts again. A rate limit counts starts over its window widened by
:func:`rate_window` (2 %, at most a second): a start stamped at most that margin before its
handler's first line is counted in every window that holds the handler's start. (A stamp
later than its start is safe: it only counts longer.)

Limited jobs are claimed for idle handler slots only, except those whose every limit is
far from binding (:func:`far_from_binding`): they fill the worker's prefetch too, as a
plain claim does (so a tight limit on one kind does not keep a limited queue's other jobs
out of the prefetch). A prefetched job holds a slot of its limit while it waits for a
handler thread, so near a limit that would let one worker's prefetch hold slots while
another worker sat idle. A claim that may fill the prefetch stamps its rate limits' row
:func:`prefetch_cover` ahead of the clock, so the row counts every start within that long
of the claim (plus the margin): jobs taken from the prefetch start without a statement,
however many the claim took, and the count a claim reads is a row per claim, not per
start.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import psycopg

from . import claims, db, sql
from .claim_positions import ClaimPositions
from .claims import ClaimedJob
from .conf import get_settings
from .flow_state import FlowState, Limits, served_limited_queues
from .pipelined_transaction import PipelinedTransaction

#: Seconds a limit's row that a claim waited for in vain (another worker's limited claim
#: held it past ``sql.flow.SET_LIMIT_LOCK_TIMEOUT``) is skipped without a wait.
STUCK_ROW_BACKOFF = 1.0

#: A rate limit's window is widened by this fraction of it (at most
#: :data:`MAX_RATE_WINDOW_MARGIN` seconds), see the module docs.
RATE_WINDOW_MARGIN = 0.02
MAX_RATE_WINDOW_MARGIN = 1.0

#: A claim that may fill the prefetch stamps its rate limits' starts this fraction of the
#: window ahead of the clock (at most :data:`MAX_PREFETCH_COVER` seconds), see the module docs.
PREFETCH_COVER = 0.25
MAX_PREFETCH_COVER = 10.0


def rate_window(window: float) -> float:
    """Seconds over which a rate limit of ``window`` seconds counts starts."""
    return window + min(window * RATE_WINDOW_MARGIN, MAX_RATE_WINDOW_MARGIN)


def prefetch_cover(window: float) -> float:
    """Seconds ahead of the clock a claim that may fill the prefetch stamps the starts of a
    rate limit of ``window`` seconds: a job it took that starts within that long of the
    claim (plus half the margin, :class:`RatedStart`) is counted without a statement of its
    own. The cost: until it leaves the window, such a row counts its starts that much
    longer, which only claims far from the limit pay (:func:`far_from_binding`)."""
    return min(window * PREFETCH_COVER, MAX_PREFETCH_COVER)


def _margin(limits: Limits) -> float:
    """The seconds a rate-limited start may follow its stamp and still count as stamped."""
    assert limits.rate is not None
    return rate_window(limits.rate.window) - limits.rate.window


@dataclass(frozen=True)
class RatedStart:
    """Where a rate-limited job's start is logged: its rate-limited ``(scope, name)`` keys,
    and until when (``time.monotonic()`` seconds) the row its claim stamped counts its
    start without a :func:`confirm_start`. A row stamped ``S`` counts a start until it
    leaves the window widened by the margin (:func:`rate_window`), so every start up to
    ``S`` plus the margin. The claim stamps its row ahead of the database clock (by the
    margin, or by :func:`prefetch_cover` when it may fill the prefetch), and that clock
    reads later than the moment the worker sent the statement; ``covered_until`` is that
    moment plus the stamp's lead and half the margin, so a handler whose check comes
    before it starts within the margin of the stamp, the other half of the margin covering
    what runs between the check and the handler's first line (see the module docs)."""

    keys: tuple[tuple[str, str], ...]
    covered_until: float
    #: The ids of the rows (``jobq_limit_start``) its claim logged its start in, one per key.
    rows: tuple[int, ...]
    #: Each key's margin (:func:`rate_window`), in seconds: how far ahead of the clock a
    #: late start is stamped (:func:`confirm_start`).
    margins: tuple[float, ...]

    def needs_confirming(self) -> bool:
        """Whether the handler, starting now, must stamp its start (:func:`confirm_start`)."""
        return time.monotonic() > self.covered_until


@dataclass(frozen=True)
class LimitedClaim:
    """What a limited claim did: the ``jobs`` it claimed (claim order within each limited
    queue or kind); ``held_elsewhere``: another worker's limited claim held a limit's row
    past ``sql.flow.SET_LIMIT_LOCK_TIMEOUT`` (try again soon); ``next_start_in``: seconds
    until a rate limit that stopped this claim lets a job start again (``None``: none did);
    ``rated``: per job id, where its start is logged (:class:`RatedStart`);
    ``far_from_binding``: a limit it counted was far from binding
    (:func:`far_from_binding`), so the jobs under it could fill the prefetch too (a worker
    with no idle slot may claim again for its prefetch); ``full``: more jobs may wait
    (claim again at once): it claimed as many as it asked for, or, made in one round trip,
    it stopped short of looking for all of them (:func:`_after_front`)."""

    jobs: list[ClaimedJob]
    held_elsewhere: bool = False
    next_start_in: float | None = None
    rated: dict[int, RatedStart] = field(default_factory=dict)
    far_from_binding: bool = False
    full: bool = False


class Rooms(NamedTuple):
    """What a count of limits leaves (:func:`_rooms`): per limit, ``room``, the jobs it may
    start now (the nearer of its concurrency and rate limits), and ``rate_room``, the starts
    its rate limit alone leaves in its window (limits with a rate only); and
    ``next_start_in``, the seconds until the first rate limit that leaves none lets a job
    start (``None``: none is stopped by its rate)."""

    room: dict[tuple[str, str], int]
    rate_room: dict[tuple[str, str], int]
    next_start_in: float | None


def claim_limited(
    connection: psycopg.Connection[Any],
    *,
    worker_id: str,
    limit: int,
    prefetch: int = 0,
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
        prefetch: how many more it may claim into its prefetch, taken only under limits
            that are all far from binding (:func:`far_from_binding`).
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
    if limit + prefetch <= 0 or not (queue_keys or kind_keys):
        return LimitedClaim([])
    keys = [("queue", name) for name in queue_keys] + [("kind", name) for name in kind_keys]
    claim: dict[str, Any] = {"worker_id": worker_id, "queues": queues, "kinds": kinds}
    try:
        if state.claim_first and not _any_stuck(state, keys):
            claimed = _claim_then_count(connection, state, keys, limit, prefetch, **claim)
            if claimed is not None:
                return claimed
        return _count_then_claim(connection, state, keys, limit, prefetch, **claim)
    except BaseException:
        # Rolled back: the jobs the positions moved past are ready again.
        state.positions.clear()
        raise


def _count_then_claim(
    connection: psycopg.Connection[Any],
    state: FlowState,
    keys: list[tuple[str, str]],
    limit: int,
    prefetch: int,
    *,
    worker_id: str,
    queues: Sequence[str] | None,
    kinds: Collection[str],
) -> LimitedClaim:
    """Lock the rows of the limits ``keys``, count, then claim what they leave (steps 1 to
    4 of the module docs); :func:`claim_limited`'s arguments."""
    try:
        with PipelinedTransaction(connection) as transaction:
            # Only a claim for idle handler threads waits for a row another worker's claim
            # holds: one for the prefetch alone tries again on the loop's next turn.
            locked, counted = _lock_and_count(connection, transaction, state, keys, wait=limit > 0)
            if locked is None:
                # A limit's row is gone (deleted by hand): loading the state again writes it.
                state.guard.changed = True
                return LimitedClaim([])
            held_elsewhere = len(locked) < len(keys)
            if not locked:
                return LimitedClaim([], held_elsewhere=True)
            room, next_start_in = counted.room, counted.next_start_in
            far = _far_keys(state, counted, limit + prefetch)
            state.claim_first = len(far) == len(room) and not held_elsewhere
            wanted = limit + prefetch if far else limit
            cursor = connection.cursor()
            plans = _plans(state, locked, queues=queues, kinds=kinds)
            jobs = _claim_within(
                cursor, limit, prefetch, state, room, far, plans, worker_id=worker_id
            )
            if state.guard.changed:
                return LimitedClaim([])
            # Jobs past the idle slots wait in the prefetch: their rows are stamped ahead.
            prefetched = len(jobs) > limit
            with transaction.commit():
                record = _record_starts(cursor, state, locked, jobs, prefetching=prefetched)
            rated = record()
    except psycopg.errors.LockNotAvailable:  # a table lock held elsewhere past the timeout
        return LimitedClaim([], held_elsewhere=True)
    return LimitedClaim(
        jobs,
        held_elsewhere=held_elsewhere,
        next_start_in=next_start_in,
        rated=rated,
        far_from_binding=bool(far),
        full=bool(jobs) and len(jobs) == wanted,
    )


def _claim_then_count(
    connection: psycopg.Connection[Any],
    state: FlowState,
    keys: list[tuple[str, str]],
    limit: int,
    prefetch: int,
    *,
    worker_id: str,
    queues: Sequence[str] | None,
    kinds: Collection[str],
) -> LimitedClaim | None:
    """Claim first, then lock the rows of the limits ``keys``, count and commit, for limits
    the last count found far from binding (``state.claim_first``; see the module docs):
    ``sql.flow.ADMIT_CLAIMED`` admits the claim's jobs, or refuses them all and the
    ``COMMIT`` does not happen. :func:`claim_limited`'s arguments.

    A claim of one set of limits (one limited queue or kind) travels whole in one round
    trip (:func:`_claim_in_one_round_trip`); if it found nothing where more jobs may wait
    (behind its positions, or past its first statement), it looks further at once as a
    claim of several sets of limits does (:func:`_claim_statements_first`).

    Returns:
        A :class:`LimitedClaim`; or ``None`` when the admission refused the claim (the jobs
        did not fit, or a limit's row is gone) or a limit's row stayed held elsewhere past
        the lock timeout: the transaction rolled back, nothing was claimed, and the caller
        claims again with the locks taken first (:func:`_count_then_claim`).
    """
    plans = _plans(state, keys, queues=queues, kinds=kinds)
    claim: dict[str, Any] = {"worker_id": worker_id, "limit": limit, "prefetch": prefetch}
    try:
        if len(plans) == 1 and plans[0].keys not in state.walk_next:
            claimed = _claim_in_one_round_trip(connection, state, keys, plans[0], **claim)
            if claimed.jobs or not claimed.full:
                return claimed
        return _claim_statements_first(connection, state, keys, plans, **claim)
    except psycopg.errors.LockNotAvailable:
        # Another worker's limited claim holds a row past the timeout: claim without it.
        state.stuck_until.update((key, time.monotonic() + STUCK_ROW_BACKOFF) for key in keys)
        state.positions.clear()
        return None
    except psycopg.errors.InvalidTextRepresentation as refused:
        if sql.flow.LIMIT_REFUSED not in str(refused):
            raise
        state.claim_first = False
        state.positions.clear()
        return None


def _claim_in_one_round_trip(
    connection: psycopg.Connection[Any],
    state: FlowState,
    keys: list[tuple[str, str]],
    plan: _Plan,
    *,
    worker_id: str,
    limit: int,
    prefetch: int,
) -> LimitedClaim:
    """A claim made before its count, of one ``plan``, in one round trip: ``BEGIN``, the
    claim's first statement (:func:`django_jobq.claims.send_front`), the locks, the
    admission (:func:`_send_admission`) and ``COMMIT``. Its starts are stamped as those of
    a claim that fills the prefetch when it may (``prefetch``). If that first statement
    would have been followed by more (:class:`django_jobq.claims.FrontAfter`), or it read
    from positions and found nothing, the claim comes back short with ``full`` set: claim
    again at once (:func:`_after_front`).

    Raises:
        psycopg.Error: as :func:`_claim_then_count` catches them, and any other.
    """
    wanted = limit + prefetch
    admission: db.LongStatementCursor[Any] = db.LongStatementCursor(connection)
    positions = _positions_for(state, plan.keys)
    from_positions = positions.is_set()
    with PipelinedTransaction(connection) as transaction, transaction.whole():
        read_front = claims.send_front(
            connection.cursor(),
            worker_id=worker_id,
            limit=wanted,
            positions=positions,
            flow=state.guard,
            **plan.claim_arguments(),
        )
        sent = _send_admission(connection, admission, state, keys, worker_id, prefetch > 0)
    front = read_front()
    more = _after_front(state, plan.keys, positions, from_positions, front, wanted)
    return _admitted(
        admission, state, keys, front.jobs, wanted, sent=sent, prefetching=prefetch > 0, more=more
    )


def _claim_statements_first(
    connection: psycopg.Connection[Any],
    state: FlowState,
    keys: list[tuple[str, str]],
    plans: list[_Plan],
    *,
    worker_id: str,
    limit: int,
    prefetch: int,
) -> LimitedClaim:
    """A claim made before its count, of ``plans``, each with every statement it needs
    (:func:`_claim_plan`): ``BEGIN`` travels with the first claim statement; the locks, the
    admission (:func:`_send_admission`) and ``COMMIT`` together after the last.

    Raises:
        psycopg.Error: as :func:`_claim_then_count` catches them, and any other.
    """
    wanted = limit + prefetch
    admission: db.LongStatementCursor[Any] = db.LongStatementCursor(connection)
    with PipelinedTransaction(connection) as transaction:
        with transaction.begin():
            # Results read inside the block: the first claim statement goes with BEGIN.
            # The room is not known yet: the admission checks that what was taken fits.
            room = dict.fromkeys(keys, wanted)
            jobs = _claim_within(
                connection.cursor(),
                limit,
                prefetch,
                state,
                room,
                set(keys),
                plans,
                worker_id=worker_id,
            )
        if state.guard.changed:
            return LimitedClaim([])
        prefetching = len(jobs) > limit
        with transaction.commit():
            sent = _send_admission(connection, admission, state, keys, worker_id, prefetching)
    return _admitted(admission, state, keys, jobs, wanted, sent=sent, prefetching=prefetching)


def _admitted(
    admission: psycopg.Cursor[Any],
    state: FlowState,
    keys: list[tuple[str, str]],
    jobs: list[ClaimedJob],
    wanted: int,
    *,
    sent: float,
    prefetching: bool,
    more: bool = False,
) -> LimitedClaim:
    """The :class:`LimitedClaim` of a claim made before its count that took ``jobs`` of the
    ``wanted``, once its admission (:func:`_send_admission`, sent at ``sent``) committed;
    ``more``: more jobs may wait that it did not look for. Notes in ``state`` whether the
    next claim may be made first too."""
    if state.guard.changed:
        return LimitedClaim([])
    rooms, rows = _read_admission(admission, state, keys)
    far = _far_keys(state, rooms, wanted)
    state.claim_first = len(far) == len(rooms.room)
    return LimitedClaim(
        jobs,
        next_start_in=rooms.next_start_in,
        rated=_rated_starts(state, jobs, rows, sent=sent, prefetching=prefetching),
        far_from_binding=bool(far),
        full=more or (bool(jobs) and len(jobs) == wanted),
    )


def _after_front(
    state: FlowState,
    keys: tuple[tuple[str, str], ...],
    positions: ClaimPositions,
    from_positions: bool,
    front: claims.FrontClaim,
    wanted: int,
) -> bool:
    """After a claim of one round trip (:func:`_claim_in_one_round_trip`) under the limits
    ``keys`` that read from ``positions`` (moved on since; ``from_positions``: they were
    set before) and asked for ``wanted`` jobs: keep the positions where
    :func:`_claim_plan` would, and return whether more jobs may wait that the claim did not
    look for (claim again at once): the front was followed by more (reading on, or a walk,
    which the next claim of these limits then makes), or the claim read from positions and
    found nothing (the next reads from the start)."""
    if front.after is claims.FrontAfter.WALK:
        state.walk_next.add(keys)
        return True
    if front.after is claims.FrontAfter.READ_ON or len(front.jobs) == wanted:
        state.positions[keys] = positions
        return front.after is claims.FrontAfter.READ_ON
    return from_positions and not front.jobs and not state.guard.changed


def _any_stuck(state: FlowState, keys: list[tuple[str, str]]) -> bool:
    """Whether a row of ``keys`` was recently held elsewhere past the lock timeout."""
    now = time.monotonic()
    return any(state.stuck_until.get(key, 0.0) > now for key in keys)


def _lock_and_count(
    connection: psycopg.Connection[Any],
    transaction: PipelinedTransaction,
    state: FlowState,
    keys: list[tuple[str, str]],
    *,
    wait: bool,
) -> tuple[list[tuple[str, str]] | None, Rooms]:
    """Open the claim's transaction: lock the rows of the limits ``keys`` (``(scope, name)``
    pairs) free at once (``sql.flow.LOCK_LIMIT_STATES``) and count every key's jobs
    (:func:`_send_count`), both sent with the ``BEGIN`` in one round trip. The count is a
    statement of its own after the lock, so it sees every claim committed before the lock
    was taken; what it counted of a key left unlocked is not read.

    Then, in a savepoint, the rows another worker's limited claim holds are waited for, at
    most the lock timeout (``sql.flow.WAIT_FOR_LIMIT_STATES``), and counted again if any
    was locked so. A row waited for in vain is not waited for again for
    :data:`STUCK_ROW_BACKOFF` seconds (``state.stuck_until``): a claim stuck elsewhere
    costs this worker's turns nothing, and the other limits' jobs are claimed meanwhile.

    Returns:
        The locked keys (those not locked are held elsewhere), or ``None`` when a row is
        gone; and what the count leaves (:func:`_read_count`).
    """
    lock_cursor = connection.cursor()
    count_cursor = connection.cursor()
    with transaction.begin():
        lock_cursor.execute(sql.flow.LOCK_LIMIT_STATES, _key_params(keys))
        _send_count(count_cursor, state, keys)
    locked = [(scope, name) for scope, name in lock_cursor.fetchall()]
    now = time.monotonic()
    waited = [k for k in keys if wait and k not in locked and state.stuck_until.get(k, 0.0) <= now]
    if waited:
        try:
            with connection.transaction():  # a savepoint: the transaction is open
                lock_cursor.execute(sql.flow.SET_LIMIT_LOCK_TIMEOUT)
                lock_cursor.execute(sql.flow.WAIT_FOR_LIMIT_STATES, _key_params(waited))
                got = [(scope, name) for scope, name in lock_cursor.fetchall()]
        except psycopg.errors.LockNotAvailable:
            state.stuck_until.update((key, now + STUCK_ROW_BACKOFF) for key in waited)
        else:
            if len(got) < len(waited):
                return None, Rooms({}, {}, None)
            locked += got
            _send_count(count_cursor, state, locked)
    return locked, _read_count(count_cursor, state, locked)


def _key_params(keys: list[tuple[str, str]]) -> dict[str, list[str]]:
    """``keys`` as ``LOCK_LIMIT_STATES``'s parameters."""
    return {
        "queues": [name for scope, name in keys if scope == "queue"],
        "kinds": [name for scope, name in keys if scope == "kind"],
    }


def _send_count(cursor: psycopg.Cursor[Any], state: FlowState, keys: list[tuple[str, str]]) -> None:
    """Count the jobs running and recently started under each limit of ``keys``
    (``sql.flow.COUNT_LIMITED``, its generic plan: ``sql.flow.PLAN_GENERICALLY``, then
    ``sql.flow.PLAN_AS_CONFIGURED`` for the claim statements after it); :func:`_read_count`
    reads the result."""
    limits = [_limits(state, key) for key in keys]
    cursor.connection.execute(sql.flow.PLAN_GENERICALLY)
    cursor.execute(
        sql.flow.COUNT_LIMITED,
        {
            "scopes": [scope for scope, _ in keys],
            "names": [name for _, name in keys],
            "windows": [each.rate and rate_window(each.rate.window) for each in limits],
            "counts": [each.rate and each.rate.count for each in limits],
        },
    )
    cursor.connection.execute(sql.flow.PLAN_AS_CONFIGURED)


def _read_count(
    cursor: psycopg.Cursor[Any], state: FlowState, locked: list[tuple[str, str]]
) -> Rooms:
    """From :func:`_send_count`'s result, what the ``locked`` limits leave."""
    counts = {
        (scope, name): (live, recent, frees_in)
        for scope, name, live, recent, frees_in in cursor.fetchall()
    }
    return _rooms(state, {key: counts[key] for key in locked})


def _send_admission(
    connection: psycopg.Connection[Any],
    cursor: db.LongStatementCursor[Any],
    state: FlowState,
    keys: list[tuple[str, str]],
    worker_id: str,
    prefetching: bool,
) -> float:
    """Send the end of a claim made before its count (:func:`_claim_then_count`): if it
    claimed a job, wait at most the lock timeout for the rows of the limits ``keys``
    (``sql.flow.SET_ADMISSION_SETTINGS``, ``sql.flow.WAIT_FOR_LIMIT_STATES_IF_CLAIMED``: a
    claim that took nothing locks nothing), then admit the jobs this transaction claimed as
    ``worker_id``, logging their starts (``prefetching``: see :func:`_ahead`), or refuse
    them (``sql.flow.ADMIT_CLAIMED``, on ``cursor``, its generic plan; :func:`_read_admission`
    reads it).
    Returns the ``time.monotonic()`` moment it was sent (the starts' clock reads later)."""
    limits = [_limits(state, key) for key in keys]
    sent = time.monotonic()
    connection.execute(sql.flow.SET_ADMISSION_SETTINGS)
    connection.execute(sql.flow.WAIT_FOR_LIMIT_STATES_IF_CLAIMED, _key_params(keys))
    cursor.execute_named(
        sql.flow.ADMIT_CLAIMED,
        {
            "scopes": [scope for scope, _ in keys],
            "names": [name for _, name in keys],
            "concurrencies": [each.concurrency for each in limits],
            "windows": [each.rate and rate_window(each.rate.window) for each in limits],
            "counts": [each.rate and each.rate.count for each in limits],
            "aheads": [
                each.rate and _ahead(state, key, prefetching)
                for key, each in zip(keys, limits, strict=True)
            ],
            "worker_id": worker_id,
            "flow_digest": state.guard.digest,
        },
    )
    return sent


def _read_admission(
    cursor: psycopg.Cursor[Any], state: FlowState, keys: list[tuple[str, str]]
) -> tuple[Rooms, dict[tuple[str, str], int]]:
    """From :func:`_send_admission`'s result: what the limits of ``keys`` left before this
    transaction's claim (as :func:`_read_count`), and the id of the row logging the claim's
    starts per rate-limited key that counts any."""
    counts: dict[tuple[str, str], tuple[int, int, float | None]] = {}
    rows: dict[tuple[str, str], int] = {}
    for scope, name, live, recent, frees_in, own, start_id, _ in cursor.fetchall():
        counts[scope, name] = (live - own, recent, frees_in)
        if start_id is not None:
            rows[scope, name] = start_id
    return _rooms(state, {key: counts[key] for key in keys}), rows


def _rooms(state: FlowState, counts: dict[tuple[str, str], tuple[int, int, float | None]]) -> Rooms:
    """What the limits leave given their ``counts`` (live jobs, recent starts and
    ``frees_in``, :func:`_room`)."""
    rooms = Rooms({}, {}, None)
    next_start_in: float | None = None
    for key, (live, recent, frees_in) in counts.items():
        limits = _limits(state, key)
        rooms.room[key], wait = _room(limits, live, recent, frees_in)
        if limits.rate is not None:
            rooms.rate_room[key] = max(limits.rate.count - recent, 0)
        if wait is not None:
            next_start_in = wait if next_start_in is None else min(next_start_in, wait)
    return rooms._replace(next_start_in=next_start_in)


def far_from_binding(state: FlowState, rooms: Rooms, wanted: int) -> bool:
    """Whether a claim of ``wanted`` jobs may fill a worker's prefetch: every counted limit
    leaves room (``rooms.room``: jobs it may still start) for at least twice ``wanted``, so
    after this claim at least as much is left for other workers' idle slots, and a rate
    limit's own room (``rooms.rate_room``) at least half its count too: less than half its
    window's starts are used. A prefetched
    job holds its slot (its start, for a rate limit) while it waits for a handler thread,
    and a prefetching claim's starts count a little longer (:func:`prefetch_cover`); near a
    limit that would idle another worker, or lower the rate a busy queue reaches, so there
    jobs are claimed for idle slots only. (A rate limit's room comes back only as its
    window slides: a queue with a backlog uses it all, and is never far from it.)"""
    return len(_far_keys(state, rooms, wanted)) == len(rooms.room)


def _far_keys(state: FlowState, rooms: Rooms, wanted: int) -> set[tuple[str, str]]:
    """The limits of ``rooms`` far from binding for a claim of ``wanted`` jobs (see
    :func:`far_from_binding`): the jobs under them, and under no limit nearer, may fill the
    prefetch."""
    return {
        key
        for key, available in rooms.room.items()
        if available >= 2 * wanted and 2 * rooms.rate_room.get(key, 0) >= _rate_count(state, key)
    }


def _rate_count(state: FlowState, key: tuple[str, str]) -> int:
    """The starts per window the rate limit of ``key`` allows (0: it has none)."""
    rate = _limits(state, key).rate
    return 0 if rate is None else rate.count


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


class _Plan(NamedTuple):
    """One claim statement's worth of a limited claim: the jobs under the limits ``keys``
    (a limited queue, a limited kind, or a pair of both), of ``queues`` (``None``: every
    queue but ``excluded_queues``) and ``kinds``."""

    keys: tuple[tuple[str, str], ...]
    queues: list[str] | None
    kinds: list[str]
    excluded_queues: frozenset[str]

    def claim_arguments(self) -> dict[str, Any]:
        """The plan as :func:`django_jobq.claims.claim`'s arguments."""
        return {"queues": self.queues, "kinds": self.kinds, "excluded_queues": self.excluded_queues}


def _plans(
    state: FlowState,
    locked: Collection[tuple[str, str]],
    *,
    queues: Sequence[str] | None,
    kinds: Collection[str],
) -> list[_Plan]:
    """What a limited claim under the ``locked`` limits claims, in order: each limited
    queue's jobs of unlimited kinds, then each limited kind's jobs in the queues open to
    plain claims, then each pair's; leaving out those the worker cannot take (no kind of
    it, no queue it serves). ``queues`` and ``kinds``: the worker's. A job under a limit
    not ``locked`` (another worker holds its row) is in no plan."""
    excluded = state.excluded_queues()
    locked_queues = [name for scope, name in locked if scope == "queue"]
    locked_kinds = [name for scope, name in locked if scope == "kind"]
    unlimited_kinds = state.unlimited_kinds(kinds)
    open_queues = None if queues is None else [q for q in queues if q not in excluded]
    plans = [_Plan((("queue", q),), [q], unlimited_kinds, frozenset()) for q in locked_queues]
    if open_queues != []:
        plans += [
            _Plan(
                (("kind", k),), open_queues, [k], excluded if open_queues is None else frozenset()
            )
            for k in locked_kinds
        ]
    plans += [
        _Plan((("queue", q), ("kind", k)), [q], [k], frozenset())
        for q in locked_queues
        for k in locked_kinds
    ]
    return [plan for plan in plans if plan.kinds]


def _claim_within(
    cursor: psycopg.Cursor[Any],
    limit: int,
    prefetch: int,
    state: FlowState,
    room: dict[tuple[str, str], int],
    far: Collection[tuple[str, str]],
    plans: list[_Plan],
    *,
    worker_id: str,
) -> list[ClaimedJob]:
    """Claim, for each of ``plans`` (:func:`_plans`), what the room of all its limits
    allows, up to ``limit`` jobs in all (the idle handler slots), or ``limit`` plus
    ``prefetch`` under limits that are all in ``far`` (far from binding: their jobs may
    fill the prefetch); decrement ``room`` by what was claimed."""
    jobs: list[ClaimedJob] = []
    for plan in plans:
        most = limit + prefetch if all(key in far for key in plan.keys) else limit
        allowed = min([most - len(jobs), *(room[key] for key in plan.keys)])
        if allowed <= 0:
            continue
        claimed = _claim_plan(cursor, state, plan, worker_id=worker_id, limit=allowed)
        if state.guard.changed:
            return []
        for key in plan.keys:
            room[key] -= len(claimed)
        jobs += claimed
    return jobs


def _claim_plan(
    cursor: psycopg.Cursor[Any], state: FlowState, plan: _Plan, *, worker_id: str, limit: int
) -> list[ClaimedJob]:
    """Claim up to ``limit`` jobs of ``plan`` (:func:`django_jobq.claims.claim`), reading
    from where the last claim under its limits stopped (``state.positions``, see
    :mod:`django_jobq.claim_positions`): in a backlog, a claim does not walk the entries of
    every job claimed before it. A job can come to sort behind the positions (a released
    job, a late commit, a row a lock hid); a plain claim's probe finds it, here:

    - positions are dropped once their probe is due (:func:`_positions_for`): the claim
      reads from the start at least that often;
    - a claim from positions that finds nothing reads again from the start at once, so a
      claim that returns nothing saw every job it could take;
    - positions are kept only after a claim that took all it asked for (a backlog): after
      one that came back short, the next claim reads from the start (one statement, for a
      quiet limited queue too)."""
    state.walk_next.discard(plan.keys)  # this claim walks, if its front calls for it
    positions = _positions_for(state, plan.keys)
    from_positions = positions.is_set()
    claim = {"worker_id": worker_id, "limit": limit, "flow": state.guard, **plan.claim_arguments()}
    claimed = claims.claim(cursor, positions=positions, **claim)
    if from_positions and not claimed and not state.guard.changed:
        positions = ClaimPositions()
        claimed = claims.claim(cursor, positions=positions, **claim)
    if len(claimed) == limit:
        state.positions[plan.keys] = positions
    return claimed


def _positions_for(state: FlowState, keys: tuple[tuple[str, str], ...]) -> ClaimPositions:
    """Where a claim under the limits ``keys`` reads from, taken out of ``state.positions``
    (the claim puts them back if they stay true): the last claim's positions, or the start
    once their probe is due (:meth:`ClaimPositions.seconds_until_probe`) or when none is
    kept."""
    positions = state.positions.pop(keys, None)
    if positions is None or positions.seconds_until_probe() == 0:
        return ClaimPositions()
    return positions


def _record_starts(
    cursor: psycopg.Cursor[Any],
    state: FlowState,
    locked: Collection[tuple[str, str]],
    jobs: list[ClaimedJob],
    *,
    prefetching: bool,
) -> Callable[[], dict[int, RatedStart]]:
    """Log the claimed jobs' starts for their rate-limited queues and kinds among
    ``locked`` (the limits whose rows the claim locked), a row per limit
    (``sql.flow.RECORD_STARTS``), stamped ahead of the clock (:func:`_ahead`; further when
    ``prefetching``: the claim may have filled the prefetch). The statement is sent, not
    waited for (it travels with the ``COMMIT``); the function returned reads its result
    once it has run: where each such job's start is logged (:func:`_rated_starts`)."""
    starts: dict[tuple[str, str], int] = {}
    for job in jobs:
        for key in _rated_keys(state, job, locked):
            starts[key] = starts.get(key, 0) + 1
    if not starts:
        return lambda: {}
    sent = time.monotonic()  # the statement's clock reads later
    cursor.execute(
        sql.flow.RECORD_STARTS,
        {
            "scopes": [scope for scope, _ in starts],
            "names": [name for _, name in starts],
            "starts": list(starts.values()),
            "aheads": [_ahead(state, key, prefetching) for key in starts],
            "windows": [_window(state, key) for key in starts],
        },
    )

    def rated() -> dict[int, RatedStart]:
        rows = {(scope, name): row_id for row_id, scope, name in cursor.fetchall()}
        return _rated_starts(state, jobs, rows, sent=sent, prefetching=prefetching)

    return rated


def _rated_keys(
    state: FlowState, job: ClaimedJob, among: Collection[tuple[str, str]]
) -> tuple[tuple[str, str], ...]:
    """The keys of ``among`` with a rate limit that count ``job``'s start."""
    return tuple(
        key
        for key in (("queue", job.queue), ("kind", job.kind))
        if key in among and _limits(state, key).rate is not None
    )


def _rated_starts(
    state: FlowState,
    jobs: list[ClaimedJob],
    rows: dict[tuple[str, str], int],
    *,
    sent: float,
    prefetching: bool,
) -> dict[int, RatedStart]:
    """Per job of ``jobs`` under a rate limit, where its start is logged: ``rows``, the id
    of the row logging a claim's starts per rate-limited key, written by a statement sent
    at ``sent`` (``time.monotonic()``; its clock reads later), ``prefetching`` or not
    (:func:`_ahead`). Jobs under the same limits share one :class:`RatedStart`."""
    keyed = {job.id: keys for job in jobs if (keys := _rated_keys(state, job, rows))}
    # Half the margin: the other half covers the moment between the check and the
    # handler's first line (the job_started signal, a thread hop for async code).
    logged = {
        keys: RatedStart(
            keys,
            covered_until=sent
            + min(
                _ahead(state, key, prefetching) + _margin(_limits(state, key)) / 2 for key in keys
            ),
            rows=tuple(rows[key] for key in keys),
            margins=tuple(_margin(_limits(state, key)) for key in keys),
        )
        for keys in set(keyed.values())
    }
    return {job_id: logged[keys] for job_id, keys in keyed.items()}


def _window(state: FlowState, key: tuple[str, str]) -> float:
    """The seconds over which the rate limit of ``key`` counts starts (:func:`rate_window`)."""
    rate = _limits(state, key).rate
    assert rate is not None
    return rate_window(rate.window)


def _ahead(state: FlowState, key: tuple[str, str], prefetching: bool) -> float:
    """Seconds ahead of the clock a claim stamps the starts of ``key``'s rate limit: the
    margin (the commit and the hand-off to a handler thread take time too), or
    :func:`prefetch_cover` (longer) when the claim may have filled the prefetch."""
    limits = _limits(state, key)
    assert limits.rate is not None
    return prefetch_cover(limits.rate.window) if prefetching else _margin(limits)


def confirm_start(start: RatedStart) -> None:
    """Move the start of a rate-limited job whose handler starts later than its claim's
    row counts it (:meth:`RatedStart.needs_confirming`; ``start`` as
    :attr:`LimitedClaim.rated` gives it) out of its claim's rows into rows of its own,
    stamped with the database's clock once the claim's rows are locked, the margin ahead, in
    a statement of its own on this thread's Django connection to the queue database
    (``sql.flow.CONFIRM_START``). The handler thread calls it just before the handler.

    Such a row counts a start that follows its stamp's clock reading within twice the
    margin. If the statement's round trip took longer than one margin (its commit, or a
    thread kept waiting for the GIL on a busy machine), that is not sure: the start moves
    again, out of the rows just written into newer ones, until a round trip is quick
    enough; the last half margin covers what runs before the handler's first line.

    Raises:
        django.db.Error: the statement failed (the attempt fails like a handler that raised).
    """
    from django.db import connections  # here: the claim side runs on psycopg alone

    rows = list(start.rows)
    with connections[get_settings().DATABASE].cursor() as cursor:
        while True:
            sent = time.monotonic()
            cursor.execute(
                sql.flow.CONFIRM_START,
                {
                    "rows": rows,
                    "scopes": [scope for scope, _ in start.keys],
                    "names": [name for _, name in start.keys],
                    "aheads": list(start.margins),
                },
            )
            moved_to = {(scope, name): row_id for row_id, scope, name in cursor.fetchall()}
            if time.monotonic() - sent <= min(start.margins):
                return
            rows = [moved_to[key] for key in start.keys]
