"""The operators' statements (admin actions, management commands): cancel ready jobs, run
them now, redrive dead letters. Each is set-based, one statement for a batch of ids
(:mod:`django_jobq.operations`).
"""

from __future__ import annotations

from .enqueue import LANE_STATUS

#: Cancel: delete ready jobs (and jobs waiting in their lane). A running job is never
#: cancelled this way (its worker holds a lease; deleting the row under it would only turn
#: its ack into a refused write). Returns each job's id and lane (``ordering_key``): the
#: caller then makes the lanes' next jobs ready (``sql.lanes.PROMOTE_LANES``). The job
#: of a Django task (see ``INSERT_TASK_JOBS``) makes its result FAILED in the same statement,
#: with a ``django_jobq.task_results.TaskNotRun`` error saying it was cancelled.
CANCEL_JOBS = """
WITH cancelled AS (
    DELETE FROM jobq_job
    WHERE id = ANY(%(ids)s::bigint[]) AND status IN ('ready', 'waiting')
    RETURNING id, kind, payload, ordering_key
), failed AS (
    UPDATE jobq_task_result AS result
    SET status = 'FAILED',
        finished_at = now(),
        errors = result.errors || jsonb_build_array(jsonb_build_object(
            'exception_class_path', 'django_jobq.task_results.TaskNotRun',
            'traceback', 'cancelled: the ready job was deleted by an operator'))
    FROM cancelled
    WHERE result.id = cancelled.payload->>'result_id' AND result.task_path = cancelled.kind
)
SELECT id, ordering_key FROM cancelled
"""

#: Run now: make ready jobs due at once (scheduled or backing off), keeping their attempts.
#: Wakes the workers at commit as enqueue does: one ``pg_notify`` on ``%(channel)s``
#: (``sql.wake.WAKE_CHANNEL``) per queue of a job made due (PostgreSQL sends one of each
#: distinct notification per transaction).
RUN_JOBS_NOW = """
WITH due AS (
    UPDATE jobq_job
    SET run_at = now()
    WHERE id = ANY(%(ids)s::bigint[]) AND status = 'ready' AND run_at > now()
    RETURNING id, queue
), woken AS (
    SELECT count(pg_notify(%(channel)s, queue)) FROM due
)
SELECT id FROM due CROSS JOIN woken
"""

#: Redrive: turn dead letters back into fresh jobs (attempts 0, due now, no expiry) and delete
#: them, in one statement. A dead letter whose idempotency key belongs to a live job of its
#: kind is left in place (that job is already the redrive), as is all but the oldest of
#: several dead letters sharing a key. Should such a job appear concurrently, the insert
#: fails and the whole statement rolls back: nothing is lost, the operator retries.
#: A dead letter that cannot become a job as it is, because the jobs table's constraints
#: (``models.JOB_INSERT_CONSTRAINTS``) would refuse it (the dead letter of a poison row
#: whose payload is not a JSON object or whose visibility timeout or attempts are out of
#: range: what those constraints ask of a ready row that a dead letter can lack, the redrive
#: writing the times and attempts itself), is left in place too, so that one such row never
#: fails a whole batch.
#: The job of a Django task (its payload names a result of its kind, see ``INSERT_TASK_JOBS``)
#: makes that result READY again in the same statement, pointing at the new job.
#: The new job keeps the dead letter's ``trace_context``: its attempts' spans join the trace
#: of the original enqueue, as its first attempts' did (docs/tracing.md, "Redrive").
#: A job in a lane joins it at the back, as a new enqueue does (``sql.enqueue.LANE_STATUS``).
#: Returns each new job's ``id`` and, for one stored waiting, its lane (``waiting_lane``; NULL
#: otherwise), which the caller promotes after its commit (:mod:`django_jobq.lanes`). The
#: queues of the jobs stored ready are notified on ``%(channel)s`` as enqueue's are: the
#: workers are woken at commit.
_REDRIVE_DEAD_LETTERS_TEMPLATE = """
WITH redriven AS (
    DELETE FROM jobq_dead_letter AS dead
    WHERE dead.id = ANY(%(ids)s::bigint[])
      AND jsonb_typeof(dead.payload) = 'object'
      AND dead.visibility_timeout BETWEEN interval '0.001 seconds' AND interval '3650 days'
      AND dead.max_attempts >= 0
      AND (dead.idempotency_key IS NULL OR (
          NOT EXISTS (
              SELECT 1 FROM jobq_job AS live
              WHERE live.kind = dead.kind AND live.idempotency_key = dead.idempotency_key
          )
          AND dead.id = (
              SELECT min(twin.id) FROM jobq_dead_letter AS twin
              WHERE twin.id = ANY(%(ids)s::bigint[])
                AND twin.kind = dead.kind AND twin.idempotency_key = dead.idempotency_key
          )
      ))
    RETURNING dead.*
), job AS (
    INSERT INTO jobq_job (queue, kind, payload, priority, max_attempts, visibility_timeout,
                          idempotency_key, trace_context, ordering_key, status)
    SELECT queue, kind, payload, priority, max_attempts, visibility_timeout, idempotency_key,
           trace_context, ordering_key, {lane_status}
    FROM (SELECT redriven.*, redriven.id AS position FROM redriven) AS input
    ORDER BY id
    RETURNING id, queue, kind, payload, ordering_key, status
), woken AS (
    SELECT count(pg_notify(%(channel)s, queue)) FROM job WHERE status = 'ready'
), ready_again AS (
    UPDATE jobq_task_result AS result
    SET status = 'READY', job_id = job.id, finished_at = NULL
    FROM job
    WHERE result.id = job.payload->>'result_id' AND result.task_path = job.kind
)
SELECT id, CASE WHEN status = 'waiting' THEN ordering_key END AS waiting_lane
FROM job CROSS JOIN woken
"""
REDRIVE_DEAD_LETTERS = _REDRIVE_DEAD_LETTERS_TEMPLATE.format(lane_status=LANE_STATUS)
