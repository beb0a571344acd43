"""The worker registry: each running worker has a row in ``jobq_worker_process``.

A worker registers when it starts (id, host, pid, queues, concurrency, and the kinds it
claims with their fingerprint, see :func:`django_jobq.registry.claimable_kinds`), refreshes its
``last_seen`` every :data:`BEAT_INTERVAL` seconds from its main loop, and deletes its row when
it stops. A worker that crashes cannot delete its row: once not seen for
:data:`django_jobq.stats.STALE_AFTER` seconds it is shown as stale (the dashboard,
``jobq_stats``, the ``jobq_workers{state="stale"}`` gauge), and the maintenance sweep deletes
the row :data:`PRUNE_AFTER` seconds after its last beat.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Sequence

from .. import sql
from ..db import Cursor
from ..registry import kinds_fingerprint

#: Seconds between two beats of a worker.
BEAT_INTERVAL = 10.0
#: Seconds after its last beat that the maintenance sweep deletes a worker's row.
PRUNE_AFTER = 3600.0


class Registration:
    """One worker's row. Methods run one statement each on the given cursor."""

    def __init__(
        self,
        *,
        worker_id: str,
        queues: Sequence[str] | None,
        concurrency: int,
        kinds: Sequence[str],
    ) -> None:
        self._params = {
            "worker_id": worker_id,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "queues": None if queues is None else json.dumps(list(queues)),
            "concurrency": concurrency,
            "kinds": json.dumps(sorted(kinds)),
            "kinds_fingerprint": kinds_fingerprint(kinds),
        }
        self.row_id: int | None = None

    def register(self, cursor: Cursor) -> int:
        """Insert the worker's row; return its id."""
        cursor.execute(sql.workers.REGISTER_WORKER, self._params)
        ((self.row_id,),) = cursor.fetchall()
        return self.row_id

    def beat(self, cursor: Cursor) -> None:
        """Refresh ``last_seen``; register again if the row is gone (pruned while this
        worker was stalled for over an hour)."""
        if self.row_id is not None:
            cursor.execute(sql.workers.BEAT_WORKER, {"id": self.row_id})
            if cursor.fetchall():
                return
        self.register(cursor)

    def deregister(self, cursor: Cursor) -> None:
        """Delete the worker's row (nothing if it was never registered)."""
        if self.row_id is not None:
            cursor.execute(sql.workers.DEREGISTER_WORKER, {"id": self.row_id})
            self.row_id = None
