"""Ordered lanes: jobs with the same ``ordering_key`` run one at a time, in enqueue order
(docs/flow-control.md, "Ordered lanes").

A lane's first job is ``ready`` (or ``running``); the jobs behind it are ``waiting``, out of every
claim's sight (the claim reads ready rows only). Enqueue decides (``sql.enqueue.LANE_STATUS``): a
job joining a lane that has a job waits. When a lane's job ends (its ack, its dead letter, a cancel)
the next one is made ready (``PROMOTE_LANES``, run by the worker that recorded the end, by the
enqueue of a waiting job once it committed, see :mod:`django_jobq.lanes`, and by every
maintenance round for the rest: ``PROMOTE_STALLED_LANES``). PostgreSQL refuses a second running job
in a lane (the unique index ``jobq_job_one_running_per_lane``): two ready jobs of one lane (enqueued
by two transactions at once into an empty lane) run one
after the other, the claim skipping a ready job whose lane has one running
(``sql.claims.LANE_IS_FREE``).
"""

from __future__ import annotations

_PROMOTE_TEMPLATE = """
WITH promoted AS (
    UPDATE jobq_job AS job
    SET status = 'ready', run_at = GREATEST(job.run_at, now())
    FROM (
        SELECT next.id FROM {lanes} AS lane(key)
        CROSS JOIN LATERAL (
            SELECT id, status FROM jobq_job
            WHERE ordering_key = lane.key
            ORDER BY ordering_key, id
            LIMIT 1
        ) AS next
        WHERE next.status = 'waiting'
          AND NOT EXISTS (SELECT FROM jobq_job AS running
                          WHERE running.ordering_key = lane.key AND running.status = 'running')
    ) AS head
    WHERE job.id = head.id AND job.status = 'waiting'
    RETURNING job.queue
)
SELECT count(*) AS promoted FROM (SELECT pg_notify(%(channel)s, queue) FROM promoted) AS woken
"""

#: Make the next job of each lane in ``%(lanes)s`` ready (due from now, or later if its
#: ``run_at`` says so: it takes its place in the claim order as a job enqueued now, where
#: the workers' claim positions find it at once), when the lane's first job (in
#: enqueue order, ``jobq_job_lane_idx``) is waiting and none of its jobs runs (the unique
#: index ``jobq_job_one_running_per_lane``): two index seeks per lane. Wakes the workers of
#: the queues that got a ready job (``%(channel)s``, at commit). Two promoters of one lane
#: find the same row; the second, once the first commits, finds it ready and skips it.
#: Returns how many jobs were made ready (``promoted``). (PostgreSQL folds the identical
#: notifications of one transaction into one.)
PROMOTE_LANES = _PROMOTE_TEMPLATE.format(lanes="unnest(%(lanes)s::text[])")

#: ``PROMOTE_LANES`` for every lane whose job ended without its worker promoting the next
#: (the worker crashed in between, an operator deleted the job): the lanes come from a loose
#: index scan of ``jobq_job_lane_idx``, one seek per lane with jobs.
PROMOTE_STALLED_LANES = _PROMOTE_TEMPLATE.format(
    lanes="""(
        WITH RECURSIVE lanes AS (
            (SELECT ordering_key AS key FROM jobq_job WHERE ordering_key IS NOT NULL
             ORDER BY ordering_key LIMIT 1)
            UNION ALL
            SELECT (SELECT ordering_key FROM jobq_job
                    WHERE ordering_key > lanes.key ORDER BY ordering_key LIMIT 1)
            FROM lanes WHERE lanes.key IS NOT NULL
        )
        SELECT key FROM lanes WHERE key IS NOT NULL
    )"""
)
