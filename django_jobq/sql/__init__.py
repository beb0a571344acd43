"""Every raw SQL statement django-jobq runs, named and explained once.

Statements use psycopg's ``%(name)s`` placeholders (``%(name)b`` for a binary parameter) and
are always executed with parameters, never formatted with values. They work on a plain
psycopg 3 cursor and on a Django cursor.
Table names are those of ``models.py`` (``Meta.db_table``); a test checks they agree.

Fencing: a job's ``attempts`` is the number of its current attempt and serves as the lease's
fencing token. Every write a worker makes about a running job names ``(id, attempts)`` and
``status = 'running'``, so a late write from a worker whose job was reclaimed matches no row.
"""

from __future__ import annotations

# The enqueue concern's INSERT template, which ``INSERT_TASK_JOBS`` below composes from
# until the tasks' statements have a module of their own.
from .enqueue import INSERT_JOBS_TEMPLATE as _INSERT_JOBS_TEMPLATE

# -- rows not written by enqueue -----------------------------------------------------------
#
# Another producer (or a hand-written fix) can put values into ``jobq_job`` that ``enqueue``
# never writes. The CHECK constraints of migration 0008 refuse them on new ready rows; rows
# that were there before (the constraints are NOT VALID) or running rows can still hold
# them, so every statement that reads jobs survives them, and the claim names them.

#: A lease length that cannot overflow: the job's visibility timeout, clamped to what
#: ``enqueue`` accepts (1 ms to 10 years). ``now() + `` this is always a valid timestamp.
LEASE_LENGTH = (
    "LEAST(GREATEST(job.visibility_timeout, interval '0.001 seconds'), interval '3650 days')"
)
# The times Python's datetime holds in any session time zone (years 1 to 9999, a day's
# margin): a time returned to the worker is clamped to these.
_EARLIEST = "'0001-01-02 00:00:00+00'::timestamptz"
_LATEST = "'9999-12-30 00:00:00+00'::timestamptz"

#: Why a claimed row must not run, as text (NULL for a healthy row): what the constraints
#: of migration 0008 forbid and only the database can see (the worker checks the payload
#: itself). ``'-infinity'`` and ``'infinity'`` times; a visibility timeout outside 1 ms to
#: 10 years; an attempt count at the integer maximum that is not past ``max_attempts`` (the
#: claim cannot advance it, so the lease would have no fencing token of its own, and the job
#: would run for ever). Reads only the row (cheap per claimed row).
POISON_REASON = f"""CASE
        WHEN NOT isfinite(job.run_at) THEN 'run_at is ' || job.run_at
        WHEN NOT isfinite(job.created_at) THEN 'created_at is ' || job.created_at
        WHEN NOT isfinite(job.expires_at) THEN 'expires_at is ' || job.expires_at
        WHEN job.visibility_timeout <> {LEASE_LENGTH}
            THEN 'visibility_timeout is ' || job.visibility_timeout || ', not 1 ms to 10 years'
        WHEN job.attempts = 2147483647 AND job.max_attempts = 2147483647
            THEN 'attempts is 2147483647, the integer maximum: the attempt number (the '
                 || 'fencing token) cannot advance'
    END"""


# -- claim ---------------------------------------------------------------------------------

# The distinct (queue, kind) pairs of ready jobs, in (queue, kind) order, as a recursive CTE
# ``pairs`` (its statement starts ``WITH RECURSIVE``): a loose index scan of
# ``jobq_job_kind_claim_idx``, one seek per pair (the first job of the next kind of the
# queue, else of the next queue), however many jobs each pair holds. Each row is the pair's
# first ready job in the index's order, which is claim order (``priority``, ``run_at``,
# ``id``): when it is due, it is the pair's first due job. ``{queue_filter}`` narrows it to
# some queues.
_READY_PAIRS_TEMPLATE = """pairs AS (
    (SELECT queue, kind, priority, run_at, id FROM jobq_job
     WHERE status = 'ready'{queue_filter}
     ORDER BY queue, kind, priority DESC, run_at, id
     LIMIT 1)
    UNION ALL
    SELECT next.*
    FROM pairs, LATERAL (
        (SELECT job.queue, job.kind, job.priority, job.run_at, job.id FROM jobq_job AS job
         WHERE job.status = 'ready' AND job.queue = pairs.queue AND job.kind > pairs.kind
         ORDER BY job.queue, job.kind, job.priority DESC, job.run_at, job.id
         LIMIT 1)
        UNION ALL
        (SELECT job.queue, job.kind, job.priority, job.run_at, job.id FROM jobq_job AS job
         WHERE job.status = 'ready' AND job.queue > pairs.queue{queue_filter}
         ORDER BY job.queue, job.kind, job.priority DESC, job.run_at, job.id
         LIMIT 1)
        LIMIT 1
    ) AS next
)"""

# Statements that find their rows by primary key (the claim's lock of the rows it chose,
# every fenced write) spell their status test ``(status = 'ready') IS TRUE`` or
# ``(status = 'running') IS TRUE``: the same test, but one the planner cannot match to the
# predicate of a partial index (``WHERE status = 'ready'``, ``WHERE status = 'running'``).
# Spelt plainly, a planner whose statistics say that few rows match (the table analysed
# while idle, or not since, autovacuum being off) reads that whole index instead of one
# primary-key entry per job; and while the xmin horizon is held back the index keeps an
# entry for every job claimed since, so the statement slows with every claim
# (docs/performance.md, "Large backlogs").
_IS_READY = "(status = 'ready') IS TRUE"
_IS_RUNNING = "(status = 'running') IS TRUE"

# The claim: lock up to ``limit`` claimable rows of the kinds the worker can run
# (``%(kinds)s``, its registry: a worker never claims a job it would have to refuse),
# skipping rows other claimers hold (SKIP LOCKED: never waits, never double-claims), then
# lease them. Claimable means either
#   - lapsed: running, but its lease deadline has passed (the worker died or stalled), the
#     oldest lapse first (served by ``jobq_job_lease_idx``); or
#   - ready and due, in claim order: priority DESC, run_at, id.
# Lapsed rows come first; the ready arm takes what is left of ``limit``.
# The ready arm never walks jobs of kinds the worker lacks, however many wait ahead of its
# own (a rolling deploy's new kind, or a removed one). It comes as two statements, each
# one atomic: ``leases.claim`` runs ``CLAIM_JOBS_*``, small and cheap to plan, and only
# when it may have missed claimable jobs the walk, ``CLAIM_JOBS_WALK_*``, for the rest.
# django-jobq uses no prepared statements (PgBouncer), so every claim pays its statement's
# planning, which grows with the statement. Both read from the worker's claim positions
# (``django_jobq.claim_positions``: where its last claims got to, so that the dead index
# entries of the jobs already claimed are not walked again while vacuum cannot remove
# them), and both start with
#   - ``lapsed``: the rows whose lease lapsed since ``%(lapsed_from)s`` (NULL: ever),
#     locked FOR UPDATE SKIP LOCKED;
#   - ``front``: the first ``%(front)s`` due jobs of the queues in claim order, read without
#     locks (``jobq_job_claim_idx`` for one queue, else ``jobq_job_claim_all_idx``; ``front``
#     is ``limit`` times ``CLAIM_FRONT_FACTOR``), each marked whether the worker has its
#     kind. It reads per priority level: each level with a position
#     (``%(level_priorities)s``) only after its ``(run_at, id)``
#     (``%(level_after_run_ats)s``, NULL for ``-infinity``, and ``%(level_after_ids)s``): an
#     index range that starts there; the levels above ``%(above)s`` and below
#     ``%(below)s`` from their start. Each arm is one ordered index scan that stops at
#     ``%(front)s`` rows (with direct parameters, so the planner estimates them from the
#     statistics; arms over a range of levels joined to an array would be estimated at a
#     handful of rows and read by a bitmap scan of the whole range);
#   - ``fast``: the first served ones of these in claim order that no other claimer holds,
#     as many as ``limit`` minus lapsed, locked FOR UPDATE SKIP LOCKED (the LIMIT counts
#     the rows locked, not the rows skipped), found by primary key (``_IS_READY``).
# When ``front`` held fewer than ``%(front)s`` rows it held every due job, and ``fast``
# took all it could; otherwise jobs of other kinds or rows another claimer holds may fill
# the front while claimable jobs wait behind it: ``leases.claim`` reads on from the moved
# positions, or runs the walk, which finds them.
# Each selection is a MATERIALIZED CTE so it runs exactly once: as a plain subquery the
# planner may re-run a LIMIT subquery inside a nested loop and lease more than ``limit``
# rows. The UPDATE finds its rows with ``id = ANY(ARRAY(...))``, a primary-key lookup:
# joined to the CTEs instead, the planner cannot estimate the computed LIMIT and may scan
# the whole table.
_CLAIM_START = """lapsed AS MATERIALIZED (
    SELECT id, lease_deadline FROM jobq_job
    WHERE status = 'running' AND lease_deadline < now()
      AND lease_deadline >= COALESCE(%(lapsed_from)s, '-infinity'::timestamptz){queue_filter}
      AND kind = ANY(%(kinds)s::text[])
    ORDER BY lease_deadline
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), front AS MATERIALIZED (
    SELECT * FROM (
        (SELECT id, priority, run_at, kind = ANY(%(kinds)s::text[]) AS served FROM jobq_job
         WHERE status = 'ready' AND run_at <= now(){queue_filter}
           AND priority > %(above)s::bigint
         ORDER BY priority DESC, run_at, id
         LIMIT %(front)s)
        UNION ALL
        SELECT candidate.* FROM unnest(%(level_priorities)s::integer[],
                                       %(level_after_run_ats)s::timestamptz[],
                                       %(level_after_ids)s::bigint[])
            AS level(priority, after_run_at, after_id)
        CROSS JOIN LATERAL (
            SELECT id, priority, run_at, kind = ANY(%(kinds)s::text[]) AS served
            FROM jobq_job
            WHERE status = 'ready' AND run_at <= now(){queue_filter}
              AND priority = level.priority
              AND (run_at, id) > (COALESCE(level.after_run_at, '-infinity'::timestamptz),
                                  level.after_id)
            ORDER BY priority DESC, run_at, id
            LIMIT %(front)s
        ) AS candidate
        UNION ALL
        (SELECT id, priority, run_at, kind = ANY(%(kinds)s::text[]) AS served FROM jobq_job
         WHERE status = 'ready' AND run_at <= now(){queue_filter}
           AND priority < %(below)s::bigint
         ORDER BY priority DESC, run_at, id
         LIMIT %(front)s)
    ) AS candidates
    ORDER BY priority DESC, run_at, id
    LIMIT %(front)s
), fast AS MATERIALIZED (
    SELECT id FROM jobq_job
    WHERE id = ANY(ARRAY(SELECT id FROM front WHERE served)) AND {is_ready}
    ORDER BY priority DESC, run_at, id
    LIMIT %(limit)s - (SELECT count(*) FROM lapsed)
    FOR UPDATE SKIP LOCKED
)"""

# The lease of the ``lapsed`` rows and the ``{ready}`` rows, which ends both statements.
# Each claim consumes an attempt; the new attempt number is the lease's fencing token. A
# reclaimed job whose lapsed attempt was its last comes back with attempts > max_attempts,
# and a job past its ``expires_at`` comes back with ``expired``: the worker dead-letters
# either without running it.
# For the metrics, each row also says whether it was ``reclaimed`` (its lease had lapsed)
# and its ``pickup_latency``: seconds from the moment it became claimable to this claim,
# on the database clock. A waiting job became claimable at ``GREATEST(run_at, created_at)``
# (``run_at`` may name a moment before the enqueue, e.g. a schedule's missed tick); a
# reclaimed one when its lease lapsed. The join to the few ``lapsed`` rows is the only cost
# this adds to the claim.
# Rows not written by ``enqueue`` (see ``POISON_REASON``) never make the claim fail: the
# lease is ``LEASE_LENGTH`` (cannot overflow), the attempt count stops at the integer
# maximum, times are returned clamped to what Python can hold and ages are computed from
# epoch seconds (an infinite time gives an infinite age, not an error). The payload comes
# back as JSON text, decoded by the caller row by row (``leases.claim``); ``poison`` names
# what is wrong with a row whose times or lease length only the database can see.
# ``leased`` is the claimed rows joined to ``lapsed``; the statement selects
# ``_CLAIMED_COLUMNS`` from it.
_CLAIM_LEASE = """claimed AS (
    UPDATE jobq_job AS job
    SET status = 'running',
        attempts = job.attempts + (job.attempts < 2147483647)::integer,
        worker_id = %(worker_id)s,
        started_at = now(),
        lease_deadline = now() + {lease_length}
    WHERE job.id = ANY(ARRAY(SELECT id FROM lapsed UNION ALL SELECT id FROM {ready}))
    RETURNING job.id, job.queue, job.kind, job.payload::text AS payload, job.priority,
              LEAST(GREATEST(job.run_at, {earliest}), {latest}) AS run_at, job.attempts,
              job.max_attempts, {lease_length} AS visibility_timeout, job.lease_deadline,
              COALESCE(job.expires_at <= now(), false) AS expired,
              GREATEST(job.run_at, job.created_at) AS waiting_since,
              {poison_reason} AS poison
)"""
_LEASED = "claimed LEFT JOIN lapsed ON lapsed.id = claimed.id"
_CLAIMED_COLUMNS = """claimed.id, claimed.queue, claimed.kind, claimed.payload,
       claimed.priority, claimed.run_at, claimed.attempts, claimed.max_attempts,
       claimed.visibility_timeout, claimed.lease_deadline, claimed.expired,
       lapsed.id IS NOT NULL AS reclaimed,
       (EXTRACT(EPOCH FROM now())
        - EXTRACT(EPOCH FROM COALESCE(lapsed.lease_deadline, claimed.waiting_since)))::float8
           AS pickup_latency,
       claimed.poison"""

# The claim's first statement: ``lapsed`` and ``fast`` leased, nothing else. Its first
# columns (one ``flag`` row, LEFT JOINed to the leased rows, so the statement returns at
# least one row: with nothing claimed, one row whose job columns are all NULL) say
#   - ``front_full``: whether ``front`` held ``%(front)s`` rows (so jobs may wait behind it);
#   - ``front_unserved``: whether it held jobs of kinds the worker lacks (then only the walk
#     can find its jobs behind them);
#   - ``claimed_at``: the statement's ``now()``; every lease that lapsed before it was seen
#     unless ``lapsed`` was full;
#   - ``position_*``: per priority level of the front, the position the worker may move to:
#     after the last job leased there, or after the level's last row when the claim got
#     fewer than it asked for (every served row it read was leased or held by another
#     claimer), else just before the level's first row (``run_at`` NULL when outside what
#     Python holds: read the level from its start);
# then the columns of ``_CLAIMED_COLUMNS``. Costs: the lapsed rows since the last look, the
# front's ``2 * limit`` index entries from the positions, the locked rows.
_CLAIM_FRONT_TEMPLATE = """
WITH {start}, {lease}
SELECT flag.front_full, flag.front_unserved, flag.claimed_at, flag.position_priorities,
       flag.position_run_ats, flag.position_ids, {columns}
FROM (
    SELECT (SELECT count(*) FROM front) = %(front)s AS front_full,
           EXISTS (SELECT FROM front WHERE NOT served) AS front_unserved,
           now() AS claimed_at,
           array_agg(position.priority ORDER BY position.priority DESC)
               AS position_priorities,
           array_agg(position.run_at ORDER BY position.priority DESC) AS position_run_ats,
           array_agg(position.id ORDER BY position.priority DESC) AS position_ids
    FROM (
        SELECT DISTINCT ON (seen.priority) seen.priority,
               CASE WHEN seen.run_at BETWEEN {earliest} AND {latest} THEN seen.run_at END
                   AS run_at,
               CASE WHEN seen.passed THEN seen.id ELSE seen.id - 1 END AS id
        FROM (
            SELECT front.*,
                   (SELECT count(*) FROM fast) < %(limit)s - (SELECT count(*) FROM lapsed)
                   OR front.id IN (SELECT id FROM fast) AS passed
            FROM front
        ) AS seen
        ORDER BY seen.priority DESC, seen.passed DESC,
                 CASE WHEN seen.passed THEN seen.run_at END DESC,
                 CASE WHEN seen.passed THEN seen.id END DESC,
                 seen.run_at, seen.id
    ) AS position
) AS flag
LEFT JOIN ({leased}) ON true
"""

# The claim's second statement, the walk, run by ``leases.claim`` only when the first one
# claimed fewer than ``limit`` and its front was full. It first tries as the first
# statement does (another claimer may have taken the front meanwhile): ``settled`` when
# ``fast`` got ``limit`` minus lapsed rows, or when ``front`` held every due job. Otherwise
# it walks the worker's kinds, reading ``jobq_job_kind_claim_idx`` (queue, kind, priority
# DESC, run_at, id; ready rows) and never the jobs of other kinds; its CTEs run only then:
#   - ``pairs``: the distinct (queue, kind) pairs of ready jobs (``_READY_PAIRS_TEMPLATE``),
#     each with its first ready job;
#   - ``firsts``: for each pair whose kind the worker has, its first due job in claim order
#     (the pair's row when that job is due, else one seek); only the pairs of the first
#     ``limit`` of these can hold any of the first ``limit`` jobs of all (any other pair has
#     ``limit`` jobs ahead of its every job);
#   - ``heads``: for each of those pairs, its first ``limit`` due jobs in claim order (an
#     ordered index range), merged, the first ``limit`` of all kept: the claim's
#     candidates, read without locks;
#   - ``shares``: how many of the first ``limit`` minus lapsed candidates each pair has;
#   - ``walked``: per pair, that many rows locked in claim order FOR UPDATE SKIP LOCKED, so
#     a candidate another claimer took in between is replaced by the pair's next row (never
#     more rows locked than claimed, never an empty claim because of a concurrent one).
# ``ready`` is ``fast`` when settled, else ``walked`` (the rows ``fast`` locked are walked
# again: this transaction holds them). Costs: those of the first statement; then, only if
# unsettled, one seek per (queue, kind) pair of ready jobs (two for a served pair whose
# first job is not due), up to ``limit`` index entries for each of at most ``limit``
# pairs, and the locked rows (docs/performance.md has the figures).
_CLAIM_WALK_TEMPLATE = """
WITH RECURSIVE {start}, settled AS MATERIALIZED (
    SELECT (SELECT count(*) FROM fast) = %(limit)s - (SELECT count(*) FROM lapsed)
           OR (SELECT count(*) FROM front) < %(front)s AS done
), {ready_pairs}, firsts AS MATERIALIZED (
    SELECT first.queue, first.kind, first.priority, first.run_at, first.id FROM pairs
    CROSS JOIN LATERAL (
        SELECT pairs.queue, pairs.kind, pairs.priority, pairs.run_at, pairs.id
        WHERE pairs.run_at <= now()
        UNION ALL
        (SELECT job.queue, job.kind, job.priority, job.run_at, job.id FROM jobq_job AS job
         WHERE pairs.run_at > now() AND job.status = 'ready' AND job.queue = pairs.queue
           AND job.kind = pairs.kind AND job.run_at <= now()
         ORDER BY job.priority DESC, job.run_at, job.id
         LIMIT 1)
    ) AS first
    WHERE pairs.kind = ANY(%(kinds)s::text[])
    ORDER BY first.priority DESC, first.run_at, first.id
    LIMIT %(limit)s
), heads AS MATERIALIZED (
    SELECT head.* FROM firsts
    CROSS JOIN LATERAL (
        SELECT job.queue, job.kind, job.priority, job.run_at, job.id FROM jobq_job AS job
        WHERE job.status = 'ready' AND job.queue = firsts.queue AND job.kind = firsts.kind
          AND job.run_at <= now()
        ORDER BY job.priority DESC, job.run_at, job.id
        LIMIT %(limit)s
    ) AS head
    ORDER BY head.priority DESC, head.run_at, head.id
    LIMIT %(limit)s
), shares AS (
    SELECT queue, kind, count(*) AS share FROM (
        SELECT queue, kind FROM heads
        ORDER BY priority DESC, run_at, id
        LIMIT %(limit)s - (SELECT count(*) FROM lapsed)
    ) AS candidates
    GROUP BY queue, kind
), walked AS MATERIALIZED (
    SELECT locked.id FROM shares
    CROSS JOIN LATERAL (
        SELECT job.id FROM jobq_job AS job
        WHERE job.status = 'ready' AND job.queue = shares.queue AND job.kind = shares.kind
          AND job.run_at <= now()
        ORDER BY job.priority DESC, job.run_at, job.id
        LIMIT shares.share
        FOR UPDATE OF job SKIP LOCKED
    ) AS locked
), ready AS MATERIALIZED (
    SELECT id FROM fast WHERE (SELECT done FROM settled)
    UNION ALL
    SELECT id FROM walked WHERE NOT (SELECT done FROM settled)
), {lease}
SELECT {columns}
FROM {leased}
"""

#: The claim's first statement reads this many times ``limit`` jobs at the front of the queue.
CLAIM_FRONT_FACTOR = 2


def _claim(template: str, ready: str, queue_filter: str) -> str:
    """``template`` (``_CLAIM_FRONT_TEMPLATE`` or ``_CLAIM_WALK_TEMPLATE``) for some queues."""
    lease = _CLAIM_LEASE.format(
        ready=ready,
        lease_length=LEASE_LENGTH,
        earliest=_EARLIEST,
        latest=_LATEST,
        poison_reason=POISON_REASON,
    )
    return template.format(
        earliest=_EARLIEST,
        latest=_LATEST,
        start=_CLAIM_START.format(queue_filter=queue_filter, is_ready=_IS_READY),
        ready_pairs=_READY_PAIRS_TEMPLATE.format(queue_filter=queue_filter),
        lease=lease,
        leased=_LEASED,
        columns=_CLAIMED_COLUMNS,
    )


_ONE_QUEUE = " AND queue = %(queue)s"
_QUEUES = " AND queue = ANY(%(queues)s::text[])"

#: The claim's first statement from one queue (see above; ``%(queue)s``).
CLAIM_JOBS_ONE_QUEUE = _claim(_CLAIM_FRONT_TEMPLATE, "fast", _ONE_QUEUE)
#: The same from several queues (``%(queues)s``).
CLAIM_JOBS_QUEUES = _claim(_CLAIM_FRONT_TEMPLATE, "fast", _QUEUES)
#: The same from every queue.
CLAIM_JOBS_ANY_QUEUE = _claim(_CLAIM_FRONT_TEMPLATE, "fast", "")
#: The walk from one queue (see above; ``%(queue)s``).
CLAIM_JOBS_WALK_ONE_QUEUE = _claim(_CLAIM_WALK_TEMPLATE, "ready", _ONE_QUEUE)
#: The walk from several queues (``%(queues)s``): ``pairs`` seeks only into the named queues.
CLAIM_JOBS_WALK_QUEUES = _claim(_CLAIM_WALK_TEMPLATE, "ready", _QUEUES)
#: The walk from every queue: ``pairs`` walks every queue's kinds.
CLAIM_JOBS_WALK_ANY_QUEUE = _claim(_CLAIM_WALK_TEMPLATE, "ready", "")

# -- the probe of the claim positions -------------------------------------------------------
#
# The claim reads each priority level from the worker's position in it, and lapsed leases
# from the last lapse it saw (``%(range_*)s`` and ``%(lapsed_from)s`` above; see
# :mod:`django_jobq.claim_positions`). A row that sorts before a position once the position
# is set (a job whose enqueueing transaction committed long after its insert, a job enqueued
# with a past ``run_at``, a row an operator's lock hid from a claim) is found by this probe,
# which reads from the start of the claim order: the worker's first claimable ready job
# (``jobq_job_claim_idx`` / ``jobq_job_claim_all_idx``) and its earliest lapsed lease
# (``jobq_job_lease_idx``). Both read without locks and stop at the first row they find; while
# the xmin horizon is held back each walks the index entries of the rows claimed or acked
# since, which is why the worker runs it only every so often, never in the claim. Its kind
# test is spelt ``(kind = ANY(...)) IS TRUE`` (see ``_IS_READY``): spelt plainly, a planner
# whose statistics say few rows are ready reads ``jobq_job_kind_claim_idx`` instead, every
# ready job of the worker's kinds, and sorts them for the first.
# Returns one row: the first claimable ready job's ``priority``, ``run_at`` (NULL when
# outside what Python holds, ``-infinity`` say) and ``id`` (all NULL when there is none),
# then whether a lapsed lease was found and its deadline (NULL when outside what Python
# holds).
_PROBE_CLAIM_POSITIONS_TEMPLATE = """
SELECT ready.priority,
       CASE WHEN ready.run_at BETWEEN {earliest} AND {latest} THEN ready.run_at END, ready.id,
       lapsed.id IS NOT NULL,
       CASE WHEN lapsed.lease_deadline BETWEEN {earliest} AND {latest}
           THEN lapsed.lease_deadline END
FROM (VALUES (1)) AS one (row)
LEFT JOIN LATERAL (
    SELECT priority, run_at, id FROM jobq_job
    WHERE status = 'ready' AND run_at <= now(){queue_filter}
      AND (kind = ANY(%(kinds)s::text[])) IS TRUE
    ORDER BY priority DESC, run_at, id
    LIMIT 1
) AS ready ON true
LEFT JOIN LATERAL (
    SELECT id, lease_deadline FROM jobq_job
    WHERE status = 'running' AND lease_deadline < now(){queue_filter}
      AND kind = ANY(%(kinds)s::text[])
    ORDER BY lease_deadline
    LIMIT 1
) AS lapsed ON true
"""
#: The probe for one queue (``%(queue)s``, ``%(kinds)s``).
PROBE_CLAIM_POSITIONS_ONE_QUEUE = _PROBE_CLAIM_POSITIONS_TEMPLATE.format(
    queue_filter=_ONE_QUEUE, earliest=_EARLIEST, latest=_LATEST
)
#: The probe for several queues (``%(queues)s``, ``%(kinds)s``).
PROBE_CLAIM_POSITIONS_QUEUES = _PROBE_CLAIM_POSITIONS_TEMPLATE.format(
    queue_filter=_QUEUES, earliest=_EARLIEST, latest=_LATEST
)
#: The probe for every queue (``%(kinds)s``).
PROBE_CLAIM_POSITIONS_ANY_QUEUE = _PROBE_CLAIM_POSITIONS_TEMPLATE.format(
    queue_filter="", earliest=_EARLIEST, latest=_LATEST
)

# -- outcomes (all fenced by attempt) ------------------------------------------------------
#
# Each write about running jobs below first locks its rows in a ``locked`` CTE
# (``_LOCK_FENCED``): the rows matching the fence, ``(id, attempts, status = 'running')``,
# in id order, ``FOR UPDATE SKIP LOCKED``. A row another transaction holds (an operator's
# ``SELECT ... FOR UPDATE``, a handler's ``ctx.atomic()`` that has just acked it) is skipped,
# never waited for: one locked row cannot stall a worker's writes about its other jobs, and
# every batch takes its locks in the same order. The ``busy`` CTE names the skipped rows: a
# plain read, in the statement's snapshot, of the rows that match the fence but were not
# locked. Every statement returns ``(id, busy, ...)`` rows: ``busy`` false for a row
# written, true for a row skipped because it is locked (nothing written: try again later).
# An id in neither is a lost lease. A row changed by a transaction that committed during the
# statement is rechecked against the fence by the lock and may be reported busy although
# its lease is lost: the next try says so.

# The fence of a batch: zipped arrays of job ids and attempts.
_FENCE_MANY = "unnest(%(ids)s::bigint[], %(attempts)s::integer[]) AS fence(id, attempt)"
# The fence of one job.
_FENCE_ONE = "(VALUES (%(id)s::bigint, %(attempt)s::integer)) AS fence(id, attempt)"
# The ``locked`` and ``busy`` CTEs over a fence (see above); ``{condition}`` narrows both.
_LOCK_FENCED = """locked AS MATERIALIZED (
    SELECT job.id FROM jobq_job AS job
    JOIN {fence} ON fence.id = job.id
    WHERE job.attempts = fence.attempt AND {is_running}{condition}
    ORDER BY job.id
    FOR UPDATE OF job SKIP LOCKED
), busy AS (
    SELECT fence.id FROM {fence}
    WHERE fence.id NOT IN (SELECT id FROM locked)
      AND EXISTS (
          SELECT 1 FROM jobq_job AS job
          WHERE job.id = fence.id AND job.attempts = fence.attempt
            AND {is_running}{condition}
      )
)"""
_LOCK_MANY = _LOCK_FENCED.format(fence=_FENCE_MANY, is_running=_IS_RUNNING, condition="")
_LOCK_ONE = _LOCK_FENCED.format(fence=_FENCE_ONE, is_running=_IS_RUNNING, condition="")
# The rows of a statement whose CTE ``{written}`` returns the ids it wrote.
_WRITTEN_OR_BUSY = """SELECT id, false AS busy FROM {written}
UNION ALL
SELECT id, true FROM busy"""

#: Ack: delete finished jobs (locked as above; fenced). Returns ``(id, busy)`` rows.
_ACK_JOBS_TEMPLATE = """
WITH {lock}, acked AS (
    DELETE FROM jobq_job AS job USING locked WHERE job.id = locked.id
    RETURNING job.id
)
{rows}
"""
ACK_JOBS = _ACK_JOBS_TEMPLATE.format(lock=_LOCK_MANY, rows=_WRITTEN_OR_BUSY.format(written="acked"))

#: Ack one job in the handler's own transaction (``ctx.atomic()``). Fenced; unlike
#: ``ACK_JOBS`` it waits for a row lock another transaction holds: the handler's
#: transaction must know whether its ack applies before it commits (it runs on the
#: handler's connection, so the wait stalls that job only). Returns the id if acked.
_ACK_JOB_IN_TRANSACTION_TEMPLATE = """
DELETE FROM jobq_job
WHERE id = %(id)s AND attempts = %(attempt)s AND {is_running}
RETURNING id
"""
ACK_JOB_IN_TRANSACTION = _ACK_JOB_IN_TRANSACTION_TEMPLATE.format(is_running=_IS_RUNNING)

#: Heartbeat: extend the leases a worker holds to ``now() + visibility_timeout`` (absolute,
#: so missed beats do not accumulate credit; clamped like the claim's, ``LEASE_LENGTH``).
#: Locked as above; fenced, and refused once a deadline has passed: a lapsed lease may
#: already be reclaimed, or be about to be. Returns ``(id, busy, lease_deadline)`` rows: the
#: new deadline of each lease extended; a missing id means that lease is lost.
_HEARTBEAT_JOBS_TEMPLATE = """
WITH {lock}, extended AS (
    UPDATE jobq_job AS job
    SET lease_deadline = now() + {lease_length}
    FROM locked
    WHERE job.id = locked.id
    RETURNING job.id, job.lease_deadline
)
SELECT id, false AS busy, lease_deadline FROM extended
UNION ALL
SELECT id, true, NULL FROM busy
"""
HEARTBEAT_JOBS = _HEARTBEAT_JOBS_TEMPLATE.format(
    lock=_LOCK_FENCED.format(
        fence=_FENCE_MANY, is_running=_IS_RUNNING, condition=" AND job.lease_deadline > now()"
    ),
    lease_length=LEASE_LENGTH,
)

# Retry: make a failed attempt's job ready again after ``delay_seconds``, keeping its
# attempt count (the next claim consumes the next attempt). Updates the ``locked`` row.
_RETRY_TEMPLATE = """
UPDATE jobq_job AS job
SET status = 'ready',
    run_at = now() + make_interval(secs => %(delay_seconds)s),
    worker_id = '',
    lease_deadline = NULL,
    started_at = NULL,
    last_error = %(error)s
FROM locked
WHERE job.id = locked.id
RETURNING {returning}
"""

#: Retry a job (see the template above); locked as above, fenced. Returns an ``(id, busy)``
#: row unless the lease is lost.
_RETRY_JOB_TEMPLATE = """
WITH {lock}, retried AS ({retry})
{rows}
"""
RETRY_JOB = _RETRY_JOB_TEMPLATE.format(
    lock=_LOCK_ONE,
    retry=_RETRY_TEMPLATE.format(returning="job.id"),
    rows=_WRITTEN_OR_BUSY.format(written="retried"),
)

# Delete the ``locked`` job, returning its row (``moved``), for a dead letter.
_MOVE_LOCKED_JOB = """moved AS (
    DELETE FROM jobq_job AS job USING locked WHERE job.id = locked.id
    RETURNING job.*
)"""

# The dead-letter copy of the job deleted by a ``moved`` CTE; returns its ``job_id``. The
# reason is ``{reason}``: the parameter, or a column of ``moved``.
_INSERT_DEAD_LETTER_TEMPLATE = """
INSERT INTO jobq_dead_letter (job_id, queue, kind, payload, priority, attempts, max_attempts,
                              visibility_timeout, idempotency_key, created_at, reason,
                              last_error, traceback, died_at)
SELECT id, queue, kind, payload, priority,
       CASE WHEN %(ran)s THEN attempts ELSE attempts - 1 END, max_attempts,
       visibility_timeout,
       idempotency_key, created_at, {reason}, %(error)s, %(traceback)s, now()
FROM moved
RETURNING job_id
""".strip()
_INSERT_DEAD_LETTER = _INSERT_DEAD_LETTER_TEMPLATE.format(reason="%(reason)s")

#: Dead-letter: move a job to the dead letters (copy + reason + error) and delete it, in one
#: statement and so one transaction: the job is in exactly one of the two tables. Locked as
#: above; fenced. ``attempts`` records the attempts that ran: not the current one when
#: ``%(ran)s`` is false (expired, unknown kind, or a reclaim past the last attempt:
#: dead-lettered unrun). Returns an ``(id, busy)`` row unless the lease is lost.
_DEAD_LETTER_JOB_TEMPLATE = """
WITH {lock}, {move}, dead AS ({insert_dead_letter})
SELECT job_id AS id, false AS busy FROM dead
UNION ALL
SELECT id, true FROM busy
"""
DEAD_LETTER_JOB = _DEAD_LETTER_JOB_TEMPLATE.format(
    lock=_LOCK_ONE, move=_MOVE_LOCKED_JOB, insert_dead_letter=_INSERT_DEAD_LETTER
)

#: Release: hand back leased jobs that never started (a stopping worker's prefetch). The
#: attempt the claim consumed is given back, so a release costs the job nothing. Locked as
#: above; fenced. Returns ``(id, busy)`` rows.
_RELEASE_JOBS_TEMPLATE = """
WITH {lock}, released AS (
    UPDATE jobq_job AS job
    SET status = 'ready',
        attempts = job.attempts - 1,
        worker_id = '',
        lease_deadline = NULL,
        started_at = NULL
    FROM locked
    WHERE job.id = locked.id
    RETURNING job.id
)
{rows}
"""
RELEASE_JOBS = _RELEASE_JOBS_TEMPLATE.format(
    lock=_LOCK_MANY, rows=_WRITTEN_OR_BUSY.format(written="released")
)


# -- worker wake-up ------------------------------------------------------------------------

# Seconds (on the database clock) until the next ready job's ``run_at`` or the next lease
# deadline of a job the asking worker does not hold (``%(held)s``: the ids of the jobs it
# holds, whose leases its heartbeater extends), whichever is first; NULL when neither
# exists. Leases recorded under the asker's worker id but not held by it (a crashed
# predecessor's with the same ``--worker-id``) count like any other worker's. An idle
# worker sleeps that long (at most its poll interval) instead of polling blindly. Only times not yet
# claimable count (``run_at > now()``, ``lease_deadline >= now()``: the claim's complements):
# due jobs were just claimed, or are locked by another claimer.
# The earliest future ``run_at`` is found with one index seek per distinct priority among
# the ready jobs (a loose index scan of ``jobq_job_claim_idx`` / ``jobq_job_claim_all_idx``,
# whose order is priority DESC, run_at): the recursive CTE walks the priorities, the
# LATERAL takes each one's first future ``run_at``. A backlog of scheduled jobs therefore
# costs a few seeks, not a scan. The deadline comes from ``jobq_job_lease_idx``, looking no
# further than ``%(horizon)s`` seconds ahead (the worker's poll interval: it wakes by then
# anyway). Without that bound the search would walk, in deadline order, every running job
# of other queues and every job this worker holds before the first that counts (160 ms
# with 300,000 running jobs); with it, only the leases that lapse within the horizon.
# The seconds are a difference of epochs, not of timestamps: a ``run_at`` of 'infinity'
# (a row not written by enqueue) gives Infinity (sleep the poll interval), not an error.
_SECONDS_UNTIL_DUE_TEMPLATE = """
WITH RECURSIVE priorities AS (
    (SELECT priority FROM jobq_job
     WHERE status = 'ready'{queue_filter}
     ORDER BY priority DESC
     LIMIT 1)
    UNION ALL
    SELECT (SELECT job.priority FROM jobq_job AS job
            WHERE job.status = 'ready' AND job.priority < priorities.priority{queue_filter}
            ORDER BY job.priority DESC
            LIMIT 1)
    FROM priorities
    WHERE priorities.priority IS NOT NULL
)
SELECT (EXTRACT(EPOCH FROM LEAST(
    (SELECT min(next.run_at)
     FROM priorities, LATERAL (
         SELECT job.run_at FROM jobq_job AS job
         WHERE job.status = 'ready' AND job.priority = priorities.priority
           AND job.run_at > now(){queue_filter}
         ORDER BY job.priority DESC, job.run_at
         LIMIT 1
     ) AS next),
    (SELECT min(lease_deadline) FROM jobq_job
     WHERE status = 'running' AND lease_deadline >= now()
       AND lease_deadline < now() + make_interval(secs => %(horizon)s)
       AND id <> ALL(%(held)s::bigint[]){queue_filter})
)) - EXTRACT(EPOCH FROM now()))::float8
"""

#: Seconds until something is due in one queue (see the template above).
SECONDS_UNTIL_DUE_ONE_QUEUE = _SECONDS_UNTIL_DUE_TEMPLATE.format(
    queue_filter=" AND queue = %(queue)s"
)
#: Seconds until something is due in any of several queues.
SECONDS_UNTIL_DUE_QUEUES = _SECONDS_UNTIL_DUE_TEMPLATE.format(
    queue_filter=" AND queue = ANY(%(queues)s::text[])"
)
#: Seconds until something is due in any queue.
SECONDS_UNTIL_DUE_ANY_QUEUE = _SECONDS_UNTIL_DUE_TEMPLATE.format(queue_filter="")

# Whether any job of the queues is running, its lease live or lapsed, whoever holds it. A
# burst worker that found nothing to claim and holds nothing exits only when none is: it
# waits for a crashed worker's lease to lapse, and reclaims the job (a lapsed lease is
# claimable at the next claim, so a lease lapsing just after this worker's claim still keeps
# it). Served by ``jobq_job_lease_idx`` (running jobs only), stopping at the first row.
_RUNNING_JOB_EXISTS_TEMPLATE = """
SELECT EXISTS (SELECT 1 FROM jobq_job WHERE status = 'running'{queue_filter})
"""

#: Whether a job of one queue is running (see the template above).
RUNNING_JOB_EXISTS_ONE_QUEUE = _RUNNING_JOB_EXISTS_TEMPLATE.format(
    queue_filter=" AND queue = %(queue)s"
)
#: Whether a job of any of several queues is running.
RUNNING_JOB_EXISTS_QUEUES = _RUNNING_JOB_EXISTS_TEMPLATE.format(
    queue_filter=" AND queue = ANY(%(queues)s::text[])"
)
#: Whether a job of any queue is running.
RUNNING_JOB_EXISTS_ANY_QUEUE = _RUNNING_JOB_EXISTS_TEMPLATE.format(queue_filter="")

# -- Django tasks (tasks_backend.py, task_results.py) --------------------------------------
#
# A task's job has the task's module path as its kind and the payload
# ``{"result_id", "backend", "args", "kwargs"}``; its result is the ``jobq_task_result`` row
# with that id (and ``task_path`` = the kind). Each statement below that records a job's
# outcome also writes its result, so the two never disagree. The ``INSERT ... ON CONFLICT``
# forms recreate a result that is missing (pruned while its job sat in the dead letters).

# The columns a task's job gives its result row, as ``INSERT`` column list and ``SELECT``
# list over a CTE of job rows (``id, kind, queue, priority, payload, created_at``).
_TASK_RESULT_COLUMNS = "id, task_path, backend, queue, priority, args, kwargs, job_id, enqueued_at"
_TASK_RESULT_VALUES = (
    "payload->>'result_id', kind, payload->>'backend', queue, priority, "
    "payload->'args', payload->'kwargs', id, created_at"
)

#: Enqueue tasks: ``INSERT_UNKEYED_JOBS`` (same parameters; tasks have no idempotency keys)
#: plus each job's READY result, in one statement and so in the caller's transaction.
#: ``run_after`` is recorded only for a deferred job (a job due at once has
#: ``run_at = created_at``, see ``INSERT_JOBS``).
_TASK_RESULTS_OF_NEW_JOBS = """, result AS (
    INSERT INTO jobq_task_result ({columns}, status, run_after, errors, worker_ids)
    SELECT {values}, 'READY', NULLIF(run_at, created_at), '[]', '[]'
    FROM saved
)"""
INSERT_TASK_JOBS = _INSERT_JOBS_TEMPLATE.format(
    on_conflict="",
    more_writes=_TASK_RESULTS_OF_NEW_JOBS.format(
        columns=_TASK_RESULT_COLUMNS, values=_TASK_RESULT_VALUES
    ),
    key_columns="",
)

#: An attempt of a task starts: its result becomes RUNNING, records the start and appends
#: the worker id the claim wrote on the job. Fenced: returns nothing (and writes nothing)
#: unless attempt ``%(attempt)s`` still holds job ``%(job_id)s``. Returns the result row.
#: ``commit_mode`` lets the transaction commit without waiting for its WAL to reach the disk
#: (``set_config(..., true)``: this transaction only, the whole statement when autocommit):
#: visible at once, lost only if the database server crashes within a fraction of a second.
#: Fit for this informative write only; outcomes are always committed durably.
_START_TASK_ATTEMPT_TEMPLATE = """
WITH job AS (
    SELECT id, kind, queue, priority, payload, created_at, worker_id FROM jobq_job
    WHERE id = %(job_id)s AND attempts = %(attempt)s AND {is_running}
), commit_mode AS (
    SELECT set_config('synchronous_commit', 'off', true)
)
INSERT INTO jobq_task_result AS result ({columns}, status, started_at, last_attempted_at,
                                        errors, worker_ids)
SELECT {values}, 'RUNNING', now(), now(), '[]', jsonb_build_array(worker_id)
FROM job, commit_mode
ON CONFLICT (id) DO UPDATE
SET status = 'RUNNING',
    job_id = EXCLUDED.job_id,
    started_at = COALESCE(result.started_at, EXCLUDED.started_at),
    last_attempted_at = EXCLUDED.last_attempted_at,
    finished_at = NULL,
    worker_ids = result.worker_ids || EXCLUDED.worker_ids
RETURNING result.*
"""
START_TASK_ATTEMPT = _START_TASK_ATTEMPT_TEMPLATE.format(
    columns=_TASK_RESULT_COLUMNS, values=_TASK_RESULT_VALUES, is_running=_IS_RUNNING
)

# The rows locked as above but busy, after a statement's written rows, for the statements
# below whose rows carry a task result's columns (``(NULL::jobq_task_result).*``: none).
_BUSY_WITHOUT_RESULT = "SELECT busy.id, true, (NULL::jobq_task_result).* FROM busy"

#: Ack tasks' jobs and make their results SUCCESSFUL with their return values (JSON text),
#: in one statement: a result is successful exactly when its job is gone. Locked and fenced
#: like ``ACK_JOBS``. Returns ``(job id, busy, result columns...)`` rows: the result of
#: each job acked, and each busy job without a result.
_ACK_TASK_JOBS_TEMPLATE = """
WITH {lock}, acked AS (
    DELETE FROM jobq_job AS job
    USING locked, unnest(%(ids)s::bigint[], %(return_values)s::text[]) AS done(id, return_value)
    WHERE job.id = locked.id AND done.id = locked.id
    RETURNING job.id, job.kind, job.queue, job.priority, job.payload, job.created_at,
              job.worker_id, done.return_value::jsonb AS return_value
), stored AS (
    INSERT INTO jobq_task_result AS result ({columns}, status, finished_at, return_value,
                                            errors, worker_ids)
    SELECT {values}, 'SUCCESSFUL', now(), return_value, '[]', jsonb_build_array(worker_id)
    FROM acked
    ON CONFLICT (id) DO UPDATE
    SET status = 'SUCCESSFUL',
        job_id = EXCLUDED.job_id,
        finished_at = EXCLUDED.finished_at,
        return_value = EXCLUDED.return_value
    RETURNING result.*
)
SELECT stored.job_id, false AS busy, stored.* FROM stored
UNION ALL
{busy}
"""
ACK_TASK_JOBS = _ACK_TASK_JOBS_TEMPLATE.format(
    lock=_LOCK_MANY,
    columns=_TASK_RESULT_COLUMNS,
    values=_TASK_RESULT_VALUES,
    busy=_BUSY_WITHOUT_RESULT,
)

#: Retry a task's job (``RETRY_JOB``) and, in the same statement, make its result READY
#: with this attempt's error (``%(task_error)s``, a JSON object) appended to its errors.
#: Locked and fenced like ``RETRY_JOB``. Returns an ``(id, busy)`` row unless the lease is
#: lost.
_RETRY_TASK_JOB_TEMPLATE = """
WITH {lock}, retried AS ({retry}), result AS (
    UPDATE jobq_task_result AS result
    SET status = 'READY', errors = result.errors || jsonb_build_array(%(task_error)s::jsonb)
    FROM retried
    WHERE result.id = retried.payload->>'result_id' AND result.task_path = retried.kind
)
{rows}
"""
RETRY_TASK_JOB = _RETRY_TASK_JOB_TEMPLATE.format(
    lock=_LOCK_ONE,
    retry=_RETRY_TEMPLATE.format(returning="job.id, job.kind, job.payload"),
    rows=_WRITTEN_OR_BUSY.format(written="retried"),
)

#: Dead-letter a task's job (``DEAD_LETTER_JOB``, same parameters) and, in the same
#: statement, make its result FAILED with ``%(task_error)s`` appended to its errors. Also
#: used for jobs of unknown kind, which may be tasks this worker does not have: a job whose
#: payload names no result of its kind updates no result. Locked and fenced like
#: ``DEAD_LETTER_JOB``. Returns a row unless the lease is lost: the dead letter's
#: ``job_id``, ``busy``, then the result's columns (NULL without a result, or when busy).
_DEAD_LETTER_TASK_JOB_TEMPLATE = """
WITH {lock}, {move}, dead AS ({insert_dead_letter}), failed AS (
    UPDATE jobq_task_result AS result
    SET status = 'FAILED',
        finished_at = now(),
        errors = result.errors || jsonb_build_array(%(task_error)s::jsonb)
    FROM moved
    WHERE result.id = moved.payload->>'result_id' AND result.task_path = moved.kind
    RETURNING result.*
)
SELECT dead.job_id, false AS busy, failed.* FROM dead LEFT JOIN failed ON true
UNION ALL
{busy}
"""
DEAD_LETTER_TASK_JOB = _DEAD_LETTER_TASK_JOB_TEMPLATE.format(
    lock=_LOCK_ONE,
    move=_MOVE_LOCKED_JOB,
    insert_dead_letter=_INSERT_DEAD_LETTER,
    busy=_BUSY_WITHOUT_RESULT,
)

#: Fail the results of tasks' jobs that were dead-lettered without running (as unknown
#: kinds, by a statement of their own): each ``(result_id, task_path, task_error)`` whose
#: result is of that task and not finished becomes FAILED, ``task_error`` (a JSON object)
#: appended to its errors. A result already finished is left as it is, so failing one twice
#: (or one the worker's ``DEAD_LETTER_TASK_JOB`` failed) changes nothing. Returns the results
#: it failed.
FAIL_UNRUN_TASK_RESULTS = """
UPDATE jobq_task_result AS result
SET status = 'FAILED',
    finished_at = now(),
    errors = result.errors || jsonb_build_array(unrun.task_error::jsonb)
FROM unnest(%(result_ids)s::text[], %(task_paths)s::text[], %(task_errors)s::text[])
     AS unrun(result_id, task_path, task_error)
WHERE result.id = unrun.result_id
  AND result.task_path = unrun.task_path
  AND result.status NOT IN ('SUCCESSFUL', 'FAILED')
RETURNING result.*
"""

# -- observability -------------------------------------------------------------------------

#: The database clock, which every stored time and every window of the statistics uses.
DATABASE_NOW = "SELECT now()"

# -- the statements by concern (``sql.<concern>.NAME``) -------------------------------------

from . import causes as causes  # noqa: E402
from . import enqueue as enqueue  # noqa: E402
from . import locks as locks  # noqa: E402
from . import maintenance as maintenance  # noqa: E402
from . import mvcc as mvcc  # noqa: E402
from . import operations as operations  # noqa: E402
from . import schedules as schedules  # noqa: E402
from . import stats as stats  # noqa: E402
from . import wake as wake  # noqa: E402
from . import workers as workers  # noqa: E402
