"""Outcomes: the statements that record how an attempt ended (ack, retry, dead letter), for
plain jobs and Django tasks' jobs alike.

Each is fenced (``sql.leases.FENCED``: it matches only the attempt that holds the lease) and
locks its rows as the batch writes of :mod:`django_jobq.sql.leases` do (``locked`` in id
order, ``FOR UPDATE SKIP LOCKED``; ``busy`` the rows skipped). A task's job (see
:mod:`django_jobq.sql.tasks`) has its result written in the same statement as its outcome,
so the two never disagree: each outcome has a statement for plain jobs and one ``..._WITH_
RESULT(S)`` that also writes the result, from the task's part (``%(return_values)s``,
``%(task_error)s``). The plain ones name no result, so a lock on ``jobq_task_result`` (a
``CREATE INDEX``, ``LOCK TABLE``) never delays a plain job's outcome.

Each statement returns one row per job written or busy: ``job`` (its id), ``busy``, and for
``ACK_JOBS_WITH_RESULTS`` and ``DEAD_LETTER_JOB_WITH_RESULT`` ``task_result``: the row of
``jobq_task_result`` the statement finished, as JSON text (``row_to_json``, see
``sql.tasks.START_TASK_ATTEMPTS``; NULL for a plain job or a busy one, and for a result the
ack finished that the worker holds already: ``ACK_JOBS_WITH_RESULTS`` then returns its
``finished_at``). Text, decoded by the worker row by row: a value Python cannot hold (a
time of ``'infinity'`` written by hand) never keeps the outcome from being recorded.
"""

from __future__ import annotations

from .leases import FENCED

#: Ack: delete finished jobs (``%(ids)s`` and ``%(attempts)s``, zipped), in one statement.
#: Locked (as above) and fenced. ``{results}`` is how the acks of tasks' jobs write their
#: results in the same statement: nothing (``ACK_JOBS``), or the results' CTE and columns
#: (``ACK_JOBS_WITH_RESULTS``).
_ACK_JOBS_TEMPLATE = """
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
), acked AS (
    DELETE FROM jobq_job AS job USING locked WHERE job.id = locked.id
    RETURNING job.id, job.kind, job.queue, job.priority, job.payload, job.created_at,
              job.worker_id
){results}
"""
#: What ``ACK_JOBS`` returns: the jobs acked and busy.
_JOBS_ONLY = """
SELECT id AS job, false AS busy FROM acked
UNION ALL
SELECT id, true FROM busy"""
#: What ``ACK_JOBS_WITH_RESULTS`` adds: make the result of each task's job SUCCESSFUL with
#: its return value (``%(return_values)s``, zipped with the ids: JSON text for a task's job,
#: NULL for a plain job), so that a result is successful exactly when its job is gone; the
#: ``ON CONFLICT`` recreates a result that is missing (pruned while its job sat in the dead
#: letters). Returns, for each task's job, the time it finished the result
#: (``finished_at``), and the result as JSON text (``task_result``) only where the worker
#: cannot make it from what it holds: a result this statement recreated (its ``started_at``
#: is NULL: no start wrote it) or one of ``%(read_back)s`` (job ids: return values given as
#: bare text, see ``outcomes.ReturnValue``). Any other result is the one its attempt's start
#: returned, which no statement but this attempt's has written since (each is fenced by the
#: job's lease), made SUCCESSFUL with the return value at ``finished_at``: not writing it
#: out again took 4 to 6 microseconds off the ack's server time per task (22.5 and 21.4
#: against 26.6 and 27.2, ``pg_stat_statements``), and reading it back off the worker
#: (docs/performance.md, "What a ``@task``'s result costs"). The tasks' jobs come from
#: ``stored``, the others from ``acked`` (``NOT IN``, a hashed subplan). Not a join of the
#: two: both are CTEs, estimated at one row, and the planner joins them by a nested loop
#: that reads ``stored`` whole for every acked job (7 of the 12.8 ms of an ack of 255
#: tasks).
_WITH_RESULTS = """, stored AS (
    INSERT INTO jobq_task_result AS result (id, task_path, backend, queue, priority, args,
                                            kwargs, job_id, enqueued_at, status, finished_at,
                                            return_value, errors, worker_ids)
    SELECT acked.payload->>'result_id', acked.kind, acked.payload->>'backend', acked.queue,
           acked.priority, acked.payload->'args', acked.payload->'kwargs', acked.id,
           acked.created_at, 'SUCCESSFUL', now(), done.return_value::jsonb, '[]',
           jsonb_build_array(acked.worker_id)
    FROM acked
    JOIN unnest(%(ids)s::bigint[], %(return_values)s::text[]) AS done (id, return_value)
        ON done.id = acked.id
    WHERE done.return_value IS NOT NULL
    ON CONFLICT (id) DO UPDATE
    SET status = 'SUCCESSFUL',
        job_id = EXCLUDED.job_id,
        finished_at = EXCLUDED.finished_at,
        return_value = EXCLUDED.return_value
    RETURNING result.job_id, result.finished_at,
              CASE WHEN result.started_at IS NULL OR result.job_id = ANY(%(read_back)s::bigint[])
                   THEN row_to_json(result.*)::text
              END AS task_result
)
SELECT job_id AS job, false AS busy, finished_at, task_result FROM stored
UNION ALL
SELECT id, false, NULL, NULL FROM acked WHERE id NOT IN (SELECT job_id FROM stored)
UNION ALL
SELECT busy.id, true, NULL, NULL FROM busy"""
#: The acks of a batch none of whose jobs is a task's: it touches no result, so it takes
#: no lock on ``jobq_task_result`` (a ``CREATE INDEX`` there delays no plain job's ack).
ACK_JOBS = _ACK_JOBS_TEMPLATE.format(fenced=FENCED, results=_JOBS_ONLY)
#: The acks of a batch holding tasks' jobs, their results written in the same statement.
ACK_JOBS_WITH_RESULTS = _ACK_JOBS_TEMPLATE.format(fenced=FENCED, results=_WITH_RESULTS)

#: Ack one job in the handler's own transaction (``ctx.atomic()``). Fenced; unlike
#: ``ACK_JOBS`` it waits for a row lock another transaction holds: the handler's
#: transaction must know whether its ack applies before it commits (it runs on the
#: handler's connection, so the wait stalls that job only). Returns the id if acked.
_ACK_JOB_IN_TRANSACTION_TEMPLATE = """
DELETE FROM jobq_job AS job
USING (VALUES (%(id)s::bigint, %(attempt)s::integer)) AS fence (id, attempt)
WHERE {fenced}
RETURNING job.id
"""
ACK_JOB_IN_TRANSACTION = _ACK_JOB_IN_TRANSACTION_TEMPLATE.format(fenced=FENCED)

#: Retry: make a failed attempt's job ready again after ``%(delay_seconds)s``, recording
#: ``%(error)s`` and keeping its attempt count (the next claim consumes the next attempt) and
#: the rest of the row (its ``trace_context``: every attempt's span has the same parent).
#: Locked (as above) and fenced. ``{result}`` is what a task's job adds: nothing
#: (``RETRY_JOB``) or its result's update (``RETRY_JOB_WITH_RESULT``). Returns a
#: ``(job, busy)`` row unless the lease is lost.
_RETRY_JOB_TEMPLATE = """
WITH locked AS MATERIALIZED (
    SELECT job.id FROM jobq_job AS job
    JOIN (VALUES (%(id)s::bigint, %(attempt)s::integer)) AS fence (id, attempt) ON {fenced}
    ORDER BY job.id
    FOR UPDATE OF job SKIP LOCKED
), busy AS (
    SELECT fence.id FROM (VALUES (%(id)s::bigint, %(attempt)s::integer)) AS fence (id, attempt)
    WHERE fence.id NOT IN (SELECT id FROM locked)
      AND EXISTS (SELECT 1 FROM jobq_job AS job WHERE {fenced})
), retried AS (
    UPDATE jobq_job AS job
    SET status = 'ready',
        run_at = now() + make_interval(secs => %(delay_seconds)s),
        worker_id = '',
        lease_deadline = NULL,
        started_at = NULL,
        last_error = %(error)s
    FROM locked
    WHERE job.id = locked.id
    RETURNING job.id, job.kind, job.payload
){result}
SELECT id AS job, false AS busy FROM retried
UNION ALL
SELECT id, true FROM busy
"""
#: What ``RETRY_JOB_WITH_RESULT`` adds: the task's result READY again, with this attempt's
#: error (``%(task_error)s``, a JSON object) appended to its errors.
_RETRIED_RESULT = """, result AS (
    UPDATE jobq_task_result AS result
    SET status = 'READY', errors = result.errors || jsonb_build_array(%(task_error)s::jsonb)
    FROM retried
    WHERE result.id = retried.payload->>'result_id' AND result.task_path = retried.kind
)"""
#: The retry of a plain job: it names no task result, so it takes no lock on
#: ``jobq_task_result``.
RETRY_JOB = _RETRY_JOB_TEMPLATE.format(fenced=FENCED, result="")
#: The retry of a task's job, its result written in the same statement.
RETRY_JOB_WITH_RESULT = _RETRY_JOB_TEMPLATE.format(fenced=FENCED, result=_RETRIED_RESULT)

#: Dead letter: move a job to the dead letters (copy + reason + error) and delete it, in one
#: statement and so one transaction: the job is in exactly one of the two tables. The copy
#: keeps the job's ``trace_context``, which its redrive gives the new job. Locked (as
#: above) and fenced. ``{results}`` is what a task's job adds: nothing (``DEAD_LETTER_JOB``)
#: or its result made FAILED (``DEAD_LETTER_JOB_WITH_RESULT``). ``attempts`` records the attempts
#: that ran: not the current one when ``%(ran)s`` is false (expired, unknown kind, or a
#: reclaim past the last attempt: dead-lettered unrun). Returns a row unless the lease is
#: lost: the dead letter's ``job``, ``busy``, then the failed result's columns.
_DEAD_LETTER_JOB_TEMPLATE = """
WITH locked AS MATERIALIZED (
    SELECT job.id FROM jobq_job AS job
    JOIN (VALUES (%(id)s::bigint, %(attempt)s::integer)) AS fence (id, attempt) ON {fenced}
    ORDER BY job.id
    FOR UPDATE OF job SKIP LOCKED
), busy AS (
    SELECT fence.id FROM (VALUES (%(id)s::bigint, %(attempt)s::integer)) AS fence (id, attempt)
    WHERE fence.id NOT IN (SELECT id FROM locked)
      AND EXISTS (SELECT 1 FROM jobq_job AS job WHERE {fenced})
), moved AS (
    DELETE FROM jobq_job AS job USING locked WHERE job.id = locked.id
    RETURNING job.*
), dead AS (
    INSERT INTO jobq_dead_letter (job_id, queue, kind, payload, priority, attempts,
                                  max_attempts, visibility_timeout, idempotency_key,
                                  created_at, reason, last_error, traceback, died_at,
                                  trace_context, ordering_key)
    SELECT id, queue, kind, payload, priority,
           CASE WHEN %(ran)s THEN attempts ELSE attempts - 1 END, max_attempts,
           visibility_timeout, idempotency_key, created_at, %(reason)s, %(error)s,
           %(traceback)s, now(), trace_context, ordering_key
    FROM moved
    RETURNING job_id
){results}
"""
#: What ``DEAD_LETTER_JOB`` returns: the job dead-lettered, or busy.
_DEAD_LETTER_ONLY = """
SELECT job_id AS job, false AS busy FROM dead
UNION ALL
SELECT id, true FROM busy"""
#: What ``DEAD_LETTER_JOB_WITH_RESULT`` adds: the task's result FAILED, with
#: ``%(task_error)s`` (a JSON object) appended to its errors; its JSON text follows the job.
#: A job of unknown kind whose payload names no result of its kind updates none.
_FAILED_RESULT = """, failed AS (
    UPDATE jobq_task_result AS result
    SET status = 'FAILED',
        finished_at = now(),
        errors = result.errors || jsonb_build_array(%(task_error)s::jsonb)
    FROM moved
    WHERE result.id = moved.payload->>'result_id' AND result.task_path = moved.kind
    RETURNING row_to_json(result.*)::text AS task_result
)
SELECT dead.job_id AS job, false AS busy, failed.task_result FROM dead LEFT JOIN failed ON true
UNION ALL
SELECT busy.id, true, NULL FROM busy"""
#: The dead letter of a plain job: it names no task result, so it takes no lock on
#: ``jobq_task_result``.
DEAD_LETTER_JOB = _DEAD_LETTER_JOB_TEMPLATE.format(fenced=FENCED, results=_DEAD_LETTER_ONLY)
#: The dead letter of a task's job (or of a job of unknown kind that may be one), its result
#: made FAILED in the same statement.
DEAD_LETTER_JOB_WITH_RESULT = _DEAD_LETTER_JOB_TEMPLATE.format(
    fenced=FENCED, results=_FAILED_RESULT
)

#: Wait this long at most for a table lock in the worker's writes about one job (a
#: transaction's ``SET LOCAL``; the worker's connections have a server-side ``lock_timeout``
#: of their own, :func:`django_jobq.db.connect`): a dead letter's insert waits for no
#: ``CREATE INDEX`` or ``LOCK TABLE`` on ``jobq_dead_letter``; the job's outcome is written
#: again later.
SET_SHORT_LOCK_TIMEOUT = "SET LOCAL lock_timeout = '100ms'"
