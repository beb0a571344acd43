"""Moving ordered lanes on: making the next job of a lane ready once the job ahead of it
ended (docs/flow-control.md, "Ordered lanes"; the statements are ``sql.lanes``).

Who moves a lane on, and why nothing is missed: a job joins a lane as ``waiting`` when its
insert sees a job of the lane (``sql.enqueue.LANE_STATUS``), and the lane's next job is made
ready by whoever ends the job ahead of it (a worker's ack or dead letter, a cancel). Each side
commits its own write first and then runs :data:`~django_jobq.sql.lanes.PROMOTE_LANES` in a
new statement: the ender after its commit (a worker's connection autocommits; a cancel or a
redrive with :func:`promote_at_commit`), and the enqueue of a waiting job after *its* commit
(:func:`promote_at_commit`). Of two such statements the later one sees both commits, so a job
enqueued while the job ahead of it ends never waits for the maintenance round
(``PROMOTE_STALLED_LANES``, for a process that died between its commit and its promotion).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import connections, transaction

from . import sql


def promote(cursor: Any, lanes: Iterable[str]) -> int:
    """Run ``sql.lanes.PROMOTE_LANES`` for ``lanes`` on ``cursor`` (a psycopg or Django
    cursor): make the next job of each ready if none of its jobs runs or is ready. Returns
    how many jobs were made ready (their workers are woken at commit)."""
    keys = sorted(set(lanes))
    if not keys:
        return 0
    cursor.execute(sql.lanes.PROMOTE_LANES, {"lanes": keys, "channel": sql.wake.WAKE_CHANNEL})
    row = cursor.fetchone()
    return int(row[0]) if row is not None else 0


def promote_at_commit(alias: str, lanes: Iterable[str]) -> None:
    """Promote ``lanes`` (:func:`promote`) once the current transaction of database
    ``alias`` commits, in a statement of its own; at once outside a transaction (Django runs
    ``on_commit`` callbacks then). Nothing runs after a rollback."""
    keys = sorted(set(lanes))
    if not keys:
        return

    def promote_committed() -> None:
        with connections[alias].cursor() as cursor:
            promote(cursor, keys)

    transaction.on_commit(promote_committed, using=alias)
