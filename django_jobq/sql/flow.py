"""Flow control as workers see it: the state of pauses and limits, and the limited claim's
locks, counts and the rate limits' starts (``jobq_limit_start``) (docs/flow-control.md;
:mod:`django_jobq.flow_state`, :mod:`django_jobq.limited_claims`).

Operators write ``jobq_queue`` (pauses, queue limits) and ``jobq_kind_limit`` (kind limits).
A worker reads them (``FLOW_STATE``) and claims by what it read; every claim compares
``FLOW_DIGEST`` of the rows, computed in the claim statement itself, with the digest it read
(``sql.claims``): a claim whose worker missed a change commits nothing, so a pause or a new
limit binds every claim that starts after it commits.
"""

from __future__ import annotations

#: A digest of every pause and limit: md5 of each row's settings as text (``quote_nullable``
#: quotes each value, NULL as NULL; times as epoch seconds, whatever the session's time
#: zone), the rows sorted. Not the starts (``jobq_limit_start``): starts change no
#: setting. Reads both tables whole (a row per paused or limited queue and kind: a few).
FLOW_DIGEST = """(SELECT md5(COALESCE(string_agg(line, ',' ORDER BY line), ''))
     FROM (SELECT concat_ws(' ', 'queue', quote_nullable(name),
                            quote_nullable(EXTRACT(EPOCH FROM paused_at)),
                            quote_nullable(EXTRACT(EPOCH FROM paused_until)),
                            quote_nullable(concurrency_limit), quote_nullable(rate_limit))
               AS line
           FROM jobq_queue
           UNION ALL
           SELECT concat_ws(' ', 'kind', quote_nullable(kind),
                            quote_nullable(concurrency_limit), quote_nullable(rate_limit))
           FROM jobq_kind_limit) AS settings)"""

#: Whether the ``jobq_queue`` row aliased ``queue`` is paused now: paused, and not until a
#: time that has passed (the database clock). NULL for a queue without a row. One
#: definition for the claims' view (``FLOW_STATE``) and the operators' (``sql.flow_control``).
PAUSED = """(queue.paused_at IS NOT NULL
        AND (queue.paused_until IS NULL OR queue.paused_until > now()))"""

_FLOW_STATE_TEMPLATE = """
SELECT {digest} AS digest,
       (SELECT COALESCE(jsonb_agg(jsonb_build_array(
                   queue.name,
                   {paused},
                   CASE WHEN isfinite(queue.paused_until)
                       THEN EXTRACT(EPOCH FROM queue.paused_until - now())::float8 END,
                   queue.concurrency_limit,
                   queue.rate_limit)), '[]'::jsonb)
        FROM jobq_queue AS queue) AS queues,
       (SELECT COALESCE(jsonb_agg(jsonb_build_array(kind, concurrency_limit, rate_limit)),
                        '[]'::jsonb)
        FROM jobq_kind_limit) AS kinds
"""
#: What a worker reads of flow control, in one row: ``digest`` (``FLOW_DIGEST``), ``queues``
#: (a JSON array of ``[name, paused now, seconds until paused_until (NULL: none), concurrency
#: limit, rate limit]``, limits NULL where the row sets none) and ``kinds`` (``[kind,
#: concurrency limit, rate limit]``). Pausing depends on the database clock: a queue paused
#: until a time is paused only before it. Whatever a row holds (one written by hand past the
#: CHECK constraints), the statement succeeds: a ``paused_until`` of 'infinity' is a pause
#: without an end (no seconds), one of '-infinity' has ended; the limits are the caller's to
#: check.
FLOW_STATE = _FLOW_STATE_TEMPLATE.format(digest=FLOW_DIGEST, paused=PAUSED)

#: The digest alone (``FLOW_DIGEST``): whether what a worker read is still true, for a worker
#: that ran no claim (every queue it serves is paused or limited).
SELECT_FLOW_DIGEST = f"SELECT {FLOW_DIGEST} AS digest"

#: Make sure each limited queue and kind (zipped ``%(scopes)s`` 'queue' / 'kind' and
#: ``%(names)s``) has the row its limited claims lock. Writes nothing for the rows that
#: exist.
ENSURE_LIMIT_STATES = """
INSERT INTO jobq_limit_state (scope, name)
SELECT key.scope, key.name
FROM unnest(%(scopes)s::text[], %(names)s::text[]) AS key(scope, name)
ON CONFLICT (scope, name) DO NOTHING
"""

_LOCK_LIMIT_STATES_TEMPLATE = """
SELECT scope, name
FROM jobq_limit_state
WHERE ((scope = 'queue' AND name = ANY(%(queues)s::text[]))
       OR (scope = 'kind' AND name = ANY(%(kinds)s::text[]))){only_if}
ORDER BY scope, name
FOR UPDATE{skip_locked}
"""

#: The first statement of a limited claim's transaction: lock the rows of the limited
#: queues (``%(queues)s``) and kinds (``%(kinds)s``) this claim may take jobs of, skipping
#: those another worker's limited claim holds (``WAIT_FOR_LIMIT_STATES`` then waits for
#: them briefly). Until the transaction ends, no other claim counts or takes jobs under
#: these limits, so the counts ``COUNT_LIMITED`` reads stay true. Returns the locked keys.
LOCK_LIMIT_STATES = _LOCK_LIMIT_STATES_TEMPLATE.format(only_if="", skip_locked=" SKIP LOCKED")

#: In a savepoint after ``LOCK_LIMIT_STATES``, for the rows it skipped (or after a claim
#: made before its count, for all): wait at most 100 ms for a lock on each. Another
#: worker's limited claim holds one for a few statements (about a millisecond, more when
#: many claims queue for it on a machine with more busy processes than cores); one held
#: longer (a slow network, a stalled process) makes the wait give up, and the claim goes on
#: with the rows it has: one stuck row never stops the others. (20 ms gave up on rows that
#: were only busy: with eight worker processes on two cores, a worker that gave up counted
#: first for a second, and its claims for the prefetch, which do not wait, found the row
#: held again and again; docs/flow-control.md, "Cost when nothing binds".)
SET_LIMIT_LOCK_TIMEOUT = "SET LOCAL lock_timeout = '100ms'"

# Generic plans for the counts (``COUNT_LIMITED``, ``ADMIT_CLAIMED``): each prepared statement
# run after these settings in the transaction runs its generic plan, without JIT compilation.
# PostgreSQL would otherwise plan a count anew at every run: its generic plan's estimate
# counts the keys of an array parameter as ten, so it looks dearer than the custom plans it
# is compared with. Planning the admission took 0.7 ms of server time per limited claim,
# running it 0.2 ms (``pg_stat_statements`` with ``track_planning``, a burn-down of 4
# processes with a concurrency limit far from binding; docs/flow-control.md, "Cost when
# nothing binds"). Their plans depend on no parameter's value: per key, the running jobs are
# read through ``jobq_job_lease_idx`` and the starts through ``jobq_limit_start_idx``,
# whatever the keys. The claim statements must not run so (a generic plan of a claim from one
# queue does not know that queue's share of the table, and can read its jobs through
# ``jobq_job_claim_all_idx``): the settings come after them, or the plan mode is set back
# before them (``PLAN_AS_CONFIGURED``). No JIT: the generic plan's cost counts ten keys, which on a
# large table passes ``jit_above_cost`` (a review measured 102,000 to 141,000 with 54,000
# jobs running: compiled, the admission took 125 ms against 86 ms), and compiling costs
# more than counting.
_GENERIC_PLANS = """set_config('plan_cache_mode', 'force_generic_plan', true),
       set_config('jit', 'off', true)"""

#: Sent instead of ``SET_LIMIT_LOCK_TIMEOUT`` by a claim made before its count, after its
#: claim statements, ahead of ``WAIT_FOR_LIMIT_STATES_IF_CLAIMED`` and ``ADMIT_CLAIMED``: the
#: same lock timeout and, for the rest of the transaction (which ends with the admission),
#: generic plans (``_GENERIC_PLANS``).
SET_ADMISSION_SETTINGS = f"""
SELECT set_config('lock_timeout', '100ms', true),
       {_GENERIC_PLANS}
"""

#: Sent before ``COUNT_LIMITED`` (which the claim statements follow): generic plans
#: (``_GENERIC_PLANS``) until ``PLAN_AS_CONFIGURED``.
PLAN_GENERICALLY = f"SELECT {_GENERIC_PLANS}"

#: Sent after ``COUNT_LIMITED``: plans chosen as the session chose them before
#: ``PLAN_GENERICALLY`` (``DEFAULT``: the value the server, database, role or connection
#: gave the session), for the claim statements that follow in the transaction. JIT stays off
#: until the transaction ends: a claim reads a few index entries per job it takes, and never
#: gains from compiling. (Reading each setting's ``reset_val`` from ``pg_settings`` instead
#: cost 0.4 ms: the view lists every setting.)
PLAN_AS_CONFIGURED = "SET LOCAL plan_cache_mode TO DEFAULT"

#: After ``SET_LIMIT_LOCK_TIMEOUT``: ``LOCK_LIMIT_STATES`` waiting for the rows, in one
#: order (scope, then name), so two claims waiting for each other's rows cannot deadlock
#: (the lock timeout ends such a wait long before PostgreSQL's deadlock check would). A key
#: whose row it does not return has none (deleted by hand).
WAIT_FOR_LIMIT_STATES = _LOCK_LIMIT_STATES_TEMPLATE.format(only_if="", skip_locked="")

#: ``WAIT_FOR_LIMIT_STATES`` for a claim made before its count, after its claim statements:
#: only if they claimed a job. A transaction gets an id when it first writes, and a claim
#: statement that took no job wrote nothing, so ``pg_current_xact_id_if_assigned()`` is
#: NULL (PostgreSQL 13+) and the rows are neither locked nor waited for: a lock is a
#: write, whose commit waits for a flush of the WAL and holds up every other claim under
#: these limits meanwhile, for a claim that has nothing to admit (the admission,
#: ``ADMIT_CLAIMED``, then only counts; it refuses nothing and writes nothing).
WAIT_FOR_LIMIT_STATES_IF_CLAIMED = _LOCK_LIMIT_STATES_TEMPLATE.format(
    only_if="\n  AND pg_current_xact_id_if_assigned() IS NOT NULL", skip_locked=""
)

#: Whether the row of starts ``start`` (``jobq_limit_start``) is in the window of ``key``
#: (``key.window_seconds``; NULL: no rate limit, never), on the clock starts are stamped
#: with: after the window opened, and at most a window ahead of the clock (a claim that may
#: prefetch its jobs stamps them a fraction of a window ahead, and a start that a step back
#: of the server's clock leaves ahead still counts). A row further ahead, which no worker
#: stamped ('infinity', a row written by hand), is none: ``RECORD_STARTS`` deletes it.
_IN_WINDOW = """(start.started_at > clock_timestamp() - make_interval(secs => key.window_seconds)
              AND start.started_at
                  <= clock_timestamp() + make_interval(secs => key.window_seconds))"""

#: The jobs ``job`` of ``key`` (a limited queue or kind) holding a live lease: running, the
#: deadline not passed. A lapsed lease holds no slot: its job is claimable, and the claim
#: that reclaims it counts again. Read from the running jobs (``jobq_job_lease_idx``).
_LIVE_UNDER_KEY = """job.status = 'running' AND job.lease_deadline >= now()
              AND CASE key.scope WHEN 'queue' THEN job.queue = key.name
                                 ELSE job.kind = key.name END"""

#: Per ``key`` (``scope``, ``name``, a rate limit's ``window_seconds`` and ``count``), what
#: both counts read besides the live jobs, in two parts:
#:   - ``_RECENT_STARTS``, joined to the keys: ``started.recent``, the key's starts within
#:     the window (``_IN_WINDOW``; ``jobq_limit_start_idx``): the sum of the rows'
#:     ``starts``, a row per claim (or late start), however many jobs;
#:   - ``_FREES_IN``, the column ``frees_in``: once ``recent`` has reached the count, the
#:     seconds until one more may start: until the newest row whose starts, added to those
#:     of the rows newer than it, reach the count leaves the window. NULL below the count
#:     (no row's running sum reaches it then), so it is read only at the count: below it,
#:     its second pass over the window's rows, with a sort, doubled the count's time.
_RECENT_STARTS_TEMPLATE = """CROSS JOIN LATERAL (
        SELECT COALESCE(sum(start.starts), 0) AS recent FROM jobq_limit_start AS start
        WHERE start.scope = key.scope AND start.name = key.name
          AND {in_window}
    ) AS started"""
_RECENT_STARTS = _RECENT_STARTS_TEMPLATE.format(in_window=_IN_WINDOW)
_FREES_IN_TEMPLATE = """CASE WHEN started.recent >= key.count THEN (
               SELECT EXTRACT(EPOCH FROM newest.started_at
                                         + make_interval(secs => key.window_seconds)
                                         - clock_timestamp())::float8
               FROM (SELECT start.id, start.started_at,
                            sum(start.starts) OVER (ORDER BY start.started_at DESC,
                                                             start.id DESC
                                                    ROWS UNBOUNDED PRECEDING) AS up_to_here
                     FROM jobq_limit_start AS start
                     WHERE start.scope = key.scope AND start.name = key.name
                       AND {in_window}) AS newest
               WHERE newest.up_to_here >= key.count
               ORDER BY newest.started_at DESC, newest.id DESC
               LIMIT 1)
           END AS frees_in"""
_FREES_IN = _FREES_IN_TEMPLATE.format(in_window=_IN_WINDOW)

#: Delete the rows of starts of each ``key`` (a rate limit's ``scope``, ``name`` and
#: ``window_seconds``, from ``{keys}``) not in its window (``_IN_WINDOW``): the log holds
#: about a window of rows. A row another transaction has locked (a late start moving out
#: of it, a lock taken by hand) is left for a later claim to delete, not waited for: out
#: of its window it counts nothing, and a wait would hold up, with this claim, every claim
#: under its limit.
_PRUNE_STARTS_TEMPLATE = """DELETE FROM jobq_limit_start
    WHERE id IN (
        SELECT start.id
        FROM jobq_limit_start AS start
        JOIN {keys}
            ON start.scope = key.scope AND start.name = key.name
        WHERE NOT {in_window}
        FOR UPDATE OF start SKIP LOCKED
    )"""

#: The next statement of a claim that locks first, after the locks (``LOCK_LIMIT_STATES``):
#: per locked key (zipped ``%(scopes)s``, ``%(names)s``, for a rate limit ``%(windows)s``
#: seconds and ``%(counts)s`` starts, NULL for none), fleet-wide, ``live``
#: (``_LIVE_UNDER_KEY``), ``recent`` and ``frees_in`` (``_RECENT_STARTS``, ``_FREES_IN``). A
#: new statement, so under READ COMMITTED it sees every claim and start committed before
#: the lock was taken. Clock: ``clock_timestamp()``, as the starts are stamped.
_COUNT_LIMITED_TEMPLATE = """
SELECT key.scope, key.name,
       (SELECT count(*) FROM jobq_job AS job WHERE {live_under_key}) AS live,
       started.recent,
       {frees_in}
FROM unnest(%(scopes)s::text[], %(names)s::text[], %(windows)s::float8[],
            %(counts)s::integer[]) AS key(scope, name, window_seconds, count)
{recent_starts}
"""
COUNT_LIMITED = _COUNT_LIMITED_TEMPLATE.format(
    live_under_key=_LIVE_UNDER_KEY, recent_starts=_RECENT_STARTS, frees_in=_FREES_IN
)

#: The last statement of a claim that locks first, before the commit: log the starts of
#: this claim, one row per rate-limited key (zipped ``%(scopes)s``, ``%(names)s``,
#: ``%(starts)s`` jobs claimed under it, ``%(aheads)s`` seconds and ``%(windows)s``
#: seconds), stamped ``clock_timestamp()`` (after the claim's leases: never earlier than the
#: claim) plus its ahead: the window's margin for jobs claimed for idle handler threads,
#: which start at once; a fraction of the window for a claim that may hold them in the
#: prefetch, so that the row counts every start within that long of the claim
#: (``django_jobq.limited_claims``). Prunes each key's rows out of the window
#: (``_PRUNE_STARTS_TEMPLATE``). Returns each new row's ``id``, ``scope`` and ``name``, for
#: ``CONFIRM_START``.
_RECORD_STARTS_TEMPLATE = """
WITH pruned AS (
    {prune}
)
INSERT INTO jobq_limit_start (scope, name, started_at, starts)
SELECT scope, name, clock_timestamp() + make_interval(secs => ahead), starts
FROM unnest(%(scopes)s::text[], %(names)s::text[], %(starts)s::integer[],
            %(aheads)s::float8[]) AS claimed(scope, name, starts, ahead)
RETURNING id, scope, name
"""
RECORD_STARTS = _RECORD_STARTS_TEMPLATE.format(
    prune=_PRUNE_STARTS_TEMPLATE.format(
        keys="unnest(%(scopes)s::text[], %(names)s::text[], %(windows)s::float8[])\n"
        "            AS key(scope, name, window_seconds)",
        in_window=_IN_WINDOW,
    )
)

#: Where :data:`ADMIT_CLAIMED` refuses a claim, the start of its error's text.
LIMIT_REFUSED = "no room left under the limit of"

#: The statement after the locks (``WAIT_FOR_LIMIT_STATES``) of a claim made before its
#: count (``django_jobq.limited_claims``), sent with ``COMMIT``: admit this transaction's
#: jobs under each key, or refuse them all. Per key (zipped ``%(scopes)s``, ``%(names)s``,
#: ``%(concurrencies)s`` (NULL: no concurrency limit), for a rate limit ``%(windows)s``
#: seconds, ``%(counts)s`` starts and ``%(aheads)s`` seconds, NULL for none), fleet-wide:
#:   - ``live`` (``_LIVE_UNDER_KEY``), this transaction's jobs included, and of them
#:     ``own``: the jobs this transaction claimed (the worker ``%(worker_id)s``'s, started
#:     at ``now()``, the transaction's start: a claim sets ``started_at = now()``, and
#:     each of a worker's claims is a transaction of its own after the last), found
#:     server-side, so the claim and this statement can travel in one round trip;
#:   - ``recent`` and ``frees_in`` (``_RECENT_STARTS``, ``_FREES_IN``), without this claim's
#:     starts;
#:   - ``has_row``: the key's row in ``jobq_limit_state`` exists (the lock found it);
#:   - ``start_id``: for a rate limit, the row logging the ``own`` starts (as
#:     ``RECORD_STARTS`` does, ``%(aheads)s`` ahead; pruning that key's rows out of the
#:     window), for ``CONFIRM_START``; NULL when nothing was claimed under it (then nothing
#:     is pruned either: a claim that took nothing writes nothing);
#:   - ``refused``: always NULL; the statement fails instead when a key's ``own`` jobs do
#:     not fit (more live than the concurrency limit, or ``recent`` plus ``own`` past the
#:     rate's count), the key has no row to lock, or the pauses and limits changed since
#:     the worker read them (``FLOW_DIGEST`` differs from ``%(flow_digest)s``: a change
#:     that committed between the claim statement and the locks; the claim made again
#:     with the locks first then finds the change), so the ``COMMIT`` sent after it never
#:     runs and the transaction is rolled back. Plain SQL has no ``RAISE``: the failure is
#:     a cast to integer of a text that names the key (``invalid_text_representation``,
#:     starting with :data:`LIMIT_REFUSED`); it depends on the row, so the planner cannot
#:     fold it into an error of every call.
#: A new statement, so under READ COMMITTED it sees every claim and start committed before
#: the locks were taken. ``counted`` and ``admitted`` are MATERIALIZED so that each count,
#: and the refusal, run once per key, before the log is written.
_ADMIT_CLAIMED_TEMPLATE = """
WITH counted AS MATERIALIZED (
    SELECT key.scope, key.name, key.concurrency, key.window_seconds, key.count, key.ahead,
           running.live, running.own,
           EXISTS (SELECT FROM jobq_limit_state AS state
                   WHERE state.scope = key.scope AND state.name = key.name) AS has_row,
           started.recent,
           {frees_in}
    FROM unnest(%(scopes)s::text[], %(names)s::text[], %(concurrencies)s::integer[],
                %(windows)s::float8[], %(counts)s::integer[], %(aheads)s::float8[])
        AS key(scope, name, concurrency, window_seconds, count, ahead)
    CROSS JOIN LATERAL (
        SELECT count(*) AS live,
               count(*) FILTER (WHERE job.worker_id = %(worker_id)s
                                  AND job.started_at = now()) AS own
        FROM jobq_job AS job
        WHERE {live_under_key}
    ) AS running
    {recent_starts}
), admitted AS MATERIALIZED (
    SELECT counted.*,
           CASE WHEN own > 0
                     AND (NOT has_row OR live > concurrency OR recent + own > count
                          OR {digest} IS DISTINCT FROM %(flow_digest)s)
                THEN CAST('{refused} ' || scope || ' ' || name AS integer)
           END AS refused
    FROM counted
), pruned AS (
    {prune}
), logged AS (
    INSERT INTO jobq_limit_start (scope, name, started_at, starts)
    SELECT scope, name, clock_timestamp() + make_interval(secs => ahead), own
    FROM admitted
    WHERE window_seconds IS NOT NULL AND own > 0 AND refused IS NULL
    RETURNING id, scope, name
)
SELECT admitted.scope, admitted.name, admitted.live, admitted.recent, admitted.frees_in,
       admitted.own, logged.id AS start_id, admitted.refused
FROM admitted
LEFT JOIN logged ON logged.scope = admitted.scope AND logged.name = admitted.name
"""
ADMIT_CLAIMED = _ADMIT_CLAIMED_TEMPLATE.format(
    digest=FLOW_DIGEST,
    recent_starts=_RECENT_STARTS,
    frees_in=_FREES_IN,
    live_under_key=_LIVE_UNDER_KEY,
    refused=LIMIT_REFUSED,
    prune=_PRUNE_STARTS_TEMPLATE.format(
        keys="(SELECT scope, name, window_seconds FROM admitted\n"
        "              WHERE window_seconds IS NOT NULL AND own > 0) AS key",
        in_window=_IN_WINDOW,
    ),
)

#: A rate-limited job's handler starts later than its claim's row counts it: move its start
#: out of its claim's rows (``%(rows)s``, their ids; one start fewer each) into rows of its
#: own for its rate-limited queue and kind (zipped ``%(scopes)s``, ``%(names)s`` and
#: ``%(aheads)s`` seconds), stamped ``clock_timestamp()`` plus its ahead, read once the
#: claim's rows are updated (the ``WHERE`` needs ``moved`` first): a wait for their lock
#: (another late start of the same claim) comes before the stamp, not after. One
#: statement, so every count sees the start in one row or the other. Run on the handler's
#: thread and committed before the handler starts, so a handler that started late behind
#: its claim still counts from its start (docs/flow-control.md, "Rate limits"). A claim's
#: row already pruned (out of its window) is left alone. Never waits for a limited claim.
#: Returns each new row's ``id``, ``scope`` and ``name`` (a start that must move again
#: moves out of them).
CONFIRM_START = """
WITH moved AS (
    UPDATE jobq_limit_start SET starts = starts - 1
    WHERE id = ANY(%(rows)s::bigint[]) AND starts > 0
    RETURNING id
)
INSERT INTO jobq_limit_start (scope, name, started_at, starts)
SELECT key.scope, key.name, clock_timestamp() + make_interval(secs => key.ahead), 1
FROM unnest(%(scopes)s::text[], %(names)s::text[], %(aheads)s::float8[])
    AS key(scope, name, ahead)
WHERE (SELECT count(*) FROM moved) >= 0
RETURNING id, scope, name
"""
