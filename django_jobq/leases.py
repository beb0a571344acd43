"""Leases: the key of every fenced write (:class:`Lease`), what a locked write reports
(:class:`Written`, :class:`LeaseBusy`), the writes that keep or give back a lease
(:func:`heartbeat`, :func:`release`), and the read of abort requests on held leases
(:func:`abort_requested`; a heartbeat returns them too).

A write about a running job is fenced by ``(job id, attempt)`` (``sql.leases.FENCED``): if
another attempt holds the job now (its lease lapsed and it was reclaimed) the write matches
nothing and the function reports that it did not apply. These writes never raise for a lost
lease; they raise only for database errors (and :class:`LeaseBusy`).

None of them waits for a row lock another transaction holds (an operator's ``SELECT ... FOR
UPDATE``, a handler's ``ctx.atomic()``): a locked row is skipped and reported *busy*
(nothing written; try again later), so one locked row never stalls the writes about a
worker's other jobs. Batch writes lock their rows in id order (see :mod:`django_jobq.sql.leases`).
The outcomes (ack, retry, dead letter) are recorded by :mod:`django_jobq.outcomes`; claims
are made by :mod:`django_jobq.claims`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

import psycopg
from psycopg.rows import class_row

from . import sql


class Lease(NamedTuple):
    """A job id with the attempt that holds its lease: the key of every fenced write."""

    job_id: int
    attempt: int


class LeaseBusy(Exception):
    """A single-job write (a retry, a dead letter) found the job's row locked by another
    transaction (or, in the worker, a table it writes locked for longer than a short wait):
    nothing was written, the lease may still be held. Try again later."""

    def __init__(self, job_id: int) -> None:
        super().__init__(f"job {job_id}: its row is locked by another transaction")
        self.job_id = job_id


class Written(set[int]):
    """The ids a batch write applied to (the lease was held); :attr:`busy` holds the ids it
    skipped because another transaction holds their row lock (nothing written). An id in
    neither is a lost lease."""

    def __init__(self, applied: Iterable[int] = (), busy: Iterable[int] = ()) -> None:
        super().__init__(applied)
        self.busy = frozenset(busy)


class Extended(dict[int, datetime]):
    """``{job id: new lease deadline}`` of the leases a heartbeat extended; :attr:`busy`
    holds the ids it skipped because another transaction holds their row lock. A lease in
    neither is lost. :attr:`abort_requested` holds the ids extended whose job an operator
    asked to stop (:func:`django_jobq.operations.abort`)."""

    def __init__(
        self,
        deadlines: Iterable[tuple[int, datetime]],
        busy: Iterable[int],
        abort_requested: Iterable[int] = (),
    ) -> None:
        super().__init__(deadlines)
        self.busy = frozenset(busy)
        self.abort_requested = frozenset(abort_requested)


@dataclass(frozen=True)
class _Released:
    """A row of ``sql.leases.RELEASE_JOBS``."""

    id: int
    busy: bool


@dataclass(frozen=True)
class _Extended:
    """A row of ``sql.leases.HEARTBEAT_JOBS`` (``lease_deadline`` is ``None`` when busy)."""

    id: int
    busy: bool
    lease_deadline: datetime | None
    abort_requested: bool


def lease_arrays(leases: Sequence[Lease]) -> dict[str, list[int]]:
    """The ``%(ids)s`` and ``%(attempts)s`` parameters of a batch write's fence."""
    return {
        "ids": [lease.job_id for lease in leases],
        "attempts": [lease.attempt for lease in leases],
    }


def heartbeat(cursor: psycopg.Cursor[Any], leases: Sequence[Lease]) -> Extended:
    """Extend held leases to ``now() + visibility_timeout`` in one statement, without waiting
    for a locked row.

    Returns ``{job id: new lease deadline}`` for the leases extended, in ``.busy`` the
    ids whose row another transaction had locked (not extended; try again soon), and in
    ``.abort_requested`` the ids extended whose job has an abort requested. A lease in
    neither of the first two is lost: another attempt holds the job, or its deadline had
    already passed (a lapsed lease is never revived, since another worker may be
    reclaiming it).
    """
    if not leases:
        return Extended((), ())
    with cursor.connection.cursor(row_factory=class_row(_Extended)) as typed:
        typed.execute(sql.leases.HEARTBEAT_JOBS, lease_arrays(leases))
        rows = typed.fetchall()
    return Extended(
        ((row.id, row.lease_deadline) for row in rows if row.lease_deadline is not None),
        (row.id for row in rows if row.busy),
        (row.id for row in rows if row.abort_requested),
    )


def abort_requested(cursor: psycopg.Cursor[Any], leases: Sequence[Lease]) -> frozenset[int]:
    """The ids among ``leases`` (still held: fenced) whose job an operator asked to stop
    (``sql.aborts.ABORT_REQUESTED``): one read, no lock taken, nothing written. The
    heartbeater's look between two heartbeats."""
    if not leases:
        return frozenset()
    cursor.execute(sql.aborts.ABORT_REQUESTED, lease_arrays(leases))
    return frozenset(row[0] for row in cursor.fetchall())


def release(
    cursor: psycopg.Cursor[Any], leases: Sequence[Lease], *, results: bool = False
) -> Written:
    """Return leased, never-started jobs to the ready state without consuming an attempt,
    without waiting for a locked row. With ``results``, some are tasks' jobs whose results
    were marked RUNNING at their claim: those become READY again in the same statement
    (``sql.leases.RELEASE_JOBS_WITH_RESULTS``).

    Returns the ids released (those whose lease the caller still held); ``.busy``: those
    whose row another transaction had locked (not released; try again later).
    """
    if not leases:
        return Written()
    with cursor.connection.cursor(row_factory=class_row(_Released)) as typed:
        statement = sql.leases.RELEASE_JOBS_WITH_RESULTS if results else sql.leases.RELEASE_JOBS
        typed.execute(statement, lease_arrays(leases))
        rows = typed.fetchall()
    return Written((row.id for row in rows if not row.busy), (row.id for row in rows if row.busy))
