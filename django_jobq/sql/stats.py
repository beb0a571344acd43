"""The statistics' statements: what the queue holds now (depths, oldest ready ages, dead
letters by queue and kind) and what it did lately (per-minute samples of each queue's
state, per-minute rollups of the outcomes). Read by :mod:`django_jobq.stats` (``jobq_stats``,
the admin dashboard, the metrics' gauges) and written by the workers
(:mod:`django_jobq.worker.history`).
"""

from __future__ import annotations

# The state of every queue holding live jobs, read in one snapshot:
#   - ``ready``: claimable now: ready and due, or running with a lapsed lease (its worker
#     died or stalled; the next claim takes it); ``scheduled``: ready, ``run_at`` in the
#     future; ``running``: leased, the lease not lapsed;
#   - ``oldest_ready_age``: seconds the longest-waiting claimable job has waited since it
#     became claimable: ``GREATEST(run_at, created_at)`` for a ready job, its
#     ``lease_deadline`` for a lapsed lease (as for the claim's pickup latency); NULL when
#     nothing is claimable. The lapsed leases' deadlines come from ``jobq_job_lease_idx``.
# The counts read every live row (a parallel sequential scan; bench/README.md has figures).
# The oldest age costs a few index seeks
# whatever the depth: a loose index scan of ``jobq_job_claim_idx`` (queue, priority DESC,
# run_at) walks the distinct (queue, priority) pairs of ready jobs, and for each takes the
# first due job by ``run_at``. A job's wait starts at or after its ``run_at``, so only jobs
# with an earlier ``run_at`` than that first job's wait start can have waited longer: the
# ``earlier`` arm looks at those alone, which is none unless jobs were enqueued with a
# ``run_at`` in the past. An infinite wait start (a row not written by enqueue, e.g.
# ``lease_deadline = '-infinity'``) is left out of the age: ``now() - 'infinity'`` is an
# error; the claim dead-letters such a row soon anyway. Each row of ``state`` is a queue's.
# The template's slots, each filled with a literal fragment: ``{depths}`` counts the jobs,
# every row (``_EXACT_DEPTHS``) or at most a bound (``_CAPPED_DEPTHS``, the admin
# dashboard's); ``{result}`` is the statement's last part, which reads ``state``: the rows
# in queue order (``QUEUE_STATES``), or their insert as this minute's samples
# (``SAMPLE_QUEUES``).
_QUEUE_STATES_TEMPLATE = """
WITH RECURSIVE pairs AS (
    (SELECT queue, priority FROM jobq_job
     WHERE status = 'ready'
     ORDER BY queue, priority DESC
     LIMIT 1)
    UNION ALL
    SELECT next.queue, next.priority
    FROM pairs, LATERAL (
        (SELECT job.queue, job.priority FROM jobq_job AS job
         WHERE job.status = 'ready' AND job.queue = pairs.queue AND job.priority < pairs.priority
         ORDER BY job.priority DESC
         LIMIT 1)
        UNION ALL
        (SELECT job.queue, job.priority FROM jobq_job AS job
         WHERE job.status = 'ready' AND job.queue > pairs.queue
         ORDER BY job.queue, job.priority DESC
         LIMIT 1)
        LIMIT 1
    ) AS next
), oldest AS (
    SELECT pairs.queue,
           min(LEAST(first.since, earlier.since))
               FILTER (WHERE isfinite(LEAST(first.since, earlier.since))) AS since
    FROM pairs
    CROSS JOIN LATERAL (
        SELECT job.run_at, GREATEST(job.run_at, job.created_at) AS since FROM jobq_job AS job
        WHERE job.status = 'ready' AND job.queue = pairs.queue
          AND job.priority = pairs.priority AND job.run_at <= now()
        ORDER BY job.run_at
        LIMIT 1
    ) AS first
    CROSS JOIN LATERAL (
        SELECT min(GREATEST(job.run_at, job.created_at)) AS since FROM jobq_job AS job
        WHERE job.status = 'ready' AND job.queue = pairs.queue
          AND job.priority = pairs.priority
          AND job.run_at >= first.run_at AND job.run_at < LEAST(first.since, now())
    ) AS earlier
    GROUP BY pairs.queue
), lapsed AS (
    SELECT queue, min(lease_deadline) FILTER (WHERE isfinite(lease_deadline)) AS since
    FROM jobq_job
    WHERE status = 'running' AND lease_deadline < now()
    GROUP BY queue
), depths AS ({depths}), state AS (
    SELECT depths.queue, depths.ready, depths.scheduled, depths.running,
           EXTRACT(EPOCH FROM now() - LEAST(oldest.since, lapsed.since))::float8
               AS oldest_ready_age
    FROM depths
    LEFT JOIN oldest ON oldest.queue = depths.queue
    LEFT JOIN lapsed ON lapsed.queue = depths.queue
)
{result}"""
_EXACT_DEPTHS = """
    SELECT queue,
           count(*) FILTER (WHERE status = 'ready' AND run_at <= now()
                            OR status = 'running' AND lease_deadline < now()) AS ready,
           count(*) FILTER (WHERE status = 'ready' AND run_at > now()) AS scheduled,
           count(*) FILTER (WHERE status = 'running'
                            AND (lease_deadline < now()) IS NOT TRUE) AS running
    FROM jobq_job
    GROUP BY queue
"""
# The depths as ``_EXACT_DEPTHS`` has them, reading at most about ``%(cap)s`` index entries
# per queue and state, however deep the queue: ``ready`` and ``scheduled`` above ``%(cap)s``
# mean "more than ``%(cap)s``". Running jobs (and the lapsed leases among them, counted as
# ready) are counted exactly through ``jobq_job_lease_idx``: they are as many as the workers
# hold, not as many as wait. The ready jobs of each queue that are due (``<=``) or
# scheduled (``>``) are counted up to ``%(cap)s + 1``: per (queue, priority) pair of
# ``pairs``, the range of ``jobq_job_claim_idx`` on one side of ``now()``, the pairs walked
# until the count is reached (the outer LIMIT stops the loop). The ORDER BY makes it an
# index scan, which stops at the LIMIT (a bitmap scan would read the whole range first).
_CAPPED_DEPTHS = """
    SELECT parts.queue, sum(parts.ready)::bigint AS ready,
           sum(parts.scheduled)::bigint AS scheduled, sum(parts.running)::bigint AS running
    FROM (
        SELECT queue, count(*) FILTER (WHERE lease_deadline < now()) AS ready, 0 AS scheduled,
               count(*) FILTER (WHERE (lease_deadline < now()) IS NOT TRUE) AS running
        FROM jobq_job
        WHERE status = 'running'
        GROUP BY queue
        UNION ALL
        SELECT queues.queue, (SELECT count(*) FROM (
            SELECT 1 FROM pairs CROSS JOIN LATERAL (
                SELECT 1 FROM jobq_job AS job
                WHERE job.status = 'ready' AND job.queue = pairs.queue
                  AND job.priority = pairs.priority AND job.run_at <= now()
                ORDER BY job.run_at
                LIMIT %(cap)s + 1
            ) AS counted_job
            WHERE pairs.queue = queues.queue
            LIMIT %(cap)s + 1) AS counted), (SELECT count(*) FROM (
            SELECT 1 FROM pairs CROSS JOIN LATERAL (
                SELECT 1 FROM jobq_job AS job
                WHERE job.status = 'ready' AND job.queue = pairs.queue
                  AND job.priority = pairs.priority AND job.run_at > now()
                ORDER BY job.run_at
                LIMIT %(cap)s + 1
            ) AS counted_job
            WHERE pairs.queue = queues.queue
            LIMIT %(cap)s + 1) AS counted), 0
        FROM (SELECT DISTINCT queue FROM pairs) AS queues
    ) AS parts
    GROUP BY parts.queue
"""

#: Every queue's depth by state and its oldest ready age (see above), ordered by queue.
QUEUE_STATES = _QUEUE_STATES_TEMPLATE.format(
    depths=_EXACT_DEPTHS,
    result="""SELECT queue, ready, scheduled, running, oldest_ready_age FROM state
ORDER BY queue
""",
)

#: ``QUEUE_STATES`` with its counts stopping above ``%(cap)s`` (``_CAPPED_DEPTHS``): a few
#: index seeks per queue, plus up to ``%(cap)s`` + 1 index entries per queue and state, and the
#: running jobs: its cost does not grow with the backlog. For the admin dashboard.
QUEUE_STATES_CAPPED = _QUEUE_STATES_TEMPLATE.format(
    depths=_CAPPED_DEPTHS,
    result="""SELECT queue, ready, scheduled, running, oldest_ready_age FROM state
ORDER BY queue
""",
)

#: The dead letters counted by (queue, kind), for the admin dashboard: the first
#: ``%(groups)s`` pairs in (queue, kind) order, each counted up to ``%(cap)s`` + 1 (a count
#: above ``%(cap)s`` means "more than"). A loose index scan of ``jobq_dead_queue_kind_idx``,
#: one seek per pair (the next pair after the last, by row comparison), and up to ``%(cap)s``
#: + 1 of its index entries per pair: bounded however many dead letters there are. Each
#: count names its pair as a range of the index in its order (written as equalities, the
#: planner may rather scan the table until it has met ``%(cap)s`` + 1 of the pair's rows).
DEAD_LETTER_GROUPS_CAPPED = """
WITH RECURSIVE pairs AS (
    (SELECT queue, kind FROM jobq_dead_letter ORDER BY queue, kind LIMIT 1)
    UNION ALL
    SELECT next.queue, next.kind
    FROM pairs, LATERAL (
        SELECT dead.queue, dead.kind FROM jobq_dead_letter AS dead
        WHERE (dead.queue, dead.kind) > (pairs.queue, pairs.kind)
        ORDER BY dead.queue, dead.kind
        LIMIT 1
    ) AS next
), shown AS (
    SELECT queue, kind FROM pairs LIMIT %(groups)s
)
SELECT shown.queue, shown.kind,
       (SELECT count(*) FROM (
            SELECT 1 FROM jobq_dead_letter AS dead
            WHERE (dead.queue, dead.kind) >= (shown.queue, shown.kind)
              AND (dead.queue, dead.kind) <= (shown.queue, shown.kind)
            ORDER BY dead.queue, dead.kind
            LIMIT %(cap)s + 1) AS counted) AS dead_letters
FROM shown
ORDER BY shown.queue, shown.kind
"""

#: Turn JIT compilation off for the rest of the transaction. The admin dashboard's bounded
#: statements read a few thousand index entries, but the planner prices their per-queue
#: subqueries as if the (unknown) number of queues were large, and compiling them would
#: take longer than running them.
DISABLE_JIT = "SET LOCAL jit = off"

#: Whether this minute (UTC) has been sampled already: a worker asks this cheap question
#: before it takes a sample, so the scan runs about once a minute whatever the number of
#: workers. (Asked inside SAMPLE_QUEUES instead, it would still cost the statement's
#: planning, and on a large table its JIT compilation.)
QUEUES_SAMPLED_THIS_MINUTE = """
SELECT EXISTS (SELECT 1 FROM jobq_queue_sample WHERE minute = date_trunc('minute', now(), 'UTC'))
"""

#: Sample every queue's state (``QUEUE_STATES``' ``state``) into ``jobq_queue_sample`` for
#: the current minute (UTC), for the dashboard's charts. Two workers racing past
#: QUEUES_SAMPLED_THIS_MINUTE cannot write a minute twice (unique (queue, minute)); the
#: second one's rows are dropped. Returns the rows written.
SAMPLE_QUEUES = _QUEUE_STATES_TEMPLATE.format(
    depths=_EXACT_DEPTHS,
    result="""INSERT INTO jobq_queue_sample (queue, minute, ready, scheduled, running,
                               oldest_ready_age)
SELECT state.queue, date_trunc('minute', now(), 'UTC'), state.ready, state.scheduled,
       state.running, COALESCE(state.oldest_ready_age, 0)
FROM state
ON CONFLICT (queue, minute) DO NOTHING
RETURNING queue
""",
)

#: Add a worker's outcome counts and duration histograms to the current minute's rollup
#: rows (UTC), one row per (queue, kind), in one statement. Each input row's
#: ``%(bucket_count)s`` bucket counts are a slice of the flat ``%(buckets)s`` array, stored
#: as a jsonb array (jsonb, not an SQL array, so the model needs no
#: ``django.contrib.postgres``); an existing row's counts are added element by element. The
#: caller sorts the rows by (queue, kind), so concurrent flushes lock rows in the same order
#: and cannot deadlock. Concurrent workers add up: each increment is applied to the row as
#: it is when the update takes its lock.
UPSERT_OUTCOME_ROLLUPS = """
INSERT INTO jobq_outcome_rollup AS rollup (queue, kind, minute, succeeded, retried,
                                           dead_lettered, duration_sum, duration_buckets)
SELECT input.queue, input.kind, date_trunc('minute', now(), 'UTC'), input.succeeded,
       input.retried, input.dead_lettered, input.duration_sum,
       to_jsonb((%(buckets)s::bigint[])
                [(input.n - 1) * %(bucket_count)s + 1 : input.n * %(bucket_count)s])
FROM unnest(%(queue)s::text[], %(kind)s::text[], %(succeeded)s::bigint[], %(retried)s::bigint[],
            %(dead_lettered)s::bigint[], %(duration_sum)s::float8[])
     WITH ORDINALITY AS input(queue, kind, succeeded, retried, dead_lettered, duration_sum, n)
ON CONFLICT (queue, kind, minute) DO UPDATE
SET succeeded = rollup.succeeded + EXCLUDED.succeeded,
    retried = rollup.retried + EXCLUDED.retried,
    dead_lettered = rollup.dead_lettered + EXCLUDED.dead_lettered,
    duration_sum = rollup.duration_sum + EXCLUDED.duration_sum,
    duration_buckets = (
        SELECT jsonb_agg(before.count::bigint + added.count::bigint ORDER BY before.n)
        FROM jsonb_array_elements_text(rollup.duration_buckets)
             WITH ORDINALITY AS before(count, n)
        JOIN jsonb_array_elements_text(EXCLUDED.duration_buckets)
             WITH ORDINALITY AS added(count, n) USING (n)
    )
"""
