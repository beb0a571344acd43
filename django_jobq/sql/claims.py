"""Claims: the statements that lease due jobs to a worker, and what a worker asks to know
when it may claim next.

A claim leases rows in one statement, skipping rows other claimers hold (SKIP LOCKED: it
never waits, never double-claims); each claim starts an attempt, whose number is the lease's
fencing token (see :mod:`django_jobq.sql.leases`). The statements come in one variant per
queue mode: ``_ONE_QUEUE`` (``%(queue)s``), ``_QUEUES`` (``%(queues)s``) and ``_ANY_QUEUE``,
their ``{queue_filter}`` filled with one of the literal filters below.
"""

from __future__ import annotations

from .flow import FLOW_DIGEST
from .leases import LEASE_LENGTH

# The queue filters of the statements' variants: one queue, several, every queue but some
# (paused or limited ones, see below), or every queue ("").
_ONE_QUEUE = " AND queue = %(queue)s"
_QUEUES = " AND queue = ANY(%(queues)s::text[])"
_QUEUES_BUT = " AND queue <> ALL(%(excluded_queues)s::text[])"

#: Whether the lane of ``job`` (a row of ``jobq_job`` so aliased) is free: it is in no lane,
#: or no job of its lane is running (``jobq_job_one_running_per_lane``: one index seek). A
#: ready job's lane has another job running only when two transactions enqueued into an
#: empty lane at once (``sql.lanes``); the claim leaves it for later, and should two claims
#: race for such a pair, the unique index fails the second claim, which is retried. A scalar
#: subquery (at most one row, by that index), not ``NOT EXISTS``: the planner may run a
#: ``NOT EXISTS`` as one hashed read of every running job, per claim. And only the lane's
#: first job not running (``jobq_job_lane_idx``): two ready jobs of one lane are never
#: leased by one claim, and run in id order.
LANE_IS_FREE = """(job.ordering_key IS NULL OR ((
        SELECT lane.id FROM jobq_job AS lane
        WHERE lane.ordering_key = job.ordering_key AND lane.status = 'running') IS NULL
    AND job.id = (
        SELECT first.id FROM jobq_job AS first
        WHERE first.ordering_key = job.ordering_key AND first.status <> 'running'
        ORDER BY first.ordering_key, first.id
        LIMIT 1)))"""

# -- rows not written by enqueue -----------------------------------------------------------
#
# Another producer (or a hand-written fix) can put values into ``jobq_job`` that ``enqueue``
# never writes. The CHECK constraints of migration 0008 refuse them on new ready rows; rows
# that were there before (the constraints are NOT VALID) or running rows can still hold
# them, so every statement that reads jobs survives them, and the claim names them.

#: Why a claimed row must not run, as text (NULL for a healthy row): what the constraints
#: of migration 0008 forbid and only the database can see (the worker checks the payload
#: itself). ``'-infinity'`` and ``'infinity'`` times; a visibility timeout outside 1 ms to
#: 10 years; an attempt count at the integer maximum that is not past ``max_attempts`` (the
#: claim cannot advance it, so the lease would have no fencing token of its own, and the job
#: would run for ever). Reads only the row (cheap per claimed row).
POISON_REASON = """CASE
                  WHEN NOT isfinite(job.run_at) THEN 'run_at is ' || job.run_at
                  WHEN NOT isfinite(job.created_at) THEN 'created_at is ' || job.created_at
                  WHEN NOT isfinite(job.expires_at) THEN 'expires_at is ' || job.expires_at
                  WHEN job.visibility_timeout
                      NOT BETWEEN interval '0.001 seconds' AND interval '3650 days'
                      THEN 'visibility_timeout is ' || job.visibility_timeout
                           || ', not 1 ms to 10 years'
                  WHEN job.attempts = 2147483647 AND job.max_attempts = 2147483647
                      THEN 'attempts is 2147483647, the integer maximum: the attempt number (the '
                           || 'fencing token) cannot advance'
              END"""


# -- claim ---------------------------------------------------------------------------------

# Statements that find their rows by primary key (the claim's lock of the rows it chose,
# every fenced write: ``sql.leases.FENCED``) spell their status test
# ``(status = 'ready') IS TRUE`` or ``(status = 'running') IS TRUE``: the same test, but one the
# planner cannot match to the
# predicate of a partial index (``WHERE status = 'ready'``, ``WHERE status = 'running'``).
# Spelt plainly, a planner whose statistics say that few rows match (the table analysed
# while idle, or not since, autovacuum being off) reads that whole index instead of one
# primary-key entry per job; and while the xmin horizon is held back the index keeps an
# entry for every job claimed since, so the statement slows with every claim
# (docs/performance.md, "Large backlogs").
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
# one atomic: ``claims.claim`` runs ``CLAIM_JOBS_*``, small and cheap to plan, and only
# when it may have missed claimable jobs the walk, ``CLAIM_JOBS_WALK_*``, for the rest.
# Where statements are not prepared (behind PgBouncer in transaction mode), every claim pays
# its statement's planning, which grows with the statement; a worker's main connection
# prepares them where it can, and plans them again after each discard (``sql.plans``).
# Both read from the worker's claim positions (``django_jobq.claim_positions``: where its
# last claims got to, so that the dead index entries of the jobs already claimed are not
# walked again while vacuum cannot remove them), and both start with
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
#     the rows locked, not the rows skipped), found by primary key (``(status = 'ready') IS TRUE``,
#     see above).
# When ``front`` held fewer than ``%(front)s`` rows it held every due job, and ``fast``
# took all it could; otherwise jobs of other kinds or rows another claimer holds may fill
# the front while claimable jobs wait behind it: ``claims.claim`` reads on from the moved
# positions, or runs the walk, which finds them.
# Each selection is a MATERIALIZED CTE so it runs exactly once: as a plain subquery the
# planner may re-run a LIMIT subquery inside a nested loop and lease more than ``limit``
# rows. The UPDATE finds its rows with ``id = ANY(ARRAY(...))``, a primary-key lookup:
# joined to the CTEs instead, the planner cannot estimate the computed LIMIT and may scan
# the whole table.

# ``claimed``, which ends both statements, leases the ``lapsed`` rows and the ready ones
# (``fast`` in the first statement, ``ready`` in the walk).
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
# back as JSON text, decoded by the caller row by row (``claims.claim``); ``poison`` names
# what is wrong with a row whose times or lease length only the database can see.
# ``trace_context`` (the enqueue's OpenTelemetry context, the parent of the attempt's span)
# comes back as text too, read only where tracing is on (:mod:`django_jobq.tracing`): a
# malformed one never fails the claim. ``ordering_key`` is the job's lane (NULL: none; see
# ``sql.lanes``) and ``abort_requested`` whether an operator asked its attempt to stop
# (``operations.abort``): a reclaimed job with a request is dead-lettered unrun.
# Both statements select the same columns of the claimed rows joined to ``lapsed``; the
# lease is ``{lease_length}`` (``sql.leases.LEASE_LENGTH``) and ``poison`` is
# ``{poison_reason}`` (``POISON_REASON``).

# Flow control (``sql.flow``): the caller leaves paused queues and limited queues and kinds out of
# the queues and kinds it passes (a limited claim passes one limited queue or kind, see
# :mod:`django_jobq.limited_claims`), by what it read of them, and passes the digest of what it read
# (``%(flow_digest)s``; NULL: no flow control, see ``claims.claim``). Each statement computes
# ``FLOW_DIGEST`` once (``flow``) and leases nothing unless it is the one passed: a claim whose
# caller missed a pause or a new limit committed before it began changes nothing, and the first
# statement returns the digest it found (``flow_digest``) so the caller reads the change and claims
# again. The jobs its CTEs locked are unlocked at its end, untouched.
# Lanes: a ready job is leased only when its lane is free (``LANE_IS_FREE``).

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
#   - ``job_table_size``: the size of ``jobq_job`` in bytes (``pg_relation_size``: the
#     length of its files, under the lock the statement holds anyway), from which the
#     worker decides whether to plan its prepared statements again (``sql.plans``);
#   - ``claim_noted``: unless ``%(claim_note)s`` is NULL, the leases the statement took, as
#     ``%(claim_note)s`` followed by a JSON array of ``[id, attempt]``, kept in the session's
#     setting ``jobq.claim_note`` (``set_config(..., false)``: it outlives the statement's
#     commit), where the start of the claim's tasks, sent in the same round trip, reads them
#     (``sql.tasks.START_NOTED_TASK_ATTEMPTS``). A volatile column, so it is computed even
#     though the statement's result leaves it out;
# then the claimed job's columns, as the walk returns them. Costs: the lapsed rows since the last
# look, the
# front's ``2 * limit`` index entries from the positions, the locked rows.
_CLAIM_FRONT_TEMPLATE = """
WITH flow AS MATERIALIZED (
    SELECT {flow_digest} AS digest
), lapsed AS MATERIALIZED (
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
    SELECT id FROM jobq_job AS job
    WHERE id = ANY(ARRAY(SELECT id FROM front WHERE served)) AND (status = 'ready') IS TRUE
      AND {lane_is_free}
    ORDER BY priority DESC, run_at, id
    LIMIT %(limit)s - (SELECT count(*) FROM lapsed)
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE jobq_job AS job
    SET status = 'running',
        attempts = job.attempts + (job.attempts < 2147483647)::integer,
        worker_id = %(worker_id)s,
        started_at = now(),
        lease_deadline = now() + {lease_length}
    WHERE job.id = ANY(ARRAY(SELECT id FROM lapsed UNION ALL SELECT id FROM fast))
      AND (%(flow_digest)s::text IS NULL OR (SELECT digest FROM flow) = %(flow_digest)s)
    RETURNING job.id, job.queue, job.kind, job.payload::text AS payload, job.priority,
              LEAST(GREATEST(job.run_at, '0001-01-02 00:00:00+00'::timestamptz),
                    '9999-12-30 00:00:00+00'::timestamptz) AS run_at,
              job.attempts,
              job.max_attempts,
              {lease_length} AS visibility_timeout,
              job.lease_deadline,
              COALESCE(job.expires_at <= now(), false) AS expired,
              GREATEST(job.run_at, job.created_at) AS waiting_since,
              {poison_reason} AS poison,
              job.trace_context::text AS trace_context,
              job.ordering_key,
              job.abort_requested_at IS NOT NULL AS abort_requested
)
SELECT flag.front_full, flag.front_unserved, flag.claimed_at, flag.position_priorities,
       flag.position_run_ats, flag.position_ids, (SELECT digest FROM flow) AS flow_digest,
       flag.job_table_size, claimed.id, claimed.queue, claimed.kind, claimed.payload,
       claimed.priority, claimed.run_at, claimed.attempts, claimed.max_attempts,
       claimed.visibility_timeout, claimed.lease_deadline, claimed.expired,
       lapsed.id IS NOT NULL AS reclaimed,
       (EXTRACT(EPOCH FROM now())
        - EXTRACT(EPOCH FROM COALESCE(lapsed.lease_deadline, claimed.waiting_since)))::float8
           AS pickup_latency,
       claimed.poison, claimed.trace_context, claimed.ordering_key, claimed.abort_requested
FROM (
    SELECT (SELECT count(*) FROM front) = %(front)s AS front_full,
           EXISTS (SELECT FROM front WHERE NOT served) AS front_unserved,
           now() AS claimed_at,
           array_agg(position.priority ORDER BY position.priority DESC)
               AS position_priorities,
           array_agg(position.run_at ORDER BY position.priority DESC) AS position_run_ats,
           array_agg(position.id ORDER BY position.priority DESC) AS position_ids,
           pg_relation_size('jobq_job'::regclass) AS job_table_size,
           CASE WHEN %(claim_note)s::text IS NOT NULL THEN set_config(
               'jobq.claim_note',
               %(claim_note)s::text || (
                   SELECT COALESCE(jsonb_agg(jsonb_build_array(id, attempts)), '[]')::text
                   FROM claimed),
               false)
           END AS claim_noted
    FROM (
        SELECT DISTINCT ON (seen.priority) seen.priority,
               CASE WHEN seen.run_at BETWEEN '0001-01-02 00:00:00+00'::timestamptz
                                       AND '9999-12-30 00:00:00+00'::timestamptz
                   THEN seen.run_at END AS run_at,
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
LEFT JOIN (claimed LEFT JOIN lapsed ON lapsed.id = claimed.id) ON true
"""

# The claim's second statement, the walk, run by ``claims.claim`` only when the first one
# claimed fewer than ``limit`` and its front was full. It first tries as the first
# statement does (another claimer may have taken the front meanwhile): ``settled`` when
# ``fast`` got ``limit`` minus lapsed rows, or when ``front`` held every due job. Otherwise
# it walks the worker's kinds, reading ``jobq_job_kind_claim_idx`` (queue, kind, priority
# DESC, run_at, id; ready rows) and never the jobs of other kinds; its CTEs run only then:
#   - ``pairs``: the distinct (queue, kind) pairs of ready jobs (see above),
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

# The walk's ``pairs``: the distinct (queue, kind) pairs of ready jobs, in (queue, kind)
# order, a recursive CTE (the statement starts ``WITH RECURSIVE``): a loose index scan of
# ``jobq_job_kind_claim_idx``, one seek per pair (the first job of the next kind of the
# queue, else of the next queue), however many jobs each pair holds. Each row is the pair's
# first ready job in the index's order, which is claim order (``priority``, ``run_at``,
# ``id``): when it is due, it is the pair's first due job. ``{queue_filter}`` narrows it to
# some queues.
_CLAIM_WALK_TEMPLATE = """
WITH RECURSIVE flow AS MATERIALIZED (
    SELECT {flow_digest} AS digest
), lapsed AS MATERIALIZED (
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
    SELECT id FROM jobq_job AS job
    WHERE id = ANY(ARRAY(SELECT id FROM front WHERE served)) AND (status = 'ready') IS TRUE
      AND {lane_is_free}
    ORDER BY priority DESC, run_at, id
    LIMIT %(limit)s - (SELECT count(*) FROM lapsed)
    FOR UPDATE SKIP LOCKED
), settled AS MATERIALIZED (
    SELECT (SELECT count(*) FROM fast) = %(limit)s - (SELECT count(*) FROM lapsed)
           OR (SELECT count(*) FROM front) < %(front)s AS done
), pairs AS (
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
), firsts AS MATERIALIZED (
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
          AND job.run_at <= now() AND {lane_is_free}
        ORDER BY job.priority DESC, job.run_at, job.id
        LIMIT shares.share
        FOR UPDATE OF job SKIP LOCKED
    ) AS locked
), ready AS MATERIALIZED (
    SELECT id FROM fast WHERE (SELECT done FROM settled)
    UNION ALL
    SELECT id FROM walked WHERE NOT (SELECT done FROM settled)
), claimed AS (
    UPDATE jobq_job AS job
    SET status = 'running',
        attempts = job.attempts + (job.attempts < 2147483647)::integer,
        worker_id = %(worker_id)s,
        started_at = now(),
        lease_deadline = now() + {lease_length}
    WHERE job.id = ANY(ARRAY(SELECT id FROM lapsed UNION ALL SELECT id FROM ready))
      AND (%(flow_digest)s::text IS NULL OR (SELECT digest FROM flow) = %(flow_digest)s)
    RETURNING job.id, job.queue, job.kind, job.payload::text AS payload, job.priority,
              LEAST(GREATEST(job.run_at, '0001-01-02 00:00:00+00'::timestamptz),
                    '9999-12-30 00:00:00+00'::timestamptz) AS run_at,
              job.attempts,
              job.max_attempts,
              {lease_length} AS visibility_timeout,
              job.lease_deadline,
              COALESCE(job.expires_at <= now(), false) AS expired,
              GREATEST(job.run_at, job.created_at) AS waiting_since,
              {poison_reason} AS poison,
              job.trace_context::text AS trace_context,
              job.ordering_key,
              job.abort_requested_at IS NOT NULL AS abort_requested
)
SELECT claimed.id, claimed.queue, claimed.kind, claimed.payload,
       claimed.priority, claimed.run_at, claimed.attempts, claimed.max_attempts,
       claimed.visibility_timeout, claimed.lease_deadline, claimed.expired,
       lapsed.id IS NOT NULL AS reclaimed,
       (EXTRACT(EPOCH FROM now())
        - EXTRACT(EPOCH FROM COALESCE(lapsed.lease_deadline, claimed.waiting_since)))::float8
           AS pickup_latency,
       claimed.poison, claimed.trace_context, claimed.ordering_key, claimed.abort_requested
FROM claimed LEFT JOIN lapsed ON lapsed.id = claimed.id
"""

#: The claim's first statement reads this many times ``limit`` jobs at the front of the queue.
CLAIM_FRONT_FACTOR = 2

#: The claim's first statement from one queue (see above; ``%(queue)s``).
CLAIM_JOBS_ONE_QUEUE = _CLAIM_FRONT_TEMPLATE.format(
    queue_filter=_ONE_QUEUE,
    lease_length=LEASE_LENGTH,
    poison_reason=POISON_REASON,
    flow_digest=FLOW_DIGEST,
    lane_is_free=LANE_IS_FREE,
)
#: The same from several queues (``%(queues)s``).
CLAIM_JOBS_QUEUES = _CLAIM_FRONT_TEMPLATE.format(
    queue_filter=_QUEUES,
    lease_length=LEASE_LENGTH,
    poison_reason=POISON_REASON,
    flow_digest=FLOW_DIGEST,
    lane_is_free=LANE_IS_FREE,
)
#: The same from every queue but ``%(excluded_queues)s``.
CLAIM_JOBS_QUEUES_BUT = _CLAIM_FRONT_TEMPLATE.format(
    queue_filter=_QUEUES_BUT,
    lease_length=LEASE_LENGTH,
    poison_reason=POISON_REASON,
    flow_digest=FLOW_DIGEST,
    lane_is_free=LANE_IS_FREE,
)
#: The same from every queue.
CLAIM_JOBS_ANY_QUEUE = _CLAIM_FRONT_TEMPLATE.format(
    queue_filter="",
    lease_length=LEASE_LENGTH,
    poison_reason=POISON_REASON,
    flow_digest=FLOW_DIGEST,
    lane_is_free=LANE_IS_FREE,
)
#: The walk from one queue (see above; ``%(queue)s``).
CLAIM_JOBS_WALK_ONE_QUEUE = _CLAIM_WALK_TEMPLATE.format(
    queue_filter=_ONE_QUEUE,
    lease_length=LEASE_LENGTH,
    poison_reason=POISON_REASON,
    flow_digest=FLOW_DIGEST,
    lane_is_free=LANE_IS_FREE,
)
#: The walk from several queues (``%(queues)s``): ``pairs`` seeks only into the named queues.
CLAIM_JOBS_WALK_QUEUES = _CLAIM_WALK_TEMPLATE.format(
    queue_filter=_QUEUES,
    lease_length=LEASE_LENGTH,
    poison_reason=POISON_REASON,
    flow_digest=FLOW_DIGEST,
    lane_is_free=LANE_IS_FREE,
)
#: The walk from every queue but ``%(excluded_queues)s``.
CLAIM_JOBS_WALK_QUEUES_BUT = _CLAIM_WALK_TEMPLATE.format(
    queue_filter=_QUEUES_BUT,
    lease_length=LEASE_LENGTH,
    poison_reason=POISON_REASON,
    flow_digest=FLOW_DIGEST,
    lane_is_free=LANE_IS_FREE,
)
#: The walk from every queue: ``pairs`` walks every queue's kinds.
CLAIM_JOBS_WALK_ANY_QUEUE = _CLAIM_WALK_TEMPLATE.format(
    queue_filter="",
    lease_length=LEASE_LENGTH,
    poison_reason=POISON_REASON,
    flow_digest=FLOW_DIGEST,
    lane_is_free=LANE_IS_FREE,
)

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
# test is spelt ``(kind = ANY(...)) IS TRUE`` (see the claim's ``IS TRUE`` above): spelt plainly, a
# planner
# whose statistics say few rows are ready reads ``jobq_job_kind_claim_idx`` instead, every
# ready job of the worker's kinds, and sorts them for the first.
# Returns one row: the first claimable ready job's ``priority``, ``run_at`` (NULL when
# outside what Python holds, ``-infinity`` say) and ``id`` (all NULL when there is none),
# then whether a lapsed lease was found and its deadline (NULL when outside what Python
# holds).
_PROBE_CLAIM_POSITIONS_TEMPLATE = """
SELECT ready.priority AS priority,
       CASE WHEN ready.run_at BETWEEN '0001-01-02 00:00:00+00'::timestamptz
                                     AND '9999-12-30 00:00:00+00'::timestamptz
           THEN ready.run_at END AS run_at,
       ready.id AS id,
       lapsed.id IS NOT NULL AS lapsed,
       CASE WHEN lapsed.lease_deadline BETWEEN '0001-01-02 00:00:00+00'::timestamptz
                                     AND '9999-12-30 00:00:00+00'::timestamptz
           THEN lapsed.lease_deadline END AS lapsed_since
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
PROBE_CLAIM_POSITIONS_ONE_QUEUE = _PROBE_CLAIM_POSITIONS_TEMPLATE.format(queue_filter=_ONE_QUEUE)
#: The probe for several queues (``%(queues)s``, ``%(kinds)s``).
PROBE_CLAIM_POSITIONS_QUEUES = _PROBE_CLAIM_POSITIONS_TEMPLATE.format(queue_filter=_QUEUES)
#: The probe for every queue but ``%(excluded_queues)s`` (``%(kinds)s``).
PROBE_CLAIM_POSITIONS_QUEUES_BUT = _PROBE_CLAIM_POSITIONS_TEMPLATE.format(queue_filter=_QUEUES_BUT)
#: The probe for every queue (``%(kinds)s``).
PROBE_CLAIM_POSITIONS_ANY_QUEUE = _PROBE_CLAIM_POSITIONS_TEMPLATE.format(queue_filter="")

# -- when to claim next --------------------------------------------------------------------

# Seconds (on the database clock) until the next ready job's ``run_at`` or the next lease
# deadline of a job the asking worker does not hold (``%(held)s``: the ids of the jobs it
# holds, whose leases its heartbeater extends), whichever is first; NULL when neither
# exists. Leases recorded under the asker's worker id but not held by it (a crashed
# predecessor's with the same ``--worker-id``) count like any other worker's. An idle
# worker sleeps that long (at most its poll interval) instead of polling blindly. Only
# times not yet claimable count (``run_at > now()``, ``lease_deadline >= now()``: the claim's
# complements):
# due jobs were just claimed, or are locked by another claimer.
# The earliest future ``run_at`` is found with one index seek per distinct priority among
# the ready jobs (a loose index scan of ``jobq_job_claim_idx`` / ``jobq_job_claim_all_idx``,
# whose order is priority DESC, run_at): the recursive CTE walks the priorities, the
# LATERAL takes each one's first future ``run_at``. A backlog of scheduled jobs therefore
# costs a few seeks, not a scan. The deadline comes from ``jobq_job_lease_idx``, looking no
# further than ``%(horizon)s`` seconds ahead (the worker's poll interval: it wakes by then
# anyway). Without that bound the search would walk, in deadline order, every running job
# of other queues and every job this worker holds before the first that counts; with it,
# only the leases that lapse within the horizon.
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
SECONDS_UNTIL_DUE_ONE_QUEUE = _SECONDS_UNTIL_DUE_TEMPLATE.format(queue_filter=_ONE_QUEUE)
#: Seconds until something is due in any of several queues.
SECONDS_UNTIL_DUE_QUEUES = _SECONDS_UNTIL_DUE_TEMPLATE.format(queue_filter=_QUEUES)
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
RUNNING_JOB_EXISTS_ONE_QUEUE = _RUNNING_JOB_EXISTS_TEMPLATE.format(queue_filter=_ONE_QUEUE)
#: Whether a job of any of several queues is running.
RUNNING_JOB_EXISTS_QUEUES = _RUNNING_JOB_EXISTS_TEMPLATE.format(queue_filter=_QUEUES)
#: Whether a job of any queue is running.
RUNNING_JOB_EXISTS_ANY_QUEUE = _RUNNING_JOB_EXISTS_TEMPLATE.format(queue_filter="")
