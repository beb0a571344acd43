"""The testing helpers' statement (:mod:`django_jobq.testing`): making jobs due inside a
test's transaction, where ``now()`` stands still."""

from __future__ import annotations

#: Make ready jobs due by the transaction's ``now()``, before a claim in a test's transaction
#: (the claim takes ``run_at <= now()``): the jobs of ``%(kinds)s`` (and of ``%(queues)s``;
#: NULL: every queue) that were due when enqueued (not yet attempted, ``run_at`` not after
#: ``created_at``: no delay, or a ``run_at`` already passed), which enqueue dates by the
#: statement's clock (``sql.enqueue.INSERT_JOBS``), after the transaction's ``now()``; and,
#: with ``%(scheduled)s``, every other ready job not yet due too (a delay, a future
#: ``run_at``, a retry's backoff). Returns the ids made due.
MAKE_JOBS_DUE = """
UPDATE jobq_job
SET run_at = now()
WHERE status = 'ready' AND run_at > now()
  AND (%(scheduled)s OR (attempts = 0 AND run_at <= created_at))
  AND kind = ANY(%(kinds)s::text[])
  AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
RETURNING id
"""
