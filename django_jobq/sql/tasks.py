"""Django tasks: the statements that write a task's result row beside its job.

A task's job has the task's module path as its kind and the payload
``{"result_id", "backend", "args", "kwargs"}``; its result is the ``jobq_task_result`` row
with that id (and ``task_path`` = the kind). The statements that record a job's outcome
(:mod:`django_jobq.sql.outcomes`) also write its result, and a worker's claim starts it
(the fragments below, ``sql.claims.CLAIM_JOBS_*_STARTING_TASKS``); these are the others:
the enqueue, attempts' starts where no claim started them, and the results of jobs
dead-lettered by a statement of their own.
"""

from __future__ import annotations

from .enqueue import INSERT_JOBS_TEMPLATE, LANE_STATUS
from .leases import FENCED

#: Enqueue tasks: ``INSERT_UNKEYED_JOBS`` (same parameters; tasks have no idempotency keys)
#: plus each job's READY result, in one statement and so in the caller's transaction.
#: ``run_after`` is recorded only for a deferred job (a job due at once has
#: ``run_at = created_at``, see ``INSERT_JOBS``).
INSERT_TASK_JOBS = INSERT_JOBS_TEMPLATE.format(
    lane_status=LANE_STATUS,
    on_conflict="",
    more_writes=""", result AS (
    INSERT INTO jobq_task_result (id, task_path, backend, queue, priority, args, kwargs,
                                  job_id, enqueued_at, status, run_after, errors, worker_ids)
    SELECT payload->>'result_id', kind, payload->>'backend', queue, priority, payload->'args',
           payload->'kwargs', id, created_at, 'READY', NULLIF(run_at, created_at), '[]', '[]'
    FROM saved
)""",
    key_columns="",
)

#: Attempts of tasks start: each result becomes RUNNING, records the start and appends the
#: worker id the claim wrote on the job; ``%(ids)s`` and ``%(attempts)s`` are zipped leases
#: (a worker starts in one statement, right after a claim, the tasks that claim did not start:
#: a limited claim's, or those whose result row is missing; a test's ``run_jobs`` one task
#: at a time). Inserts the result if it is missing. Fenced: a lease the attempt no longer
#: holds gets no row (and no write). Returns the results' rows.
#: ``commit_mode`` lets the transaction commit without waiting for its WAL to reach the disk
#: (``set_config(..., true)``: this transaction only, the whole statement when autocommit):
#: visible at once, lost only if the database server crashes within a fraction of a second.
#: Fit for this informative write only; outcomes are always committed durably.
_START_TASK_ATTEMPTS_TEMPLATE = """
WITH started AS (
    SELECT job.id, job.kind, job.queue, job.priority, job.payload, job.created_at,
           job.worker_id
    FROM jobq_job AS job
    JOIN unnest(%(ids)s::bigint[], %(attempts)s::integer[]) AS fence (id, attempt)
        ON {fenced}
), commit_mode AS (
    SELECT set_config('synchronous_commit', 'off', true)
)
INSERT INTO jobq_task_result AS result (id, task_path, backend, queue, priority, args, kwargs,
                                        job_id, enqueued_at, status, started_at,
                                        last_attempted_at, errors, worker_ids)
SELECT payload->>'result_id', kind, payload->>'backend', queue, priority, payload->'args',
       payload->'kwargs', id, created_at, 'RUNNING', now(), now(), '[]',
       jsonb_build_array(worker_id)
FROM started, commit_mode
ON CONFLICT (id) DO UPDATE
SET status = 'RUNNING',
    job_id = EXCLUDED.job_id,
    started_at = COALESCE(result.started_at, EXCLUDED.started_at),
    last_attempted_at = EXCLUDED.last_attempted_at,
    finished_at = NULL,
    worker_ids = result.worker_ids || EXCLUDED.worker_ids
RETURNING result.*
"""
START_TASK_ATTEMPTS = _START_TASK_ATTEMPTS_TEMPLATE.format(fenced=FENCED)

# -- a claim that starts its tasks ------------------------------------------------------------
#
# A worker that serves Django tasks claims with ``sql.claims.CLAIM_JOBS_*_STARTING_TASKS``:
# the claim statement itself marks RUNNING the results of the tasks it leases, so a task's
# pickup costs no round trip more than a plain job's. These are the three fragments a claim
# template is filled with; the plain claims are filled with empty ones.

#: The claim's CTE ``started`` (after ``claimed``): each claimed job of a kind in
#: ``%(task_kinds)s`` that will run (no poison row, not expired, not past its attempts; the
#: worker dead-letters those unrun) and whose payload names an existing result of its task
#: (``result_id`` and ``task_path`` = the kind) has that result made RUNNING, as
#: ``START_TASK_ATTEMPTS`` would: ``job_id``, the first start kept, ``last_attempted_at``
#: now, ``finished_at`` cleared, the claiming worker's id appended. Fenced by construction: it
#: writes only for the attempts this statement's claim started, in the claim's transaction
#: (durable, as the claim; atomic with it: no claim without its starts, no start without its
#: claim). An UPDATE, never an INSERT: no payload can make it fail on a constraint (and so
#: fail the claim); a task whose result row is missing or not its task's is left to
#: ``START_TASK_ATTEMPTS`` (``task_results.start_claimed``), which inserts it as before.
#: Returns each result as one jsonb object (``to_jsonb``): the claim's row type does not
#: depend on ``jobq_task_result``'s columns, so a migration that adds or retypes one costs
#: the prepared claim no "cached plan must not change result type".
TASK_STARTS_AT_CLAIM = """, started AS (
    UPDATE jobq_task_result AS result
    SET status = 'RUNNING',
        job_id = claimed.id,
        started_at = COALESCE(result.started_at, now()),
        last_attempted_at = now(),
        finished_at = NULL,
        worker_ids = result.worker_ids || jsonb_build_array(%(worker_id)s::text)
    FROM claimed
    WHERE claimed.kind = ANY(%(task_kinds)s::text[])
      AND claimed.poison IS NULL AND NOT claimed.expired
      AND claimed.attempts <= claimed.max_attempts
      AND result.id = claimed.payload::jsonb ->> 'result_id'
      AND result.task_path = claimed.kind
    RETURNING result.job_id, to_jsonb(result.*) AS task_result
)"""
#: The claim's output column of ``TASK_STARTS_AT_CLAIM``: the started result (jsonb), NULL
#: for a job whose claim started no result.
TASK_RESULT_AT_CLAIM = """,
       started.task_result"""
#: The join that gives each claimed job its started result.
TASK_JOIN_AT_CLAIM = """
    LEFT JOIN started ON started.job_id = claimed.id"""

#: Fail the results of tasks' jobs that were dead-lettered without running (as unknown
#: kinds, by a statement of their own): each ``(result_id, task_path, task_error)`` whose
#: result is of that task and not finished becomes FAILED, ``task_error`` (a JSON object)
#: appended to its errors. A result already finished is left as it is, so failing one twice
#: (or one the worker's ``sql.outcomes.DEAD_LETTER_JOB_WITH_RESULT`` failed) changes nothing.
#: Returns the results it failed.
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
