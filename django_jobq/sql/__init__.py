"""Every raw SQL statement django-jobq runs, named and explained once.

Statements use psycopg's ``%(name)s`` placeholders (``%(name)b`` for a binary parameter) and
are always executed with parameters, never formatted with values. They work on a plain
psycopg 3 cursor and on a Django cursor.
Table names are those of ``models.py`` (``Meta.db_table``); a test checks they agree.

Fencing: a job's ``attempts`` is the number of its current attempt and serves as the lease's
fencing token. Every write a worker makes about a running job passes ``sql.leases.FENCED``
(``(id, attempts)`` and ``status = 'running'``), so a late write from a worker whose job was
reclaimed matches no row.
"""

from __future__ import annotations

# -- enqueue -------------------------------------------------------------------------------

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
#: queue that got a new job, the payload naming the queue (the uncorrelated subquery in the
#: WHERE runs once, before the first row). Notifications are delivered at commit, never for a
#: rollback, and PostgreSQL folds identical ones of one transaction into one, so enqueueing in
#: a loop inside ``atomic()`` still sends one per queue. ``{more_writes}`` takes further
#: data-modifying CTEs over ``saved`` (they must sit at the top level of the statement).
_INSERT_JOBS_TEMPLATE = """
WITH saved AS (
    INSERT INTO jobq_job (queue, kind, payload, priority, run_at, expires_at, max_attempts,
                          visibility_timeout, idempotency_key)
    SELECT queue, kind, payload, priority,
           COALESCE(run_at, statement_timestamp() + make_interval(secs => delay_seconds)),
           COALESCE(expires_at,
                    statement_timestamp() + make_interval(secs => expires_after_seconds)),
           max_attempts, visibility_timeout, idempotency_key
    FROM unnest(%(queue)b::text[], %(kind)b::text[], %(payload)b::jsonb[],
                %(priority)b::integer[], %(run_at)b::timestamptz[], %(delay_seconds)b::float8[],
                %(expires_at)b::timestamptz[], %(expires_after_seconds)b::float8[],
                %(max_attempts)b::integer[], %(visibility_timeout)b::interval[],
                %(idempotency_key)b::text[])
         AS input(queue, kind, payload, priority, run_at, delay_seconds, expires_at,
                  expires_after_seconds, max_attempts, visibility_timeout,
                  idempotency_key)
    {on_conflict}
    RETURNING *
), woken AS (
    SELECT pg_notify(%(channel)s, queue)
    FROM (SELECT DISTINCT queue FROM saved) AS queues
){more_writes}
SELECT id, run_at, created_at, expires_at{key_columns} FROM saved
WHERE (SELECT count(*) FROM woken) >= 0
"""
INSERT_JOBS = _INSERT_JOBS_TEMPLATE.format(
    on_conflict="""ON CONFLICT (kind, idempotency_key) WHERE idempotency_key IS NOT NULL
    DO NOTHING""",
    more_writes="",
    key_columns=", kind, idempotency_key",
)
#: ``INSERT_JOBS`` for jobs none of which has an idempotency key (same parameters; one row
#: per input row): without ``ON CONFLICT`` each row is a plain insert, not a speculative
#: one, which writes a tenth less WAL (an extra record per row confirms a speculative insert).
INSERT_UNKEYED_JOBS = _INSERT_JOBS_TEMPLATE.format(on_conflict="", more_writes="", key_columns="")

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

#: The channel ``INSERT_JOBS`` notifies: one channel (not one per queue), so a worker that
#: serves every queue can listen without knowing their names; the payload is the queue.
WAKE_CHANNEL = "jobq"
#: Subscribe the worker's listener connection to ``WAKE_CHANNEL`` (LISTEN takes no
#: parameters; the channel is the constant above).
LISTEN_WAKE = f'LISTEN "{WAKE_CHANNEL}"'
#: A round trip that does nothing: surfaces a connection the server has closed.
PING = "SELECT 1"


# The distinct (queue, kind) pairs of ready jobs, in (queue, kind) order, as a recursive CTE
# ``pairs`` (its statement starts ``WITH RECURSIVE``): a loose index scan of
# ``jobq_job_kind_claim_idx``, one seek per pair (the first job of the next kind of the
# queue, else of the next queue), however many jobs each pair holds. Each row is the pair's
# first ready job in the index's order, which is claim order (``priority``, ``run_at``,
# ``id``): when it is due, it is the pair's first due job. ``{queue_filter}`` narrows it to
# some queues.
_READY_PAIRS_TEMPLATE = """pairs AS (
    (SELECT queue, kind, priority, run_at, id FROM jobq_job
     WHERE status = 'ready'{queue_filter}
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
         WHERE job.status = 'ready' AND job.queue > pairs.queue{queue_filter}
         ORDER BY job.queue, job.kind, job.priority DESC, job.run_at, job.id
         LIMIT 1)
        LIMIT 1
    ) AS next
)"""

# The dead-letter copy of the job deleted by a ``moved`` CTE; returns its ``job_id``. The
# reason is ``{reason}``: the parameter, or a column of ``moved``.
_INSERT_DEAD_LETTER_TEMPLATE = """
INSERT INTO jobq_dead_letter (job_id, queue, kind, payload, priority, attempts, max_attempts,
                              visibility_timeout, idempotency_key, created_at, reason,
                              last_error, traceback, died_at)
SELECT id, queue, kind, payload, priority,
       CASE WHEN %(ran)s THEN attempts ELSE attempts - 1 END, max_attempts,
       visibility_timeout,
       idempotency_key, created_at, {reason}, %(error)s, %(traceback)s, now()
FROM moved
RETURNING job_id
""".strip()

# -- operators (admin, management commands) ------------------------------------------------

#: Cancel: delete ready jobs. A running job is never cancelled this way (its worker holds a
#: lease; deleting the row under it would only turn its ack into a refused write). The job
#: of a Django task (see ``INSERT_TASK_JOBS``) makes its result FAILED in the same statement,
#: with a ``django_jobq.task_results.TaskNotRun`` error saying it was cancelled.
CANCEL_JOBS = """
WITH cancelled AS (
    DELETE FROM jobq_job
    WHERE id = ANY(%(ids)s::bigint[]) AND status = 'ready'
    RETURNING id, kind, payload
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
SELECT id FROM cancelled
"""

#: Run now: make ready jobs due at once (scheduled or backing off), keeping their attempts.
RUN_JOBS_NOW = """
UPDATE jobq_job
SET run_at = now()
WHERE id = ANY(%(ids)s::bigint[]) AND status = 'ready' AND run_at > now()
RETURNING id
"""

#: Whether a dead letter (``dead``) can become a ready job as it is: what the jobs table's
#: constraints ask of a ready row that a dead letter can lack (its payload, its visibility
#: timeout; the redrive writes the times and attempts itself).
REDRIVABLE = """(jsonb_typeof(dead.payload) = 'object'
           AND dead.visibility_timeout BETWEEN interval '0.001 seconds' AND interval '3650 days'
           AND dead.max_attempts >= 0)"""

#: Redrive: turn dead letters back into fresh jobs (attempts 0, due now, no expiry) and delete
#: them, in one statement. A dead letter whose idempotency key belongs to a live job of its
#: kind is left in place (that job is already the redrive), as is all but the oldest of
#: several dead letters sharing a key. Should such a job appear concurrently, the insert
#: fails and the whole statement rolls back: nothing is lost, the operator retries.
#: A dead letter that cannot become a job as it is, because the jobs table's constraints
#: (``models.JOB_INSERT_CONSTRAINTS``) would refuse it (``REDRIVABLE``: the dead letter of a
#: poison row whose payload is not a JSON object or whose visibility timeout is out of
#: range), is left in place too, so that one such row never fails a whole batch.
#: The job of a Django task (its payload names a result of its kind, see ``INSERT_TASK_JOBS``)
#: makes that result READY again in the same statement, pointing at the new job.
_REDRIVE_DEAD_LETTERS_TEMPLATE = """
WITH redriven AS (
    DELETE FROM jobq_dead_letter AS dead
    WHERE dead.id = ANY(%(ids)s::bigint[])
      AND {redrivable}
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
                          idempotency_key)
    SELECT queue, kind, payload, priority, max_attempts, visibility_timeout, idempotency_key
    FROM redriven
    ORDER BY id
    RETURNING id, kind, payload
), ready_again AS (
    UPDATE jobq_task_result AS result
    SET status = 'READY', job_id = job.id, finished_at = NULL
    FROM job
    WHERE result.id = job.payload->>'result_id' AND result.task_path = job.kind
)
SELECT id FROM job
"""
REDRIVE_DEAD_LETTERS = _REDRIVE_DEAD_LETTERS_TEMPLATE.format(redrivable=REDRIVABLE)

# Retention: delete rows of ``{table}`` whose ``{column}`` is older than ``%(older_than)s``
# seconds, at most ``%(limit)s`` per statement so a large backlog never holds one long
# transaction (the maintenance round repeats it).
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

#: Rescue stranded leases: a running row whose lease deadline no worker could have written
#: (NULL, 'infinity', or further ahead than the longest lease, ``LEASE_LENGTH``'s 10 years,
#: with a day's margin: a row written by another producer) would never lapse, never be
#: reclaimed and keep ``jobq_worker --burst`` waiting forever. Its deadline becomes now: the
#: next claim reclaims it (and quarantines it if it is a poison row). Rows another
#: transaction has locked are skipped. Served by ``jobq_job_lease_idx``. Returns the ids.
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

#: Wait this long at most for a table lock in the worker's writes about one job (a
#: transaction's ``SET LOCAL``): a dead letter's insert waits for no ``CREATE INDEX`` or
#: ``LOCK TABLE`` on ``jobq_dead_letter``; the job's outcome is written again later.
SET_SHORT_LOCK_TIMEOUT = "SET LOCAL lock_timeout = '100ms'"

# -- dead letters by cause (admin, jobq_deadletters, jobq_redrive) --------------------------
#
# A dead letter's ``fingerprint`` (a stored generated column, ``django_jobq.fingerprints``)
# names its cause; the dead letters sharing one are a cause's group.

# Causes of dead letters (``{where}``: all, or one fingerprint), the most dead letters first,
# then the most recent, then by fingerprint; a page of ``%(limit)s`` after ``%(offset)s``.
# Per cause: its dead letters, the first and last ``died_at``, its newest dead letter (the
# highest id) as an example with that one's reason and first error line (at most 300
# characters), and its first ``%(kinds)s`` kinds in order (fewer: they are all). Every row
# also carries ``causes`` and ``dead_letters`` in all; with no cause on the page, one row
# whose cause columns are NULL.
# Costs: one pass over ``jobq_dead_fingerprint_idx`` in fingerprint order (an index-only
# scan once the table is vacuumed; else a scan of the table), counting every dead letter
# into its cause; then, for the page's causes only, a primary-key read of the example and a
# loose index scan of ``jobq_dead_fingerprint_kind_idx``, one seek per kind listed (a
# recursive CTE: however many dead letters the cause has). The causes are materialized
# once (``MATERIALIZED``) for both the totals and the page.
_DEAD_LETTER_CAUSES_TEMPLATE = """
WITH causes AS MATERIALIZED (
    SELECT fingerprint, count(*) AS dead_letters, min(died_at) AS first_died,
           max(died_at) AS last_died, max(id) AS example_id
    FROM jobq_dead_letter{where}
    GROUP BY fingerprint
), page AS MATERIALIZED (
    SELECT * FROM causes
    ORDER BY dead_letters DESC, last_died DESC, fingerprint
    LIMIT %(limit)s OFFSET %(offset)s
)
SELECT totals.causes, totals.dead_letters AS total, page.fingerprint, page.dead_letters,
       page.first_died, page.last_died, kinds.kinds, page.example_id,
       example.reason AS example_reason,
       left(split_part(ltrim(example.last_error, E' \t\r\n'), E'\n', 1), 300)
           AS example_error
FROM (SELECT count(*) AS causes, COALESCE(sum(dead_letters), 0)::bigint AS dead_letters
      FROM causes) AS totals
LEFT JOIN page ON true
LEFT JOIN jobq_dead_letter AS example ON example.id = page.example_id
LEFT JOIN LATERAL (
    WITH RECURSIVE kinds AS (
        (SELECT dead.kind FROM jobq_dead_letter AS dead
         WHERE dead.fingerprint = page.fingerprint
         ORDER BY dead.kind
         LIMIT 1)
        UNION ALL
        SELECT (SELECT dead.kind FROM jobq_dead_letter AS dead
                WHERE dead.fingerprint = page.fingerprint AND dead.kind > kinds.kind
                ORDER BY dead.kind
                LIMIT 1)
        FROM kinds
        WHERE kinds.kind IS NOT NULL
    )
    SELECT array_agg(kind ORDER BY kind) AS kinds
    FROM (SELECT kind FROM kinds WHERE kind IS NOT NULL LIMIT %(kinds)s) AS listed
) AS kinds ON true
ORDER BY page.dead_letters DESC, page.last_died DESC, page.fingerprint
"""

#: A page of the causes of all dead letters (see the template above).
DEAD_LETTER_CAUSES = _DEAD_LETTER_CAUSES_TEMPLATE.format(where="")
#: The one cause ``%(fingerprint)s`` (pass ``limit`` 1, ``offset`` 0): no cause columns if
#: no dead letter has that fingerprint.
DEAD_LETTER_CAUSE = _DEAD_LETTER_CAUSES_TEMPLATE.format(
    where="\n    WHERE fingerprint = %(fingerprint)s"
)

#: Delete the dead letters of one cause (``%(fingerprint)s``), in one statement (found with
#: ``jobq_dead_fingerprint_idx``); the cursor's row count says how many.
DELETE_DEAD_LETTERS_OF_CAUSE = "DELETE FROM jobq_dead_letter WHERE fingerprint = %(fingerprint)s"

# -- jobs no live worker can run (mixed fleets, removed kinds) -----------------------------
#
# A worker claims only the kinds it has (see the claim), so a job of a kind that no live
# worker serving its queue has would wait forever. Live: seen within ``%(stale_after)s``
# seconds (``django_jobq.stats.STALE_AFTER``); serving a queue: its ``queues`` is NULL (every
# queue) or names it; having a kind: its ``kinds`` list names it. A worker with no kinds at
# all (a misconfigured process that imported no ``jobs`` module) serves nothing: it would
# otherwise turn every queue's outage into dead letters. A queue no live worker serves at
# all is an outage, not an unknown kind: its jobs are never named here.
_LIVE_WORKERS = """live AS (
    SELECT queues, kinds FROM jobq_worker_process
    WHERE last_seen > now() - make_interval(secs => %(stale_after)s)
      AND jsonb_array_length(kinds) > 0
)"""
# Whether a live worker serves queue ``{queue}`` (``live`` rows as ``worker``).
_SERVES = "(worker.queues IS NULL OR worker.queues ? {queue})"

#: The (queue, kind) pairs of due ready jobs that wait for a worker that can run them: live
#: workers serve the queue, none of them has the kind. Per pair: ``jobs``, the seconds the
#: longest-waiting one has waited since it became due (``GREATEST(run_at, created_at)``, as
#: the claim's pickup latency; infinite times left out), and ``known``, the kinds the live
#: workers serving the queue have (a sorted jsonb list). Reads the registry (a few rows),
#: one index seek per (queue, kind) pair of ready jobs (``pairs``) and the waiting jobs
#: themselves (``jobq_job_kind_claim_idx``). Ordered by queue, kind. ``{counted}`` reads
#: each pair's due jobs: all of them (``_WAITING_JOBS``, the maintenance sweep's), or the
#: first ``%(cap)s`` + 1 in claim order (``_FIRST_WAITING_JOBS``, the admin dashboard's).
_WAITING_FOR_A_WORKER_TEMPLATE = """
WITH RECURSIVE {live}, {pairs}
SELECT pairs.queue, pairs.kind, counted.jobs,
       EXTRACT(EPOCH FROM now() - counted.since)::float8 AS oldest_age,
       (SELECT COALESCE(jsonb_agg(DISTINCT known.kind ORDER BY known.kind), '[]')
        FROM live AS worker, jsonb_array_elements_text(worker.kinds) AS known(kind)
        WHERE {serves}) AS known
FROM pairs
CROSS JOIN LATERAL (
    SELECT count(*) AS jobs,
           min(GREATEST(job.run_at, job.created_at))
               FILTER (WHERE isfinite(GREATEST(job.run_at, job.created_at))) AS since
    FROM {counted}
) AS counted
WHERE counted.jobs > 0
  AND EXISTS (SELECT 1 FROM live AS worker WHERE {serves})
  AND NOT EXISTS (SELECT 1 FROM live AS worker WHERE {serves} AND worker.kinds ? pairs.kind)
ORDER BY pairs.queue, pairs.kind
"""
_WAITING_JOBS = """jobq_job AS job
    WHERE job.status = 'ready' AND job.queue = pairs.queue AND job.kind = pairs.kind
      AND job.run_at <= now()"""
_FIRST_WAITING_JOBS = """(
        SELECT run_at, created_at FROM jobq_job
        WHERE status = 'ready' AND queue = pairs.queue AND kind = pairs.kind AND run_at <= now()
        ORDER BY priority DESC, run_at
        LIMIT %(cap)s + 1
    ) AS job"""
WAITING_FOR_A_WORKER = _WAITING_FOR_A_WORKER_TEMPLATE.format(
    live=_LIVE_WORKERS,
    pairs=_READY_PAIRS_TEMPLATE.format(queue_filter=""),
    serves=_SERVES.format(queue="pairs.queue"),
    counted=_WAITING_JOBS,
)
#: ``WAITING_FOR_A_WORKER`` reading at most ``%(cap)s`` + 1 due jobs per pair, in claim
#: order (``jobq_job_kind_claim_idx``): ``jobs`` above ``%(cap)s`` means "more than", and
#: ``oldest_age`` is the longest wait among those jobs (a pair's oldest job, unless older
#: ones wait at a lower priority). For the admin dashboard, which must stay fast when a
#: kind's backlog waits for a worker.
WAITING_FOR_A_WORKER_CAPPED = _WAITING_FOR_A_WORKER_TEMPLATE.format(
    live=_LIVE_WORKERS,
    pairs=_READY_PAIRS_TEMPLATE.format(queue_filter=""),
    serves=_SERVES.format(queue="pairs.queue"),
    counted=_FIRST_WAITING_JOBS,
)

#: Dead-letter the due ready jobs of the given (queue, kind) pairs (zipped arrays
#: ``%(queue)s``, ``%(kind)s``, with each pair's dead letters' ``%(reason)s``) that have waited
#: longer than ``%(grace)s`` seconds since they became due (``GREATEST(run_at,
#: created_at)``), in one statement: the copy and the delete together (the job is in exactly
#: one of the two tables); the caller fails a Django task's result in the same transaction
#: (``FAIL_UNRUN_TASK_RESULTS``) and announces it after the commit. Each pair is checked
#: again at the statement's snapshot (the caller read it with ``WAITING_FOR_A_WORKER`` a
#: moment before):
#: only while live workers serve the queue and none has the kind; a worker with the kind
#: that registered in between saves them. At most ``%(limit)s`` jobs per pair, locked FOR
#: UPDATE SKIP LOCKED (a row another transaction holds is left for the next round), found in
#: claim order through ``jobq_job_kind_claim_idx``. ``attempts`` records the attempts that
#: ran (pass ``%(ran)s`` true: a ready job's attempts all ran). Returns a ``(queue, kind,
#: reason, payload)`` row per job dead-lettered, its payload cut to its ``result_id``.
_DEAD_LETTER_UNKNOWN_KINDS_TEMPLATE = """
WITH {live}, doomed AS (
    SELECT input.queue, input.kind, input.reason
    FROM unnest(%(queue)s::text[], %(kind)s::text[], %(reason)s::text[])
         AS input(queue, kind, reason)
    WHERE EXISTS (SELECT 1 FROM live AS worker WHERE {serves})
      AND NOT EXISTS (SELECT 1 FROM live AS worker WHERE {serves} AND worker.kinds ? input.kind)
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
), dead AS ({insert_dead_letter}
)
SELECT moved.queue, moved.kind, moved.dead_reason,
       jsonb_build_object('result_id', moved.payload->'result_id') AS payload
FROM moved
ORDER BY moved.queue, moved.kind
"""
DEAD_LETTER_UNKNOWN_KINDS = _DEAD_LETTER_UNKNOWN_KINDS_TEMPLATE.format(
    live=_LIVE_WORKERS,
    serves=_SERVES.format(queue="input.queue"),
    insert_dead_letter=_INSERT_DEAD_LETTER_TEMPLATE.format(reason="dead_reason"),
)

#: Maintenance runs on one worker at a time: a transaction-scoped advisory lock, taken
#: without waiting (the other workers skip this round).
TRY_MAINTENANCE_LOCK = "SELECT pg_try_advisory_xact_lock(%(key)s)"

# -- idempotency ---------------------------------------------------------------------------

#: Record a dedup key in the caller's transaction. Returns a row only if the key is new. A
#: concurrent transaction inserting the same key waits on the unique index until this one
#: ends, then conflicts (and returns nothing) if it committed.
INSERT_DEDUP_KEY = """
INSERT INTO jobq_dedup_key (kind, key, job_id)
VALUES (%(kind)s, %(key)s, %(job_id)s)
ON CONFLICT (kind, key) DO NOTHING
RETURNING id
"""

# -- schedules -----------------------------------------------------------------------------

#: The rows of the named schedules (rows of schedules no longer declared are never read).
SELECT_SCHEDULES = """
SELECT name, kind, cron, timezone, defined_at, last_tick
FROM jobq_schedule
WHERE name = ANY(%(names)s::text[])
"""

#: Record the definitions of schedules a scheduler runs for the first time (in its process)
#: that their rows do not hold yet, creating absent rows, in one statement. The caller gives
#: each row's ``defined_at``: the scheduler's ``now`` for a new row or a new cron or timezone
#: (their meaning, compared in Python), else the row's own. Only a scheduler's first round
#: writes here, so two live definitions of one schedule do not rewrite the row by turns: it
#: shows the definition most recently started. ``last_tick`` is never written here. Rows
#: that already match are left alone (not even rewritten). The caller sorts the input by
#: name, so concurrent syncs lock rows in the same order and cannot deadlock.
SYNC_SCHEDULES = """
INSERT INTO jobq_schedule AS schedule (name, kind, cron, timezone, defined_at)
SELECT name, kind, cron, timezone, defined_at
FROM unnest(%(name)s::text[], %(kind)s::text[], %(cron)s::text[], %(timezone)s::text[],
            %(defined_at)s::timestamptz[])
     AS input(name, kind, cron, timezone, defined_at)
ON CONFLICT (name) DO UPDATE
SET kind = EXCLUDED.kind,
    cron = EXCLUDED.cron,
    timezone = EXCLUDED.timezone,
    defined_at = EXCLUDED.defined_at,
    updated_at = now()
WHERE (schedule.kind, schedule.cron, schedule.timezone, schedule.defined_at)
      IS DISTINCT FROM (EXCLUDED.kind, EXCLUDED.cron, EXCLUDED.timezone, EXCLUDED.defined_at)
"""

#: Compare-and-set: advance a schedule's ``last_tick`` to ``%(tick)s`` only if it still
#: holds the ``last_tick`` the scheduler read. Run in the transaction that inserts the
#: tick's job, before the insert. ``%(tick)s`` is always later than that ``last_tick``, so
#: ``last_tick`` only moves forward and each instant is enqueued at most once per schedule
#: name, whichever definition of it (in a rolling deploy, two) the scheduler runs. Of
#: concurrent schedulers the first locks the row; the others skip it (SKIP LOCKED: a
#: scheduler never waits, so a stalled one cannot hold up the claims of every worker) and
#: insert nothing. If the first rolls back, the tick is still due at the next round; once
#: it commits, the row no longer matches. Returns the row only when this scheduler won.
ADVANCE_SCHEDULE = """
UPDATE jobq_schedule
SET last_tick = %(tick)s, updated_at = now()
WHERE id = (
    SELECT id FROM jobq_schedule
    WHERE name = %(name)s
      AND last_tick IS NOT DISTINCT FROM %(last_tick)s::timestamptz
    FOR UPDATE SKIP LOCKED
)
RETURNING id
"""

# -- observability -------------------------------------------------------------------------

# The state of every queue holding live jobs, read in one snapshot:
#   - ``ready``: claimable now: ready and due, or running with a lapsed lease (its worker
#     died or stalled; the next claim takes it); ``scheduled``: ready, ``run_at`` in the
#     future; ``running``: leased, the lease not lapsed;
#   - ``oldest_ready_age``: seconds the longest-waiting claimable job has waited since it
#     became claimable: ``GREATEST(run_at, created_at)`` for a ready job, its
#     ``lease_deadline`` for a lapsed lease (as for the claim's pickup latency); NULL when
#     nothing is claimable. The lapsed leases' deadlines come from ``jobq_job_lease_idx``.
# The counts read every live row (a parallel sequential scan: about 0.3 s per million live
# jobs on a small server; see bench/README.md). The oldest age costs a few index seeks
# whatever the depth: a loose index scan of ``jobq_job_claim_idx`` (queue, priority DESC,
# run_at) walks the distinct (queue, priority) pairs of ready jobs, and for each takes the
# first due job by ``run_at``. A job's wait starts at or after its ``run_at``, so only jobs
# with an earlier ``run_at`` than that first job's wait start can have waited longer: the
# ``earlier`` arm looks at those alone, which is none unless jobs were enqueued with a
# ``run_at`` in the past. An infinite wait start (a row not written by enqueue, e.g.
# ``lease_deadline = '-infinity'``) is left out of the age: ``now() - 'infinity'`` is an
# error; the claim dead-letters such a row soon anyway. ``{depths}`` counts the jobs: every
# row (``_EXACT_DEPTHS``), or at most a bound (``_CAPPED_DEPTHS``, the admin dashboard's).
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
), depths AS ({depths})
SELECT depths.queue, depths.ready, depths.scheduled, depths.running,
       EXTRACT(EPOCH FROM now() - LEAST(oldest.since, lapsed.since))::float8
           AS oldest_ready_age
FROM depths
LEFT JOIN oldest ON oldest.queue = depths.queue
LEFT JOIN lapsed ON lapsed.queue = depths.queue
"""
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
# The ready jobs of queue ``queues.queue`` that are due (``{due}`` ``<=``) or scheduled
# (``>``), counted up to ``%(cap)s + 1``: per (queue, priority) pair of ``pairs``, the range
# of ``jobq_job_claim_idx`` on one side of ``now()``, the pairs walked until the count is
# reached (the outer LIMIT stops the loop). The ORDER BY makes it an index scan, which stops
# at the LIMIT (a bitmap scan would read the whole range first).
_CAPPED_READY_COUNT = """(SELECT count(*) FROM (
            SELECT 1 FROM pairs CROSS JOIN LATERAL (
                SELECT 1 FROM jobq_job AS job
                WHERE job.status = 'ready' AND job.queue = pairs.queue
                  AND job.priority = pairs.priority AND job.run_at {due} now()
                ORDER BY job.run_at
                LIMIT %(cap)s + 1
            ) AS counted_job
            WHERE pairs.queue = queues.queue
            LIMIT %(cap)s + 1) AS counted)"""
# The depths as ``_EXACT_DEPTHS`` has them, reading at most about ``%(cap)s`` index entries
# per queue and state, however deep the queue: ``ready`` and ``scheduled`` above ``%(cap)s``
# mean "more than ``%(cap)s``". Running jobs (and the lapsed leases among them, counted as
# ready) are counted exactly through ``jobq_job_lease_idx``: they are as many as the workers
# hold, not as many as wait.
_CAPPED_DEPTHS_TEMPLATE = """
    SELECT parts.queue, sum(parts.ready)::bigint AS ready,
           sum(parts.scheduled)::bigint AS scheduled, sum(parts.running)::bigint AS running
    FROM (
        SELECT queue, count(*) FILTER (WHERE lease_deadline < now()) AS ready, 0 AS scheduled,
               count(*) FILTER (WHERE (lease_deadline < now()) IS NOT TRUE) AS running
        FROM jobq_job
        WHERE status = 'running'
        GROUP BY queue
        UNION ALL
        SELECT queues.queue, {due}, {scheduled}, 0
        FROM (SELECT DISTINCT queue FROM pairs) AS queues
    ) AS parts
    GROUP BY parts.queue
"""
_CAPPED_DEPTHS = _CAPPED_DEPTHS_TEMPLATE.format(
    due=_CAPPED_READY_COUNT.format(due="<="), scheduled=_CAPPED_READY_COUNT.format(due=">")
)
_QUEUE_STATES = _QUEUE_STATES_TEMPLATE.format(depths=_EXACT_DEPTHS)

#: Every queue's depth by state and its oldest ready age (see above), ordered by queue.
QUEUE_STATES = _QUEUE_STATES + "ORDER BY depths.queue\n"

#: ``QUEUE_STATES`` with its counts stopping above ``%(cap)s`` (``_CAPPED_DEPTHS``): a few
#: index seeks per queue, plus up to ``%(cap)s`` + 1 index entries per queue and state, and the
#: running jobs. For the admin dashboard, which must stay fast on a backlog of millions.
QUEUE_STATES_CAPPED = (
    _QUEUE_STATES_TEMPLATE.format(depths=_CAPPED_DEPTHS) + "ORDER BY depths.queue\n"
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

#: Sample every queue's state into ``jobq_queue_sample`` for the current minute (UTC), for
#: the dashboard's charts. Two workers racing past QUEUES_SAMPLED_THIS_MINUTE cannot write
#: a minute twice (unique (queue, minute)); the second one's rows are dropped. Returns the
#: rows written.
_SAMPLE_QUEUES_TEMPLATE = """
INSERT INTO jobq_queue_sample (queue, minute, ready, scheduled, running, oldest_ready_age)
SELECT state.queue, date_trunc('minute', now(), 'UTC'), state.ready, state.scheduled,
       state.running, COALESCE(state.oldest_ready_age, 0)
FROM ({queue_states}) AS state
ON CONFLICT (queue, minute) DO NOTHING
RETURNING queue
"""
SAMPLE_QUEUES = _SAMPLE_QUEUES_TEMPLATE.format(queue_states=_QUEUE_STATES)

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

#: Register a starting worker, with the kinds it claims (a jsonb list) and their
#: fingerprint; returns its row id (the key of its beats and deregistration).
REGISTER_WORKER = """
INSERT INTO jobq_worker_process (worker_id, host, pid, queues, concurrency, kinds,
                                 kinds_fingerprint)
VALUES (%(worker_id)s, %(host)s, %(pid)s, %(queues)s::jsonb, %(concurrency)s, %(kinds)s::jsonb,
        %(kinds_fingerprint)s)
RETURNING id
"""

#: A worker's sign of life: refresh ``last_seen``. Returns nothing if the row is gone (the
#: maintenance sweep pruned it while the worker was stalled): the worker registers again.
BEAT_WORKER = """
UPDATE jobq_worker_process SET last_seen = now() WHERE id = %(id)s RETURNING id
"""

#: A stopping worker removes its row.
DEREGISTER_WORKER = "DELETE FROM jobq_worker_process WHERE id = %(id)s"

# -- MVCC health (django_jobq.mvcc: jobq_doctor, checks, metrics, dashboard) ----------------
#
# Vacuum removes a dead row version only once no transaction can still see it: once it
# died before the xmin horizon, the oldest xmin or xid that anything in the cluster still
# holds. These statements read who holds it back and what it costs the jobq tables. They
# read catalogs and statistics views only (shared memory and pg_class, never a table's
# rows), so each is cheap, and bounded: by max_connections, the replication slots, the
# prepared transactions and the jobq tables' indexes.

#: The server's side: whether autovacuum runs (``autovacuum``, and ``track_counts``, without
#: which autovacuum cannot tell which tables need it and the dead-row counts stay 0);
#: whether this role sees every session's details (superuser or ``pg_read_all_stats``;
#: without, other roles' sessions show their pid, user, application and xmin, but not their
#: start, state, client or query); the role; the statement's time.
MVCC_SERVER = """
SELECT current_setting('autovacuum')::boolean AS autovacuum,
       current_setting('track_counts')::boolean AS track_counts,
       pg_has_role('pg_read_all_stats', 'USAGE') AS sees_all_sessions,
       current_user::text AS role_name,
       statement_timestamp() AS taken_at
"""

#: Everything that holds the xmin horizon back, one row per holder, the oldest xmin first:
#:   - ``backend``: a session with an xmin (a snapshot: a REPEATABLE READ transaction, a
#:     long statement, an open cursor, ``pg_dump``) or an xid (a transaction that wrote).
#:     Sessions of this database, and those of other databases that hold an xid (every
#:     snapshot taken anywhere while it runs keeps it, so it holds ours back too; another
#:     database's snapshot alone does not), and processes of no database (a walsender
#:     seen by a role that cannot tell it is one). Left out: this session and its parallel
#:     workers, walsenders (the ``standby`` arm shows their feedback), and autovacuum
#:     workers running a VACUUM (PostgreSQL ignores a lazy vacuum's xmin).
#:     ``transaction_age`` is seconds since the transaction began; ``hidden`` says this role
#:     may not see the session's details (they are NULL; PostgreSQL shows everyone the xmin).
#:   - ``prepared_transaction``: a two-phase transaction waiting for COMMIT PREPARED or
#:     ROLLBACK PREPARED (any database: its xid holds every snapshot back), aged from its
#:     PREPARE; ``name`` is its gid.
#:   - ``replication_slot``: a slot's ``xmin`` (a standby's hot_standby_feedback through a
#:     physical slot: holds back every table of every database) and ``catalog_xmin`` (a
#:     logical slot: holds back the system catalogs only); kept while the slot exists,
#:     consumer connected (``active``, ``pid`` its walsender) or not. No age in seconds.
#:   - ``standby``: a standby connected without a slot whose hot_standby_feedback reports
#:     the xmin of its oldest query (``pid`` is the walsender; no age in seconds).
#: ``xmin_age`` and ``catalog_xmin_age`` are ``age()``: transactions begun since.
MVCC_HORIZON_HOLDERS = """
WITH role AS (SELECT pg_has_role('pg_read_all_stats', 'USAGE') AS sees_all_sessions)
SELECT 'backend' AS holder, activity.pid, NULL::text AS name, activity.application_name,
       host(activity.client_addr) AS client_addr, activity.usename::text AS user_name,
       activity.datname::text AS database, activity.state,
       activity.wait_event_type || ': ' || activity.wait_event AS wait_event,
       activity.query,
       EXTRACT(EPOCH FROM statement_timestamp() - activity.xact_start)::float8
           AS transaction_age,
       GREATEST(age(activity.backend_xmin), age(activity.backend_xid)) AS xmin_age,
       NULL::integer AS catalog_xmin_age,
       NOT (role.sees_all_sessions OR COALESCE(pg_has_role(activity.usesysid, 'USAGE'), false))
           AS hidden
FROM pg_stat_activity AS activity, role
WHERE (activity.backend_xmin IS NOT NULL OR activity.backend_xid IS NOT NULL)
  AND (activity.datname = current_database() OR activity.backend_xid IS NOT NULL
       OR activity.datid IS NULL)
  AND activity.pid <> pg_backend_pid()
  AND activity.leader_pid IS DISTINCT FROM pg_backend_pid()
  AND activity.backend_type IS DISTINCT FROM 'walsender'
  AND NOT (activity.backend_type = 'autovacuum worker'
           AND starts_with(activity.query, 'autovacuum: VACUUM'))
UNION ALL
SELECT 'prepared_transaction', NULL, prepared.gid, NULL, NULL, prepared.owner::text,
       prepared.database::text, NULL, NULL, NULL,
       EXTRACT(EPOCH FROM statement_timestamp() - prepared.prepared)::float8,
       age(prepared.transaction), NULL, false
FROM pg_prepared_xacts AS prepared
UNION ALL
SELECT 'replication_slot', slot.active_pid, slot.slot_name::text, NULL, NULL, NULL,
       slot.database::text, CASE WHEN slot.active THEN 'active' ELSE 'inactive' END, NULL,
       NULL, NULL, age(slot.xmin), age(slot.catalog_xmin), false
FROM pg_replication_slots AS slot
WHERE slot.xmin IS NOT NULL OR slot.catalog_xmin IS NOT NULL
UNION ALL
SELECT 'standby', standby.pid, NULL, standby.application_name, host(standby.client_addr),
       standby.usename::text, NULL, standby.state, NULL, NULL, NULL,
       age(standby.backend_xmin), NULL, false
FROM pg_stat_replication AS standby
WHERE standby.backend_xmin IS NOT NULL
ORDER BY xmin_age DESC NULLS LAST, catalog_xmin_age DESC NULLS LAST,
         transaction_age DESC NULLS LAST
"""

# The jobq tables, given by name (``%(tables)s``, as ``to_regclass`` resolves them on the
# search path; a name that resolves to nothing is left out) with their partitions, should
# one be partitioned: the tables that hold rows (a partitioned parent holds none).
_JOBQ_TABLES = """tables AS (
    SELECT DISTINCT table_class.oid
    FROM unnest(%(tables)s::text[]) AS named(name)
    CROSS JOIN LATERAL (SELECT to_regclass(named.name) AS relation) AS resolved
    CROSS JOIN LATERAL (
        SELECT resolved.relation AS relation
        UNION ALL
        SELECT tree.relid FROM pg_partition_tree(resolved.relation) AS tree
    ) AS member
    JOIN pg_class AS table_class ON table_class.oid = member.relation
    WHERE table_class.relkind = 'r'
)"""

#: The jobq tables (see above) with their statistics: live and dead row versions (the
#: statistics' estimates, kept by every write and by vacuum and analyze; 0 with
#: track_counts off), the last vacuum, autovacuum, analyze and autoanalyze (NULL: never,
#: since the statistics were reset), the table's own ``autovacuum_enabled`` reloption
#: (NULL: not set, the server's setting applies) and its size in bytes (TOAST included).
_MVCC_TABLES_TEMPLATE = """
WITH {tables}
SELECT tables.oid::regclass::text AS table_name,
       COALESCE(stat.n_live_tup, 0) AS live_rows, COALESCE(stat.n_dead_tup, 0) AS dead_rows,
       stat.last_vacuum, stat.last_autovacuum, stat.last_analyze, stat.last_autoanalyze,
       (SELECT reloption.option_value::boolean
        FROM pg_class AS table_class, pg_options_to_table(table_class.reloptions) AS reloption
        WHERE table_class.oid = tables.oid AND reloption.option_name = 'autovacuum_enabled')
           AS autovacuum_enabled,
       pg_table_size(tables.oid) AS table_bytes
FROM tables
LEFT JOIN pg_stat_all_tables AS stat ON stat.relid = tables.oid
ORDER BY table_name
"""
MVCC_TABLES = _MVCC_TABLES_TEMPLATE.format(tables=_JOBQ_TABLES)

#: Every index of the jobq tables, with its size in bytes and its table's live rows (as in
#: ``MVCC_TABLES``): an index much larger than its live rows need holds dead entries or
#: empty pages. ``pg_relation_size`` reads the file's length; no lock, no scan.
_MVCC_INDEXES_TEMPLATE = """
WITH {tables}
SELECT table_index.indexrelid::regclass::text AS index_name,
       table_index.indrelid::regclass::text AS table_name,
       pg_relation_size(table_index.indexrelid) AS index_bytes,
       COALESCE(stat.n_live_tup, 0) AS live_rows
FROM tables
JOIN pg_index AS table_index ON table_index.indrelid = tables.oid
LEFT JOIN pg_stat_all_tables AS stat ON stat.relid = tables.oid
ORDER BY table_name, index_name
"""
MVCC_INDEXES = _MVCC_INDEXES_TEMPLATE.format(tables=_JOBQ_TABLES)

# -- chaos suite (django_jobq.chaos, manage.py jobq_chaos; never run by workers) ------------

#: The chaos suite's business table: one row per business effect of its transactional
#: handler. The run creates it and drops it again, so it needs no migration and is never
#: part of a project's schema. No unique constraint on ``job_id``, on purpose: a duplicate
#: effect must show up as a second row, not be prevented by the table.
CREATE_CHAOS_BUSINESS_TABLE = """
CREATE TABLE jobq_chaos_business_row (
    id bigserial PRIMARY KEY,
    job_id bigint NOT NULL,
    attempt integer NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
)
"""

#: Drop the chaos business table (a previous run's, or this run's at the end).
DROP_CHAOS_BUSINESS_TABLE = "DROP TABLE IF EXISTS jobq_chaos_business_row"

#: The transactional chaos handler's business write, in its job's transaction.
INSERT_CHAOS_BUSINESS_ROW = """
INSERT INTO jobq_chaos_business_row (job_id, attempt) VALUES (%(job_id)s, %(attempt)s)
"""

#: Business rows per job: ``(job_id, rows)``.
COUNT_CHAOS_BUSINESS_ROWS = """
SELECT job_id, count(*) FROM jobq_chaos_business_row GROUP BY job_id
"""

#: The application names of the connections to this database whose name matches
#: ``%(pattern)s`` (a LIKE pattern). Workers name theirs ``jobq worker <id>``, ``jobq heartbeat
#: <id>``: the chaos run finds other workers (and refuses to start beside them) and its own.
SELECT_CONNECTIONS_NAMED = """
SELECT pid, application_name FROM pg_stat_activity
WHERE datname = current_database() AND application_name LIKE %(pattern)s
  AND pid <> pg_backend_pid()
ORDER BY application_name, pid
"""

#: Terminate one backend, only if it is still the connection the caller chose (same pid,
#: same application name, this database): a pid reused in between is left alone.
TERMINATE_CONNECTION = """
SELECT pg_terminate_backend(pid) FROM pg_stat_activity
WHERE pid = %(pid)s AND application_name = %(application_name)s
  AND datname = current_database()
"""

from . import claims  # noqa: E402, F401, I001
from . import clock  # noqa: E402, F401
from . import leases  # noqa: E402, F401
from . import outcomes  # noqa: E402, F401
from . import tasks  # noqa: E402, F401
