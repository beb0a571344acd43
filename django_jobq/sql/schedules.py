"""The schedules' statements: each schedule's ``jobq_schedule`` row, read, synced to the
definition a scheduler runs, and advanced by compare-and-set in the transaction that
enqueues a tick's job, so each tick yields exactly one job (:mod:`django_jobq.scheduling`).
"""

from __future__ import annotations

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
