"""Maintenance: the clean-up one worker at a time does for everybody
(:mod:`django_jobq.worker.maintenance`), under the maintenance lock.

Retention (the ``PRUNE_*`` statements), the rescue of leases no worker could have written,
and the jobs no live worker can run: read (``WAITING_FOR_A_WORKER``, also for ``jobq_stats``
and the admin dashboard) and dead-lettered as unknown kinds (``DEAD_LETTER_UNKNOWN_KINDS``).
"""

from __future__ import annotations

#: Maintenance runs on one worker at a time: a transaction-scoped advisory lock, taken
#: without waiting (the other workers skip this round). Returns whether it took it.
TRY_MAINTENANCE_LOCK = "SELECT pg_try_advisory_xact_lock(%(key)s)"

# -- retention ------------------------------------------------------------------------------

# Delete rows of ``{table}`` whose ``{column}`` is older than ``%(older_than)s`` seconds, at
# most ``%(limit)s`` per statement so a large backlog never holds one long transaction (the
# maintenance round repeats it). ``{table}`` and ``{column}`` are filled with the names below.
_PRUNE_TEMPLATE = """
DELETE FROM {table}
WHERE id IN (
    SELECT id FROM {table}
    WHERE {column} < now() - make_interval(secs => %(older_than)s)
    ORDER BY {column}
    LIMIT %(limit)s
)
"""

#: Retention of dead letters (``JOBQ['DEAD_LETTER_RETENTION']``), by ``died_at``.
PRUNE_DEAD_LETTERS = _PRUNE_TEMPLATE.format(table="jobq_dead_letter", column="died_at")
#: Retention of dedup keys (``JOBQ['DEDUP_RETENTION']``), by ``created_at``.
PRUNE_DEDUP_KEYS = _PRUNE_TEMPLATE.format(table="jobq_dedup_key", column="created_at")
#: Retention of finished task results (``JOBQ['TASK_RESULT_RETENTION']``), by
#: ``finished_at``: results of ready or running tasks have none and are never pruned.
PRUNE_TASK_RESULTS = _PRUNE_TEMPLATE.format(table="jobq_task_result", column="finished_at")
#: Retention of the per-minute outcome rollups (``JOBQ['STATS_RETENTION']``), by ``minute``.
PRUNE_OUTCOME_ROLLUPS = _PRUNE_TEMPLATE.format(table="jobq_outcome_rollup", column="minute")
#: Retention of the per-minute queue samples (``JOBQ['STATS_RETENTION']``), by ``minute``.
PRUNE_QUEUE_SAMPLES = _PRUNE_TEMPLATE.format(table="jobq_queue_sample", column="minute")
#: Forget workers not seen for a while (crashed without deregistering), by ``last_seen``.
PRUNE_WORKER_PROCESSES = _PRUNE_TEMPLATE.format(table="jobq_worker_process", column="last_seen")

# -- stranded leases ------------------------------------------------------------------------

#: Rescue stranded leases: a running row whose lease deadline no worker could have written
#: (NULL, 'infinity', or further ahead than the longest lease, the claim's 10 years, with a
#: day's margin: a row written by another producer) would never lapse, never be reclaimed
#: and keep ``jobq_worker --burst`` waiting forever. Its deadline becomes now: the next claim
#: reclaims it (and quarantines it if it is a poison row). Rows another transaction has
#: locked are skipped. Served by ``jobq_job_lease_idx``. Returns the ids, as ``id``.
RESCUE_STRANDED_LEASES = """
WITH stranded AS MATERIALIZED (
    SELECT id FROM jobq_job
    WHERE status = 'running'
      AND (lease_deadline IS NULL OR lease_deadline > now() + interval '3651 days')
    ORDER BY id
    FOR UPDATE SKIP LOCKED
)
UPDATE jobq_job AS job SET lease_deadline = now()
FROM stranded WHERE job.id = stranded.id
RETURNING job.id
"""

# -- jobs no live worker can run (mixed fleets, removed kinds) ------------------------------
#
# A worker claims only the kinds it has (see the claim), so a job of a kind that no live
# worker serving its queue has would wait forever. Both statements below name the live
# workers in a ``live`` CTE: seen within ``%(stale_after)s`` seconds
# (``django_jobq.stats.STALE_AFTER``), with at least one kind (a misconfigured process that
# imported no ``jobs`` module serves nothing: it would otherwise turn every queue's outage
# into dead letters). A live worker serves a queue when its ``queues`` is NULL (every queue)
# or names it, and has a kind when its ``kinds`` list names it. A queue no live worker
# serves at all is an outage, not an unknown kind: its jobs are never named here.

# The (queue, kind) pairs of due ready jobs that wait for a worker that can run them: live
# workers serve the queue, none of them has the kind. Per pair: ``jobs``, the seconds the
# longest-waiting one has waited since it became due (``GREATEST(run_at, created_at)``, as
# the claim's pickup latency; infinite times left out), and ``known``, the kinds the live
# workers serving the queue have (a sorted jsonb list). Reads the registry (a few rows),
# one index seek per (queue, kind) pair of ready jobs (``pairs``: a loose index scan of
# ``jobq_job_kind_claim_idx``, as the claim's walk has it) and the waiting jobs themselves.
# Ordered by queue, kind. ``{counted}`` reads each pair's due jobs as ``job``: all of them
# (``WAITING_FOR_A_WORKER``), or the first few (``WAITING_FOR_A_WORKER_CAPPED``).
_WAITING_FOR_A_WORKER_TEMPLATE = """
WITH RECURSIVE live AS (
    SELECT queues, kinds FROM jobq_worker_process
    WHERE last_seen > now() - make_interval(secs => %(stale_after)s)
      AND jsonb_array_length(kinds) > 0
), pairs AS (
    (SELECT queue, kind, priority, run_at, id FROM jobq_job
     WHERE status = 'ready'
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
         WHERE job.status = 'ready' AND job.queue > pairs.queue
         ORDER BY job.queue, job.kind, job.priority DESC, job.run_at, job.id
         LIMIT 1)
        LIMIT 1
    ) AS next
)
SELECT pairs.queue, pairs.kind, counted.jobs,
       EXTRACT(EPOCH FROM now() - counted.since)::float8 AS oldest_age,
       (SELECT COALESCE(jsonb_agg(DISTINCT known.kind ORDER BY known.kind), '[]')
        FROM live AS worker, jsonb_array_elements_text(worker.kinds) AS known(kind)
        WHERE (worker.queues IS NULL OR worker.queues ? pairs.queue)) AS known
FROM pairs
CROSS JOIN LATERAL (
    SELECT count(*) AS jobs,
           min(GREATEST(job.run_at, job.created_at))
               FILTER (WHERE isfinite(GREATEST(job.run_at, job.created_at))) AS since
    FROM {counted}
) AS counted
WHERE counted.jobs > 0
  AND EXISTS (
      SELECT 1 FROM live AS worker
      WHERE (worker.queues IS NULL OR worker.queues ? pairs.queue)
  )
  AND NOT EXISTS (
      SELECT 1 FROM live AS worker
      WHERE (worker.queues IS NULL OR worker.queues ? pairs.queue)
        AND worker.kinds ? pairs.kind
  )
ORDER BY pairs.queue, pairs.kind
"""

#: The jobs waiting for a worker (see the template above), each pair's due jobs all
#: counted: the maintenance sweep's and ``jobq_stats``'.
WAITING_FOR_A_WORKER = _WAITING_FOR_A_WORKER_TEMPLATE.format(
    counted="""jobq_job AS job
    WHERE job.status = 'ready' AND job.queue = pairs.queue AND job.kind = pairs.kind
      AND job.run_at <= now()"""
)

#: ``WAITING_FOR_A_WORKER`` reading at most ``%(cap)s`` + 1 due jobs per pair, in claim
#: order (``jobq_job_kind_claim_idx``): ``jobs`` above ``%(cap)s`` means "more than", and
#: ``oldest_age`` is the longest wait among those jobs (a pair's oldest job, unless older
#: ones wait at a lower priority). For the admin dashboard, which must stay fast when a
#: kind's backlog waits for a worker.
WAITING_FOR_A_WORKER_CAPPED = _WAITING_FOR_A_WORKER_TEMPLATE.format(
    counted="""(
        SELECT run_at, created_at FROM jobq_job
        WHERE status = 'ready' AND queue = pairs.queue AND kind = pairs.kind AND run_at <= now()
        ORDER BY priority DESC, run_at
        LIMIT %(cap)s + 1
    ) AS job"""
)

#: Dead-letter the due ready jobs of the given (queue, kind) pairs (zipped arrays
#: ``%(queue)s``, ``%(kind)s``, with each pair's dead letters' ``%(reason)s``) that have waited
#: longer than ``%(grace)s`` seconds since they became due (``GREATEST(run_at,
#: created_at)``), in one statement: the copy and the delete together (the job is in exactly
#: one of the two tables); the caller fails a Django task's result in the same transaction
#: (``FAIL_UNRUN_TASK_RESULTS``) and announces it after the commit. Each pair is checked
#: again at the statement's snapshot (the caller read it with ``WAITING_FOR_A_WORKER`` a
#: moment before): only while live workers serve the queue and none has the kind (``live``
#: as above); a worker with the kind that registered in between saves them. At most
#: ``%(limit)s`` jobs per pair, locked FOR UPDATE SKIP LOCKED (a row another transaction
#: holds is left for the next round), found in claim order through
#: ``jobq_job_kind_claim_idx``. The dead letter's ``attempts`` are the job's: a ready job's
#: attempts all ran. Its error and traceback are ``%(error)s`` and ``%(traceback)s``.
#: Returns a ``(queue, kind, reason, payload)`` row per job dead-lettered, its payload cut
#: to its ``result_id``.
DEAD_LETTER_UNKNOWN_KINDS = """
WITH live AS (
    SELECT queues, kinds FROM jobq_worker_process
    WHERE last_seen > now() - make_interval(secs => %(stale_after)s)
      AND jsonb_array_length(kinds) > 0
), doomed AS (
    SELECT input.queue, input.kind, input.reason
    FROM unnest(%(queue)s::text[], %(kind)s::text[], %(reason)s::text[])
         AS input(queue, kind, reason)
    WHERE EXISTS (
        SELECT 1 FROM live AS worker
        WHERE (worker.queues IS NULL OR worker.queues ? input.queue)
    )
      AND NOT EXISTS (
        SELECT 1 FROM live AS worker
        WHERE (worker.queues IS NULL OR worker.queues ? input.queue)
          AND worker.kinds ? input.kind
    )
), locked AS MATERIALIZED (
    SELECT picked.id, doomed.reason FROM doomed
    CROSS JOIN LATERAL (
        SELECT job.id FROM jobq_job AS job
        WHERE job.status = 'ready' AND job.queue = doomed.queue AND job.kind = doomed.kind
          AND job.run_at <= now()
          AND GREATEST(job.run_at, job.created_at) < now() - make_interval(secs => %(grace)s)
        ORDER BY job.priority DESC, job.run_at, job.id
        LIMIT %(limit)s
        FOR UPDATE OF job SKIP LOCKED
    ) AS picked
), moved AS (
    DELETE FROM jobq_job AS job USING locked
    WHERE job.id = locked.id AND job.status = 'ready'
    RETURNING job.*, locked.reason AS dead_reason
), dead AS (
    INSERT INTO jobq_dead_letter (job_id, queue, kind, payload, priority, attempts,
                                  max_attempts, visibility_timeout, idempotency_key,
                                  created_at, reason, last_error, traceback, died_at,
                                  trace_context, ordering_key)
    SELECT id, queue, kind, payload, priority, attempts, max_attempts, visibility_timeout,
           idempotency_key, created_at, dead_reason, %(error)s, %(traceback)s, now(),
           trace_context, ordering_key
    FROM moved
    RETURNING job_id
)
SELECT moved.queue, moved.kind, moved.dead_reason AS reason,
       jsonb_build_object('result_id', moved.payload->'result_id') AS payload
FROM moved
ORDER BY moved.queue, moved.kind
"""
