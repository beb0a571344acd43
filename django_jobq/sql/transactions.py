"""A transaction spelled out as statements, for one whose ``BEGIN`` and ``COMMIT`` travel in a
pipeline with its first and last statements (:mod:`django_jobq.pipelined_transaction`):
psycopg's own transaction blocks wait for each on its own."""

from __future__ import annotations

#: Opens the transaction (the connection is in autocommit: each statement is otherwise its
#: own transaction).
BEGIN = "BEGIN"

#: Ends it, keeping its writes and releasing its locks.
COMMIT = "COMMIT"

#: Ends it without its writes (a statement failed, or it had nothing to keep).
ROLLBACK = "ROLLBACK"
