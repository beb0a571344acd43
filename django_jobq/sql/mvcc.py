"""The MVCC health statements (:mod:`django_jobq.mvcc`: ``jobq_doctor``, the checks, the
metrics, the dashboard).

Vacuum removes a dead row version only once no transaction can still see it: once it died
before the xmin horizon, the oldest xmin or xid that anything in the cluster still holds.
These statements read who holds it back and what it costs the jobq tables. They read
catalogs and statistics views only (shared memory and pg_class, never a table's rows), so
each is bounded: by max_connections, the replication slots, the prepared transactions and
the jobq tables' indexes.
"""

from __future__ import annotations

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
