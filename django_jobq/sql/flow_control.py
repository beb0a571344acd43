"""The operators' flow control (:mod:`django_jobq.flow_control`): pausing and resuming
queues, changing the limits of queues and kinds at run time, and reading them back.

The statements only write ``jobq_queue`` and ``jobq_kind_limit``: workers notice a change at
their next claim (the claim compares a digest of those rows). A change that may let idle
workers claim (a resume, a new limit) also wakes them: the same statement sends a
``pg_notify`` on ``%(channel)s`` (``sql.wake.WAKE_CHANNEL``) naming each queue concerned,
delivered when the transaction commits (and never if it rolls back), as enqueue's are. A
pause sends none: a paused queue's next claim finds nothing, woken or not.

"Paused" is always judged on the database clock: a row is paused while
``paused_at IS NOT NULL AND (paused_until IS NULL OR paused_until > now())``.
"""

from __future__ import annotations

from .flow import PAUSED

#: A recursive CTE, ``job_queues``: the distinct queues of ready jobs, by a loose index scan
#: of ``jobq_job_claim_idx`` (``queue`` first): one index seek per queue, whatever the
#: backlog, never a scan of the jobs; its last row is NULL.
_READY_QUEUES = """job_queues AS (
    (SELECT queue FROM jobq_job WHERE status = 'ready' ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT job.queue FROM jobq_job AS job
            WHERE job.status = 'ready' AND job.queue > job_queues.queue
            ORDER BY job.queue
            LIMIT 1)
    FROM job_queues
    WHERE job_queues.queue IS NOT NULL
)"""

#: A condition on the timestamptz before it: a time a Python datetime holds in any time zone
#: (years 1 to 9999, with a day to spare; ``models.PAUSE_TIMES``, the pauses' CHECK
#: constraints), as the claims' read of ``run_at`` has it (``sql.claims``).
_HELD_BY_PYTHON = "BETWEEN '0001-01-02 00:00:00+00' AND '9999-12-30 00:00:00+00'"

#: The queues the operators see (``flow_control.queue_states``) and their controls, by name:
#: the names the code gives (``%(named)s``: settings, registry, Tasks backends), every
#: ``jobq_queue`` row, the queues that hold ready jobs and those live workers serve
#: (registered within ``%(stale_after)s`` seconds; a worker of every queue names none). The
#: queues of ready jobs come from ``_READY_QUEUES``' loose index scan. ``paused`` is the
#: pause in effect now: a row whose ``paused_until`` has passed keeps its times but is not
#: paused. A name without a row has NULL controls. A time outside what a Python datetime
#: holds (a row written by hand: 'infinity', year 20000) comes back NULL: paused since an
#: unknown time, or until resumed. The limits come back as stored, for the caller to check.
_QUEUE_CONTROLS_TEMPLATE = """
WITH RECURSIVE {ready_queues}, names AS (
    SELECT unnest(%(named)s::text[]) AS name
    UNION
    SELECT name FROM jobq_queue
    UNION
    SELECT queue FROM job_queues WHERE queue IS NOT NULL
    UNION
    SELECT jsonb_array_elements_text(worker.queues) FROM jobq_worker_process AS worker
    WHERE jsonb_typeof(worker.queues) = 'array'
      AND worker.last_seen > now() - make_interval(secs => %(stale_after)s::float8)
)
SELECT names.name, queue.name IS NOT NULL AS has_row, COALESCE({paused}, false) AS paused,
       CASE WHEN queue.paused_at {held_by_python}
           THEN queue.paused_at END AS paused_at,
       CASE WHEN queue.paused_until {held_by_python}
           THEN queue.paused_until END AS paused_until,
       queue.concurrency_limit, queue.rate_limit
FROM names
LEFT JOIN jobq_queue AS queue ON queue.name = names.name
ORDER BY names.name
"""
QUEUE_CONTROLS = _QUEUE_CONTROLS_TEMPLATE.format(
    ready_queues=_READY_QUEUES, paused=PAUSED, held_by_python=_HELD_BY_PYTHON
)

#: Pause the queues ``%(names)s`` (distinct, sorted: rows are locked in one order) until
#: ``%(until)s`` (an absolute time), or ``%(seconds)s`` from now on the database clock, or
#: (both NULL) until resumed. A queue that is paused already keeps its ``paused_at`` (paused
#: since then) and gets the new end; any other, or one paused since a time outside what a
#: Python datetime holds (a row written by hand), starts its pause now. Refuses an end that is
#: not in the future on the database clock: then no row is written or returned. Writes a
#: row for a queue that has none. Sends no notification (see the module docs). Returns each
#: queue's pause as stored.
_PAUSE_QUEUES_TEMPLATE = """
WITH input AS (
    SELECT name, COALESCE(%(until)s::timestamptz,
                          now() + make_interval(secs => %(seconds)s::float8)) AS until
    FROM unnest(%(names)s::text[]) AS name
)
INSERT INTO jobq_queue AS queue (name, paused_at, paused_until, updated_at)
SELECT name, now(), until, now()
FROM input
WHERE until IS NULL OR until > now()
ORDER BY name
ON CONFLICT (name) DO UPDATE
SET paused_at = CASE WHEN {paused}
                         AND queue.paused_at {held_by_python}
                    THEN queue.paused_at ELSE now() END,
    paused_until = EXCLUDED.paused_until,
    updated_at = now()
RETURNING queue.name, queue.paused_at, queue.paused_until
"""
PAUSE_QUEUES = _PAUSE_QUEUES_TEMPLATE.format(paused=PAUSED, held_by_python=_HELD_BY_PYTHON)

#: Resume the queues ``%(names)s``: clear the pause of each that has one (in effect, or
#: ended by its ``paused_until`` and not cleared yet), and wake the workers serving each at
#: commit. ``was_paused`` says whether its pause was in effect (read from the row as it was,
#: ``before``, locked by the update). A queue without a pause is left as it is.
RESUME_QUEUES = """
WITH resumed AS (
    UPDATE jobq_queue AS queue
    SET paused_at = NULL, paused_until = NULL, updated_at = now()
    FROM jobq_queue AS before
    WHERE before.name = queue.name AND queue.name = ANY(%(names)s::text[])
      AND queue.paused_at IS NOT NULL
    RETURNING queue.name,
              (before.paused_until IS NULL OR before.paused_until > now()) AS was_paused
)
SELECT name, was_paused, pg_notify(%(channel)s, name) FROM resumed
ORDER BY name
"""

#: Replace the operators' limits of queue ``%(name)s`` (NULL: none, the setting's applies),
#: writing its row if it has none, and wake the workers serving it at commit. With
#: ``%(keep_concurrency)s`` (``%(keep_rate)s``) true, that limit is left as stored instead.
SET_QUEUE_LIMITS = """
WITH changed AS (
    INSERT INTO jobq_queue AS queue (name, concurrency_limit, rate_limit, updated_at)
    VALUES (%(name)s, %(concurrency_limit)s, %(rate_limit)s, now())
    ON CONFLICT (name) DO UPDATE
    SET concurrency_limit = CASE WHEN %(keep_concurrency)s THEN queue.concurrency_limit
                                 ELSE EXCLUDED.concurrency_limit END,
        rate_limit = CASE WHEN %(keep_rate)s THEN queue.rate_limit ELSE EXCLUDED.rate_limit END,
        updated_at = now()
    RETURNING queue.name, queue.concurrency_limit, queue.rate_limit
)
SELECT name, concurrency_limit, rate_limit, pg_notify(%(channel)s, name) FROM changed
"""

#: Replace the operators' limits of kind ``%(kind)s`` (NULL: none, ``@job``'s applies), as
#: ``SET_QUEUE_LIMITS`` does for a queue, and wake the workers of every queue its jobs can
#: be claimed from: ``%(queues)s`` (the kind's queue as the registry has it), and each
#: queue holding ready jobs of the kind. Those come from ``_READY_QUEUES``' loose index
#: scan and, per queue, one seek of ``jobq_job_kind_claim_idx`` (queue, kind): bounded by
#: the number of queues, whatever the backlog. A queue holding none of its ready jobs has
#: nothing a changed limit lets a worker claim now (a job enqueued later wakes the workers
#: itself). Returns the queues notified. (A data-modifying CTE runs once, to completion,
#: whether or not the query reads it: ``changed`` is written even when no queue is woken.)
_SET_KIND_LIMITS_TEMPLATE = """
WITH RECURSIVE {ready_queues}, changed AS (
    INSERT INTO jobq_kind_limit AS kind_limit (kind, concurrency_limit, rate_limit, updated_at)
    VALUES (%(kind)s, %(concurrency_limit)s, %(rate_limit)s, now())
    ON CONFLICT (kind) DO UPDATE
    SET concurrency_limit = CASE WHEN %(keep_concurrency)s THEN kind_limit.concurrency_limit
                                 ELSE EXCLUDED.concurrency_limit END,
        rate_limit = CASE WHEN %(keep_rate)s THEN kind_limit.rate_limit
                          ELSE EXCLUDED.rate_limit END,
        updated_at = now()
    RETURNING kind_limit.kind
), woken AS (
    SELECT unnest(%(queues)s::text[]) AS queue
    UNION
    SELECT job_queues.queue FROM job_queues
    WHERE job_queues.queue IS NOT NULL AND EXISTS (
        SELECT 1 FROM jobq_job AS job
        WHERE job.status = 'ready' AND job.queue = job_queues.queue AND job.kind = %(kind)s)
)
SELECT queue, pg_notify(%(channel)s, queue) FROM woken
ORDER BY queue
"""
SET_KIND_LIMITS = _SET_KIND_LIMITS_TEMPLATE.format(ready_queues=_READY_QUEUES)
