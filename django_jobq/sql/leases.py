"""Leases: the fence every write about a running job passes, and the writes that keep or
give back a lease (heartbeat, release).

A job's ``attempts`` is the number of its current attempt and serves as the lease's fencing
token. Every write a worker makes about a running job names ``(id, attempt)`` and requires
``status = 'running'`` (:data:`FENCED`), so a late write from a worker whose job was
reclaimed matches no row. The outcomes (:mod:`django_jobq.sql.outcomes`) and a task's start
(:mod:`django_jobq.sql.tasks`) pass the same fence.

The batch writes lock their rows first, in a ``locked`` CTE: the rows that pass the fence,
in id order, ``FOR UPDATE SKIP LOCKED``. A row another transaction holds (an operator's
``SELECT ... FOR UPDATE``, a handler's ``ctx.atomic()`` that has just acked it) is skipped,
never waited for: one locked row cannot stall a worker's writes about its other jobs, and
every batch takes its locks in the same order. The ``busy`` CTE names the skipped rows: a
plain read, in the statement's snapshot, of the rows that pass the fence but were not
locked. Every such statement returns ``(id, busy, ...)`` rows: ``busy`` false for a row
written, true for a row skipped because it is locked (nothing written: try again later). An
id in neither is a lost lease. A row changed by a transaction that committed during the
statement is rechecked against the fence by the lock and may be reported busy although its
lease is lost: the next try says so.
"""

from __future__ import annotations

#: The fence: true only for the row of job ``fence.id`` while attempt ``fence.attempt`` holds
#: its lease (the job table aliased ``job``, the lease in a relation ``fence(id, attempt)``).
#: The status test is spelt ``IS TRUE`` so that the planner finds the row by primary key, never
#: through the partial index of running jobs (see ``sql.claims``).
FENCED = "job.id = fence.id AND job.attempts = fence.attempt AND (job.status = 'running') IS TRUE"

#: A lease length that cannot overflow: the job's visibility timeout, clamped to what
#: ``enqueue`` accepts (1 ms to 10 years). ``now() + `` this is always a valid timestamp.
LEASE_LENGTH = (
    "LEAST(GREATEST(job.visibility_timeout, interval '0.001 seconds'), interval '3650 days')"
)

#: Heartbeat: extend the leases a worker holds (``%(ids)s`` and ``%(attempts)s``, zipped) to
#: ``now() + visibility_timeout`` (absolute, so missed beats do not accumulate credit;
#: clamped like the claim's, ``LEASE_LENGTH``). Locked as above; fenced, and refused once a
#: deadline has passed: a lapsed lease may already be reclaimed, or be about to be. Returns
#: ``(id, busy, lease_deadline, abort_requested)`` rows: the new deadline of each lease
#: extended, and whether an operator asked that attempt to stop (``sql.aborts``; false for a
#: busy row, which the next beat reads again); a missing id means that lease is lost.
_HEARTBEAT_JOBS_TEMPLATE = """
WITH locked AS MATERIALIZED (
    SELECT job.id FROM jobq_job AS job
    JOIN unnest(%(ids)s::bigint[], %(attempts)s::integer[]) AS fence (id, attempt)
        ON {fenced}
    WHERE job.lease_deadline > now()
    ORDER BY job.id
    FOR UPDATE OF job SKIP LOCKED
), busy AS (
    SELECT fence.id FROM unnest(%(ids)s::bigint[], %(attempts)s::integer[]) AS fence (id, attempt)
    WHERE fence.id NOT IN (SELECT id FROM locked)
      AND EXISTS (
          SELECT 1 FROM jobq_job AS job WHERE {fenced} AND job.lease_deadline > now()
      )
), extended AS (
    UPDATE jobq_job AS job
    SET lease_deadline = now() + {lease_length}
    FROM locked
    WHERE job.id = locked.id
    RETURNING job.id, job.lease_deadline, job.abort_requested_at IS NOT NULL AS abort_requested
)
SELECT id, false AS busy, lease_deadline, abort_requested FROM extended
UNION ALL
SELECT id, true, NULL, false FROM busy
"""
HEARTBEAT_JOBS = _HEARTBEAT_JOBS_TEMPLATE.format(fenced=FENCED, lease_length=LEASE_LENGTH)

#: Release: hand back leased jobs that never started (a stopping worker's prefetch;
#: ``%(ids)s`` and ``%(attempts)s``, zipped). The attempt the claim consumed is given back,
#: so a release costs the job nothing. Locked as above; fenced. ``{results}`` is what the
#: release of tasks' jobs adds: nothing (``RELEASE_JOBS``) or their results' undoing
#: (``RELEASE_JOBS_WITH_RESULTS``). Returns ``(id, busy)`` rows.
_RELEASE_JOBS_TEMPLATE = """
WITH locked AS MATERIALIZED (
    SELECT job.id FROM jobq_job AS job
    JOIN unnest(%(ids)s::bigint[], %(attempts)s::integer[]) AS fence (id, attempt)
        ON {fenced}
    ORDER BY job.id
    FOR UPDATE OF job SKIP LOCKED
), busy AS (
    SELECT fence.id FROM unnest(%(ids)s::bigint[], %(attempts)s::integer[]) AS fence (id, attempt)
    WHERE fence.id NOT IN (SELECT id FROM locked)
      AND EXISTS (SELECT 1 FROM jobq_job AS job WHERE {fenced})
), released AS (
    UPDATE jobq_job AS job
    SET status = 'ready',
        attempts = job.attempts - 1,
        worker_id = '',
        lease_deadline = NULL,
        started_at = NULL
    FROM locked
    WHERE job.id = locked.id
    RETURNING job.id, job.kind, job.payload
){results}
SELECT id, false AS busy FROM released
UNION ALL
SELECT id, true FROM busy
"""
#: What ``RELEASE_JOBS_WITH_RESULTS`` adds: the worker marks a task's result RUNNING when it
#: claims the job (``sql.tasks.START_TASK_ATTEMPTS``), so a release undoes that: the result
#: is READY again, without the worker id that start appended. A result whose released claim
#: was its first attempt (one worker id) loses ``started_at`` and ``last_attempted_at``; after
#: earlier attempts both stay (``last_attempted_at`` at the released claim's time). A result
#: that is not RUNNING (no start was written) is left as it is.
_RELEASED_RESULTS = """, result AS (
    UPDATE jobq_task_result AS result
    SET status = 'READY',
        started_at = CASE WHEN jsonb_array_length(result.worker_ids) > 1
                          THEN result.started_at END,
        last_attempted_at = CASE WHEN jsonb_array_length(result.worker_ids) > 1
                                 THEN result.last_attempted_at END,
        worker_ids = result.worker_ids - (jsonb_array_length(result.worker_ids) - 1)
    FROM released
    WHERE result.id = released.payload->>'result_id' AND result.task_path = released.kind
      AND result.status = 'RUNNING'
)"""
#: The release of plain jobs: it names no task result, so it takes no lock on
#: ``jobq_task_result``.
RELEASE_JOBS = _RELEASE_JOBS_TEMPLATE.format(fenced=FENCED, results="")
#: The release of jobs some of which are tasks' started at their claim, their results
#: undone in the same statement.
RELEASE_JOBS_WITH_RESULTS = _RELEASE_JOBS_TEMPLATE.format(fenced=FENCED, results=_RELEASED_RESULTS)
