"""Plans: what keeps the plans of the worker's prepared statements fit for the job table.

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
"""

from __future__ import annotations

#: Drop every cached plan of this session's prepared statements (they stay prepared): each
#: is planned again at its next run, for the table as it is then.
DISCARD_PLANS = "DISCARD PLANS"
