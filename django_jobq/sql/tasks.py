"""Django tasks: the statements that write a task's result row beside its job.

A task's job has the task's module path as its kind and the payload
``{"result_id", "backend", "args", "kwargs"}``; its result is the ``jobq_task_result`` row
with that id (and ``task_path`` = the kind). The statements that record a job's outcome
(:mod:`django_jobq.sql.outcomes`) also write its result; these are the others: the
enqueue, attempts' starts, and the results of jobs dead-lettered by a statement of
their own.
"""

from __future__ import annotations

from .claims import POISON_REASON
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
#: (the worker starts a whole claim's tasks in one statement, right after the claim; a
#: test's ``run_jobs`` one task at a time). Fenced: a lease the attempt no longer holds gets
#: no row (and no write). Returns each result's job id and, as ``started``, the columns of
#: the result its job does not hold, as a JSON array: its id and status, ``enqueued_at``,
#: ``started_at``, ``last_attempted_at``, ``run_after``, ``queue``, ``priority``,
#: ``errors``, ``worker_ids`` and ``return_value`` (``task_results.StartedResult``). The
#: rest (task path, backend, arguments) the worker has in the job's payload: not returning
#: them took 2 microseconds off the start's server time per task, and making the started
#: result of the rest costs the worker 8.4 microseconds where reading the whole row cost
#: 14.3 (docs/performance.md, "What a ``@task``'s result costs"). JSON text, decoded by the
#: worker row by row: a value Python cannot hold (JSON nested deeper than its recursion
#: limit, a time of ``'infinity'``, written by hand) fails that task's start only. The
#: statements that return a whole result (the acks', dead letters' and
#: ``FAIL_UNRUN_TASK_RESULTS``) return it as ``row_to_json(result.*)::text``, which writes
#: the row's text at once, where ``to_jsonb(...)::text`` builds a ``jsonb`` value first and
#: then prints it: the same object at 1.6 to 2.5 times the cost (``EXPLAIN ANALYZE`` of 256
#: tasks, 15 runs a round: an ack's medians 6.2 and 7.0 ms against 7.8 and 8.1, 5.1
#: returning neither; this start, when it returned the row, had fastest runs of 5.1 to 5.7
#: ms against 6.6 to 7.1, 3.9 to 4.8 returning neither). ``result.*``: the whole row even if
#: a later migration adds a column named ``result`` (a bare ``result`` would then name that
#: column, and every task's outcome would fail).
#: ``commit_mode`` lets the transaction commit without waiting for its WAL to reach the disk
#: (``set_config(..., true)``: this transaction only, the whole statement when autocommit):
#: visible at once, lost only if the database server crashes within a fraction of a second.
#: Fit for this informative write only; outcomes are always committed durably.
_START_TASK_ATTEMPTS_TEMPLATE = """
WITH {leases}started AS (
    SELECT job.id, job.kind, job.queue, job.priority, job.payload, job.created_at,
           job.worker_id
    FROM jobq_job AS job
    JOIN {fence} AS fence (id, attempt) ON {fenced}{which}
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
RETURNING result.job_id,
          json_build_array(result.id, result.status, result.enqueued_at, result.started_at,
                           result.last_attempted_at, result.run_after, result.queue,
                           result.priority, result.errors, result.worker_ids,
                           result.return_value)::text AS started
"""
START_TASK_ATTEMPTS = _START_TASK_ATTEMPTS_TEMPLATE.format(
    leases="",
    fence="unnest(%(ids)s::bigint[], %(attempts)s::integer[])",
    fenced=FENCED,
    which="",
)

# Which of the noted leases start (see ``START_NOTED_TASK_ATTEMPTS``).
_NOTED_STARTABLE_TEMPLATE = """
    WHERE job.id = ANY(ARRAY(SELECT id FROM noted))
      AND job.kind = ANY(%(kinds)s::text[])
      AND jsonb_typeof(job.payload) = 'object'
      AND jsonb_typeof(job.payload->'result_id') = 'string'
      AND job.abort_requested_at IS NULL
      AND ({poison_reason}) IS NULL
      AND NOT COALESCE(job.expires_at <= now(), false)
      AND job.attempts <= job.max_attempts"""

#: ``START_TASK_ATTEMPTS`` for the leases a claim statement just took and noted in the
#: session (``claim_noted`` in ``sql.claims``, after ``%(claim_note)s``): the worker sends
#: it after that statement's ``COMMIT``, in the same round trip, so a claim's tasks start
#: without a round trip of their own. A note that is not this claim's starts nothing (the
#: claim's failure skips the start, which reads only its own claim's note all the same). Of
#: those leases it starts the jobs the worker would: of the worker's task kinds
#: (``%(kinds)s``), with a payload that is an object holding a result id (a row written past
#: enqueue without one would fail the whole statement; its runner meets the problem alone),
#: no abort requested, not poison rows (``sql.claims.POISON_REASON``), not expired, not
#: past their attempts (the worker dead-letters those unrun). The jobs are found by primary
#: key (``id = ANY(ARRAY(...))``): joined to the note alone, whose length the planner cannot
#: know, a generic plan may read the whole job table.
START_NOTED_TASK_ATTEMPTS = _START_TASK_ATTEMPTS_TEMPLATE.format(
    leases="""noted AS (
    SELECT (lease->>0)::bigint AS id, (lease->>1)::integer AS attempt
    FROM jsonb_array_elements(
        CASE WHEN starts_with(current_setting('jobq.claim_note', true), %(claim_note)s::text)
            THEN substr(current_setting('jobq.claim_note', true),
                        length(%(claim_note)s::text) + 1)::jsonb
            ELSE '[]'::jsonb
        END) AS lease
), """,
    fence="noted",
    fenced=FENCED,
    which=_NOTED_STARTABLE_TEMPLATE.format(poison_reason=POISON_REASON),
)

#: Sent before ``START_NOTED_TASK_ATTEMPTS``, in the same transaction (the implicit one a
#: pipeline's statements share until its sync; ``SET LOCAL`` wants an explicit block): that
#: start waits at most this long for a lock on ``jobq_task_result`` (a migration's, a
#: ``CREATE INDEX``), then fails alone; its claim has committed already. The worker then
#: starts its tasks apart for a while (``task_results.START_APART_AFTER_LOCK``), so that its
#: claims of plain jobs name no task result.
SET_START_LOCK_TIMEOUT = "SELECT set_config('lock_timeout', '10ms', true)"

#: Fail the results of tasks' jobs that were dead-lettered without running (as unknown
#: kinds, by a statement of their own): each ``(result_id, task_path, task_error)`` whose
#: result is of that task and not finished becomes FAILED, ``task_error`` (a JSON object)
#: appended to its errors. A result already finished is left as it is, so failing one twice
#: (or one the worker's ``sql.outcomes.DEAD_LETTER_JOB_WITH_RESULT`` failed) changes nothing.
#: Returns the results it failed, each as JSON text (``row_to_json``), decoded by the worker
#: row by row (see ``START_TASK_ATTEMPTS``).
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
RETURNING row_to_json(result.*)::text AS task_result
"""
