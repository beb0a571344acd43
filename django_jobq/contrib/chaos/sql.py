"""The chaos suite's own statements: its business table, and the connections it finds and
terminates. Run only by the chaos run and its workers; the product's statements are in
:mod:`django_jobq.sql`.
"""

from __future__ import annotations

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
#: ``%(pattern)s`` (a LIKE pattern), with their backends' pids. Workers name theirs ``jobq
#: worker <id>``, ``jobq heartbeat <id>``: the chaos run finds other workers (and refuses to
#: start beside them) and its own.
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
