"""Plans: what keeps the plans of the worker's statements fit for the job table.

The main loop's connection prepares its statements (``worker.PREPARE_THRESHOLD``).
PostgreSQL then plans each one for its parameters five times and, when a plan for any
parameters costs no more, keeps that generic plan for the connection's life. It makes a
plan again only when the table's statistics, files or definition change (ANALYZE, VACUUM,
TRUNCATE, DDL), never because the table grew. A generic plan made while ``jobq_job`` was
empty (and analysed so) reads the table whole: a sequential scan of nothing costs less than
an index scan. Once a backlog arrives, every claim and ack of that connection reads every
row. Each claim's first statement returns the table's size (``sql.claims.CLAIM_JOBS_*``,
``job_table_size``), and :mod:`django_jobq.worker.plans` discards the plans once the table
has grown.

The plans of every connection, prepared or not, are only as good as the table's statistics.
An ANALYZE of the emptied table (autovacuum's, after a backlog drained) leaves statistics
that count no row, and PostgreSQL estimates each of its partial indexes at one row however
large it has grown since: a claim planned so may read a whole backlog's index entries,
then sort them, to take a batch. :mod:`django_jobq.worker.statistics` reads what the
statistics count against what the table holds (``READ_JOB_TABLE_COUNTS``) and analyses
the table when a backlog has outgrown them (``ANALYZE_JOB_TABLE``).
"""

from __future__ import annotations

#: Drop every cached plan of this session's prepared statements (they stay prepared): each
#: is planned again at its next run, for the table as it is then.
DISCARD_PLANS = "DISCARD PLANS"

#: What the statistics of ``jobq_job`` count, and what the table holds now: ``counted_rows``
#: (``reltuples``: -1 when it was never analysed nor vacuumed) and ``counted_bytes``
#: (``relpages`` pages), as the last ANALYZE or VACUUM wrote them; ``counted_by``, how many
#: ANALYZEs and VACUUMs of the table have written them (by the activity counters: an
#: ANALYZE that PostgreSQL skipped does not count; 0 with ``track_counts`` off); ``live_rows``,
#: the committed rows by the activity counters (``n_live_tup`` of ``pg_stat_user_tables``:
#: inserts less deletes as committed, which each backend sends at most once a second, and
#: an idle one up to 10 s late; an estimate, reset by a crash); ``bytes``, the table's size
#: on disk now, rows not yet committed included; ``may_analyse``: whether this session's
#: user may analyse the table (a superuser, a member of the role that owns it or the
#: database, or from PostgreSQL 17 one granted MAINTAIN on it; anyone else's ANALYZE is
#: skipped with a warning).
READ_JOB_TABLE_COUNTS = """
SELECT class.reltuples::float8 AS counted_rows,
       class.relpages::bigint * current_setting('block_size')::bigint AS counted_bytes,
       pg_stat_get_analyze_count(class.oid) + pg_stat_get_autoanalyze_count(class.oid)
       + pg_stat_get_vacuum_count(class.oid) + pg_stat_get_autovacuum_count(class.oid)
           AS counted_by,
       pg_stat_get_live_tuples(class.oid) AS live_rows,
       pg_relation_size(class.oid) AS bytes,
       current_setting('is_superuser') = 'on'
       OR pg_has_role(class.relowner, 'USAGE')
       OR pg_has_role((SELECT datdba FROM pg_database WHERE datname = current_database()),
                      'USAGE')
       OR CASE WHEN current_setting('server_version_num')::integer >= 170000
               THEN has_table_privilege(class.oid, 'MAINTAIN') ELSE false END
           AS may_analyse
FROM pg_class AS class
WHERE class.oid = 'jobq_job'::regclass
"""

#: Bring the statistics of ``jobq_job`` (and of its indexes) up to date: a sample of at most
#: 300 x ``default_statistics_target`` rows, read under a SHARE UPDATE EXCLUSIVE lock, which
#: claims, acks and enqueues do not wait for. ``SKIP_LOCKED``: when another ANALYZE or a
#: VACUUM holds that lock, it does nothing rather than wait (a warning says so, and the
#: counters of ``READ_JOB_TABLE_COUNTS`` do not move). Cached plans that read the table,
#: every session's, are made again at their next run. Rows not yet committed count as none:
#: an ANALYZE while a large insert is open writes statistics that count no row in the pages
#: it fills.
ANALYZE_JOB_TABLE = "ANALYZE (SKIP_LOCKED) jobq_job"
