"""Lock waits the worker bounds in its own transactions.

The worker's connections have a server-side ``lock_timeout`` (:func:`django_jobq.db.connect`);
the statements here shorten it where a long wait would stall more than one job.
"""

from __future__ import annotations

#: Wait this long at most for a table lock in the worker's writes about one job (a
#: transaction's ``SET LOCAL``): a dead letter's insert waits for no ``CREATE INDEX`` or
#: ``LOCK TABLE`` on ``jobq_dead_letter``; the job's outcome is written again later.
SET_SHORT_LOCK_TIMEOUT = "SET LOCAL lock_timeout = '100ms'"
