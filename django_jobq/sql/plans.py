"""Plans: what keeps the plans of the worker's prepared statements fit for the job table.

The main loop's connection prepares its statements (``worker.PREPARE_THRESHOLD``).
PostgreSQL then plans each one for its parameters five times and, when a plan for any
parameters costs no more, keeps that generic plan for the connection's life. It makes a plan
again only when the table's statistics or definition change (ANALYZE, VACUUM, DDL), never
because the table grew. A generic plan made while ``jobq_job`` was empty (and analysed so)
reads the table whole: a sequential scan of nothing costs less than an index scan. Once a
backlog arrives, every claim and ack of that connection reads every row
(:mod:`django_jobq.worker.plans` measures the growth and discards the plans).
"""

from __future__ import annotations

#: The size of ``jobq_job`` in bytes: the length of its main fork's files, read without a
#: scan or a lock that could wait (``pg_relation_size``).
JOB_TABLE_SIZE = "SELECT pg_relation_size('jobq_job'::regclass)"

#: Drop every cached plan of this session's prepared statements (they stay prepared): each
#: is planned again at its next run, for the table as it is then.
DISCARD_PLANS = "DISCARD PLANS"
