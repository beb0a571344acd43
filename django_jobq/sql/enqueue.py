"""Enqueue's statements: new jobs, each written once, and the keys that make a write happen
at most once.

``INSERT_JOBS`` and its forms insert a batch of jobs in one statement and wake the workers
of their queues; ``SELECT_JOBS_BY_KEY`` reads the live jobs holding the idempotency keys an
insert skipped (:mod:`django_jobq.enqueueing`). ``INSERT_DEDUP_KEY`` records a handler's
dedup key in its own transaction (:mod:`django_jobq.idempotency`).
"""

from __future__ import annotations

#: A new job's status: ``ready``, or ``waiting`` when it joins a lane (``ordering_key``)
#: that already has a job, or that an earlier row of the same statement joins (rows in
#: ``position`` order). Reads the lane's first entry of ``jobq_job_lane_idx``. A job
#: enqueued concurrently into the same empty lane by another transaction is not seen: both
#: are ready, and the claim runs them one after the other all the same (``sql.lanes``). A
#: job stored waiting behind one that ends before this insert commits is made ready by the
#: enqueue itself, after its commit (:mod:`django_jobq.lanes`).
#: Used with a row source named ``input`` with ``ordering_key`` and ``position`` columns.
LANE_STATUS = """CASE
        WHEN input.ordering_key IS NULL THEN 'ready'
        WHEN row_number() OVER (PARTITION BY input.ordering_key ORDER BY input.position) = 1
             AND NOT EXISTS (SELECT FROM jobq_job AS lane
                             WHERE lane.ordering_key = input.ordering_key)
            THEN 'ready'
        ELSE 'waiting'
    END"""

#: Insert one or many jobs in a single statement (one array per column, zipped by ``unnest``).
#: ``run_at`` is either given or the statement's time plus the delay, on the database clock,
#: so workers and web servers with skewed clocks agree. The statement's time, not the
#: transaction's ``now()``, is also ``created_at``'s default: a job due at once has
#: ``run_at = created_at`` even when enqueued late in a long transaction.
#: Idempotent enqueue: when a live job of the same kind already has the idempotency key,
#: ``DO NOTHING`` skips the row, taking no lock on that job (a no-op ``DO UPDATE`` would
#: lock it until the producer commits, and the job's heartbeat and ack would wait behind
#: the producer). The caller reads the skipped keys' jobs with ``SELECT_JOBS_BY_KEY``. The
#: only waits are on the unique index, for a concurrent insert of the same key until its
#: transaction ends; the caller sorts a batch by (kind, key), so two batches wait for each
#: other's keys in the same order and cannot deadlock (``unnest`` yields, and the insert
#: takes, the rows in array order). The caller removes duplicate keys within one batch.
#: RETURNING yields one row per inserted row, in input order (as Django's ``bulk_create``
#: relies on): every row without a key, and the keyed rows not skipped, which the keyed
#: form names by ``kind`` and ``idempotency_key``. The result carries only what the
#: database chose (id and times): the caller has the rest. The arrays are binary parameters
#: (``%(name)b``): on a server-binding cursor psycopg sends them without converting each
#: value to text.
#: The same statement wakes the workers: one ``pg_notify`` on ``%(channel)s`` per distinct
#: queue that got a new ready job (one waiting in its lane wakes nobody: the end of the job
#: ahead of it makes it ready), the payload naming the queue (the uncorrelated subquery in the
#: WHERE runs once, before the first row). Notifications are delivered at commit, never for a
#: rollback, and PostgreSQL folds identical ones of one transaction into one, so enqueueing in
#: a loop inside ``atomic()`` still sends one per queue. ``{more_writes}`` takes further
#: data-modifying CTEs over ``saved`` (they must sit at the top level of the statement).
#: ``%(trace_context)s`` is one value for the whole batch, stored in every row: the enqueue's
#: OpenTelemetry context (JSON text, see :mod:`django_jobq.tracing`), or NULL.
#: ``status`` is ``{lane_status}`` (``LANE_STATUS``, over the rows in input order).
#: Its slots, each filled with a literal fragment: ``{on_conflict}`` (the keyed form's
#: ``ON CONFLICT ... DO NOTHING``, or nothing), ``{more_writes}`` (``, name AS (...)`` CTEs,
#: or nothing: ``INSERT_TASK_JOBS`` writes each job's task result there) and
#: ``{key_columns}`` (``, kind, idempotency_key`` for the keyed form, or nothing).
INSERT_JOBS_TEMPLATE = """
WITH saved AS (
    INSERT INTO jobq_job (queue, kind, payload, priority, run_at, expires_at, max_attempts,
                          visibility_timeout, idempotency_key, trace_context, ordering_key,
                          status)
    SELECT queue, kind, payload, priority,
           COALESCE(run_at, statement_timestamp() + make_interval(secs => delay_seconds)),
           COALESCE(expires_at,
                    statement_timestamp() + make_interval(secs => expires_after_seconds)),
           max_attempts, visibility_timeout, idempotency_key, %(trace_context)s::jsonb,
           ordering_key, {lane_status}
    FROM unnest(%(queue)b::text[], %(kind)b::text[], %(payload)b::jsonb[],
                %(priority)b::integer[], %(run_at)b::timestamptz[], %(delay_seconds)b::float8[],
                %(expires_at)b::timestamptz[], %(expires_after_seconds)b::float8[],
                %(max_attempts)b::integer[], %(visibility_timeout)b::interval[],
                %(idempotency_key)b::text[], %(ordering_key)b::text[])
         WITH ORDINALITY
         AS input(queue, kind, payload, priority, run_at, delay_seconds, expires_at,
                  expires_after_seconds, max_attempts, visibility_timeout,
                  idempotency_key, ordering_key, position)
    ORDER BY position
    {on_conflict}
    RETURNING *
), woken AS (
    SELECT pg_notify(%(channel)s, queue)
    FROM (SELECT DISTINCT queue FROM saved WHERE status = 'ready') AS queues
){more_writes}
SELECT id, run_at, created_at, expires_at, status{key_columns} FROM saved
WHERE (SELECT count(*) FROM woken) >= 0
"""
#: Insert jobs some of which have idempotency keys (the template's keyed form): a row whose
#: key a live job of its kind holds is skipped, taking no lock on that job; RETURNING names
#: each inserted row by ``kind`` and ``idempotency_key``.
INSERT_JOBS = INSERT_JOBS_TEMPLATE.format(
    lane_status=LANE_STATUS,
    on_conflict="""ON CONFLICT (kind, idempotency_key) WHERE idempotency_key IS NOT NULL
    DO NOTHING""",
    more_writes="",
    key_columns=", kind, idempotency_key",
)
#: ``INSERT_JOBS`` for jobs none of which has an idempotency key (same parameters; one row
#: per input row): without ``ON CONFLICT`` each row is a plain insert, not a speculative
#: one, which writes less WAL (an extra record per row confirms a speculative insert).
INSERT_UNKEYED_JOBS = INSERT_JOBS_TEMPLATE.format(
    lane_status=LANE_STATUS, on_conflict="", more_writes="", key_columns=""
)

#: The live jobs holding idempotency keys, given as ``(kind, key)`` pairs (zipped arrays):
#: what an idempotent enqueue returns for the keys ``INSERT_JOBS`` skipped. A plain read,
#: which takes no lock and waits for none; a new statement, so under READ COMMITTED it sees
#: the rows whose inserters ``INSERT_JOBS`` waited for. A key whose job ended in between
#: (acked, dead-lettered) is missing: the caller inserts it again.
SELECT_JOBS_BY_KEY = """
SELECT job.* FROM jobq_job AS job
JOIN unnest(%(kind)s::text[], %(idempotency_key)s::text[]) AS wanted(kind, idempotency_key)
  ON job.kind = wanted.kind AND job.idempotency_key = wanted.idempotency_key
WHERE job.idempotency_key IS NOT NULL
"""

#: Record a handler's dedup key (``jobq_dedup_key``) in the caller's transaction. Returns a
#: row only if the key is new. A concurrent transaction inserting the same key waits on the
#: unique index until this one ends, then conflicts (and returns nothing) if it committed.
INSERT_DEDUP_KEY = """
INSERT INTO jobq_dedup_key (kind, key, job_id)
VALUES (%(kind)s, %(key)s, %(job_id)s)
ON CONFLICT (kind, key) DO NOTHING
RETURNING id
"""
