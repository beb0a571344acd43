"""The worker registry: each running worker's row in ``jobq_worker_process``.

A worker registers when it starts, beats from its main loop and deregisters when it stops
(:mod:`django_jobq.worker.registration`); the maintenance round prunes the rows of workers
that crashed without deregistering (``maintenance.PRUNE_WORKER_PROCESSES``).
"""

from __future__ import annotations

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
