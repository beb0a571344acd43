"""Flow control as workers see it: the state of pauses and limits, and the limited claim's
locks, counts and start log (docs/flow-control.md; :mod:`django_jobq.flow_state`,
:mod:`django_jobq.limited_claims`).

Operators write ``jobq_queue`` (pauses, queue limits) and ``jobq_kind_limit`` (kind limits).
A worker reads them (``FLOW_STATE``) and claims by what it read; every claim compares
``FLOW_DIGEST`` of the rows, computed in the claim statement itself, with the digest it read
(``sql.claims``): a claim whose worker missed a change commits nothing, so a pause or a new
limit binds every claim that starts after it commits.
"""

from __future__ import annotations

#: A digest of every pause and limit: md5 of each row's settings as text (``quote_nullable``
#: quotes each value, NULL as NULL; times as epoch seconds, whatever the session's time
#: zone), the rows sorted. Not the start log (``jobq_limit_state``): starts change no
#: setting. Reads both tables whole (a row per paused or limited queue and kind: a few).
FLOW_DIGEST = """(SELECT md5(COALESCE(string_agg(line, ',' ORDER BY line), ''))
     FROM (SELECT concat_ws(' ', 'queue', quote_nullable(name),
                            quote_nullable(EXTRACT(EPOCH FROM paused_at)),
                            quote_nullable(EXTRACT(EPOCH FROM paused_until)),
                            quote_nullable(concurrency_limit), quote_nullable(rate_limit))
               AS line
           FROM jobq_queue
           UNION ALL
           SELECT concat_ws(' ', 'kind', quote_nullable(kind),
                            quote_nullable(concurrency_limit), quote_nullable(rate_limit))
           FROM jobq_kind_limit) AS settings)"""

#: Whether the ``jobq_queue`` row aliased ``queue`` is paused now: paused, and not until a
#: time that has passed (the database clock). NULL for a queue without a row. One
#: definition for the claims' view (``FLOW_STATE``) and the operators' (``sql.flow_control``).
PAUSED = """(queue.paused_at IS NOT NULL
        AND (queue.paused_until IS NULL OR queue.paused_until > now()))"""

_FLOW_STATE_TEMPLATE = """
SELECT {digest} AS digest,
       (SELECT COALESCE(jsonb_agg(jsonb_build_array(
                   queue.name,
                   {paused},
                   EXTRACT(EPOCH FROM queue.paused_until - now())::float8,
                   queue.concurrency_limit,
                   queue.rate_limit)), '[]'::jsonb)
        FROM jobq_queue AS queue) AS queues,
       (SELECT COALESCE(jsonb_agg(jsonb_build_array(kind, concurrency_limit, rate_limit)),
                        '[]'::jsonb)
        FROM jobq_kind_limit) AS kinds
"""
#: What a worker reads of flow control, in one row: ``digest`` (``FLOW_DIGEST``), ``queues``
#: (a JSON array of ``[name, paused now, seconds until paused_until (NULL: none), concurrency
#: limit, rate limit]``, limits NULL where the row sets none) and ``kinds`` (``[kind,
#: concurrency limit, rate limit]``). Pausing depends on the database clock: a queue paused
#: until a time is paused only before it.
FLOW_STATE = _FLOW_STATE_TEMPLATE.format(digest=FLOW_DIGEST, paused=PAUSED)

#: The digest alone (``FLOW_DIGEST``): whether what a worker read is still true, for a worker
#: that ran no claim (every queue it serves is paused or limited).
SELECT_FLOW_DIGEST = f"SELECT {FLOW_DIGEST} AS digest"

#: Make sure each limited queue and kind (zipped ``%(scopes)s`` 'queue' / 'kind' and
#: ``%(names)s``) has the row its limited claims lock, with an empty start log. Writes
#: nothing for the rows that exist.
ENSURE_LIMIT_STATES = """
INSERT INTO jobq_limit_state (scope, name, recent_starts)
SELECT key.scope, key.name, '[]'::jsonb
FROM unnest(%(scopes)s::text[], %(names)s::text[]) AS key(scope, name)
ON CONFLICT (scope, name) DO NOTHING
"""

#: The first statement of a limited claim's transaction: lock the rows of the limited
#: queues (``%(queues)s``) and kinds (``%(kinds)s``) this claim may take jobs of, skipping
#: those another worker's limited claim holds (it never waits: that worker claims for them
#: now). Until the transaction ends, no other claim counts or takes jobs under these limits,
#: so the counts the next statement reads stay true. Returns each locked row with its start
#: log and the database clock (``clock_timestamp()``, epoch seconds) to read it against.
LOCK_LIMIT_STATES = """
SELECT scope, name, recent_starts, EXTRACT(EPOCH FROM clock_timestamp())::float8 AS now
FROM jobq_limit_state
WHERE (scope = 'queue' AND name = ANY(%(queues)s::text[]))
   OR (scope = 'kind' AND name = ANY(%(kinds)s::text[]))
FOR UPDATE SKIP LOCKED
"""

#: The second statement, after ``LOCK_LIMIT_STATES``: per locked key (zipped ``%(scopes)s``,
#: ``%(names)s``), how many of its jobs hold a live lease (running, deadline not passed),
#: fleet-wide. A new statement, so under READ COMMITTED it sees every claim committed before
#: the lock was taken. A lapsed lease holds no slot: its job is claimable, and the claim that
#: reclaims it counts it again. Reads the running jobs (``jobq_job_lease_idx``).
COUNT_LIVE_LEASES = """
SELECT key.scope, key.name, count(job.id) AS live
FROM unnest(%(scopes)s::text[], %(names)s::text[]) AS key(scope, name)
LEFT JOIN jobq_job AS job
    ON job.status = 'running' AND job.lease_deadline >= now()
   AND CASE key.scope WHEN 'queue' THEN job.queue = key.name ELSE job.kind = key.name END
GROUP BY key.scope, key.name
"""

#: The last statement before the commit: add the starts of this claim to the start logs of
#: the rate-limited keys, one zipped element per job started (``%(scopes)s``, ``%(names)s``,
#: ``%(job_ids)s``; ``%(windows)s`` seconds kept and ``%(keep)s`` starts kept at most, the
#: limit's count, repeated), dropping the starts older than the window. A log is a JSON
#: array of ``[job id, epoch seconds]``, stamped ``clock_timestamp()`` here, after the claim's
#: leases: never earlier than the claim. ``CONFIRM_START`` moves each to its handler's start.
RECORD_STARTS = """
UPDATE jobq_limit_state AS state
SET recent_starts = (
    SELECT COALESCE(jsonb_agg(kept.entry ORDER BY kept.start), '[]'::jsonb)
    FROM (
        SELECT entry, start FROM (
            SELECT entry, (entry->>1)::float8 AS start
            FROM jsonb_array_elements(state.recent_starts) AS entry
            UNION ALL
            SELECT jsonb_build_array(job_id, EXTRACT(EPOCH FROM clock_timestamp())::float8),
                   EXTRACT(EPOCH FROM clock_timestamp())::float8
            FROM unnest(key.job_ids) AS job_id
        ) AS starts
        WHERE start > EXTRACT(EPOCH FROM clock_timestamp())::float8 - key.window_seconds
        ORDER BY start DESC
        LIMIT key.keep
    ) AS kept
)
FROM (
    SELECT scope, name, array_agg(job_id) AS job_ids, max(window_seconds) AS window_seconds,
           max(keep) AS keep
    FROM unnest(%(scopes)s::text[], %(names)s::text[], %(job_ids)s::bigint[],
                %(windows)s::float8[], %(keep)s::integer[])
        AS started(scope, name, job_id, window_seconds, keep)
    GROUP BY scope, name
) AS key
WHERE state.scope = key.scope AND state.name = key.name
"""

#: A rate-limited job's handler is about to start: stamp its entry in the start logs of its
#: rate-limited queue and kind (zipped ``%(scopes)s``, ``%(names)s``) with
#: ``clock_timestamp()`` (its entry replaced, or added if the log dropped it). Run on the
#: handler's thread, committed before the handler starts: the log holds when the handlers
#: started, not when they were claimed, so a handler that started late behind its claim
#: still counts from its start (docs/flow-control.md, "How exact").
CONFIRM_START = """
UPDATE jobq_limit_state AS state
SET recent_starts = COALESCE(
        (SELECT jsonb_agg(entry) FROM jsonb_array_elements(state.recent_starts) AS entry
         WHERE (entry->>0)::bigint <> %(job_id)s),
        '[]'::jsonb)
    || jsonb_build_array(jsonb_build_array(%(job_id)s::bigint,
                                           EXTRACT(EPOCH FROM clock_timestamp())::float8))
FROM unnest(%(scopes)s::text[], %(names)s::text[]) AS key(scope, name)
WHERE state.scope = key.scope AND state.name = key.name
"""
