"""What a handler can know about its own run: ``@job(takes_context=True)``.

::

    @job(takes_context=True, visibility_timeout=60)
    def rebuild_index(ctx: JobContext, shard: int) -> None:
        for batch in batches(shard):
            if ctx.lease_lost:        # another worker has (or may have) taken this job over
                return
            index(batch)
        ctx.heartbeat()               # extend the lease before one long final step
        publish(shard)

The worker heartbeats running jobs on its own; :meth:`JobContext.heartbeat` is for a single
step that may outlast a third of the visibility timeout between two automatic heartbeats.

An operator may ask a running job to stop (:func:`django_jobq.operations.abort`); a handler
that can stop part-way checks between steps, and the attempt becomes a dead letter
"aborted"::

    @job(takes_context=True, visibility_timeout=60)
    def export(ctx: JobContext, report_id: int) -> None:
        for page in pages(report_id):
            ctx.raise_if_aborted()    # raises Aborted once the worker has seen the request
            write(page)

An async handler (``async def``) gets the same context, with awaitable forms of the two
methods that touch the database: :meth:`JobContext.aheartbeat`, and :meth:`JobContext.aatomic`,
which runs a plain function inside :meth:`JobContext.atomic` on Django's sync thread::

    @job(takes_context=True)
    async def import_feed(ctx: JobContext, url: str) -> None:
        rows = await fetch(url)                      # the event loop runs other jobs meanwhile
        await ctx.aheartbeat()
        await ctx.aatomic(save_rows, rows)           # the rows and the job's ack commit together
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from typing import ParamSpec, Protocol, TypeVar

from asgiref.sync import sync_to_async
from django.db import connections, transaction

from . import crash_points, outcomes
from .claims import ClaimedJob
from .conf import get_settings
from .exceptions import Aborted
from .idempotency import LeaseLost, idempotent

P = ParamSpec("P")
T = TypeVar("T")


class HeldAttempt(Protocol):
    """What a context reads of the worker's hold on the attempt (the worker's ``HeldJob``):
    the job, the lease's last confirmed deadline, whether the lease is lost, the atomic
    blocks open before the attempt started (:meth:`JobContext.atomic`), whether an abort
    request was seen; and what it writes: that the handler acked the job in its
    transaction."""

    @property
    def job(self) -> ClaimedJob: ...
    @property
    def deadline(self) -> datetime: ...
    @property
    def lease_lost(self) -> bool: ...
    @property
    def outer_atomic_blocks(self) -> int: ...
    @property
    def abort_requested(self) -> bool: ...

    acked: bool


class JobContext:
    """The running attempt of a job, as its handler sees it.

    Attributes:
        job_id: the job's id (``Job.id``; ``DeadLetter.job_id`` if it dies).
        attempt: this attempt's number, 1 for the first run; the lease's fencing token.
        kind, queue: the job's kind and queue.
    """

    def __init__(self, held: HeldAttempt, extend: Callable[[], bool]) -> None:
        """``extend`` extends the attempt's lease at once (the worker's heartbeater), as
        :meth:`heartbeat` returns."""
        self._held = held
        self._extend = extend
        self.job_id = held.job.id
        self.attempt = held.job.attempt
        self.kind = held.job.kind
        self.queue = held.job.queue

    @property
    def deadline(self) -> datetime:
        """When the lease lapses unless extended (aware datetime, database clock)."""
        return self._held.deadline

    @property
    def lease_lost(self) -> bool:
        """True once a heartbeat was refused: the deadline passed, or another attempt holds
        the job. The handler should stop; its outcome will not be recorded."""
        return self._held.lease_lost

    @property
    def abort_requested(self) -> bool:
        """True once the worker has seen an operator's request that this attempt stop
        (:func:`django_jobq.operations.abort`). The worker reads requests with each
        heartbeat and between two, every sixth of the visibility timeout (half a heartbeat
        interval), so it is true within that time of the request; it is never reset.

        The handler should stop: raise (:meth:`raise_if_aborted`, or any exception) and
        the attempt becomes a dead letter with reason "aborted", never retried; return
        normally and the job is acked as usual (the request is then ignored). Reading it
        costs no statement."""
        return self._held.abort_requested

    def raise_if_aborted(self) -> None:
        """Raise :class:`~django_jobq.exceptions.Aborted` if :attr:`abort_requested`, else
        return ``None``. A cheap check (no statement) to call between steps.

        Raises:
            Aborted: an abort of this attempt was requested; let it propagate (or raise
                another exception): the attempt becomes a dead letter "aborted".
        """
        if self._held.abort_requested:
            raise Aborted(
                f"job {self.job_id} attempt {self.attempt}: abort requested by an operator"
            )

    def heartbeat(self) -> bool:
        """Extend the lease to now + visibility timeout at once.

        Returns:
            ``True`` if extended; ``False`` if the lease is lost (then :attr:`lease_lost` is
            true), the database could not be reached (logged; the worker keeps trying) or
            another transaction holds the job's row lock (the worker tries again soon).
        """
        return self._extend()

    async def aheartbeat(self) -> bool:
        """:meth:`heartbeat` for an async handler: the statement runs on a thread of asyncio's
        default executor, so the event loop (and the worker's other async jobs) goes on
        meanwhile. Returns as :meth:`heartbeat` does."""
        return await sync_to_async(self._extend, thread_sensitive=False)()

    @contextmanager
    def atomic(self) -> Iterator[None]:
        """A transaction on the queue's database that also completes the job.

        The block's writes and the job's fenced ack commit together; afterwards the job is
        done (the worker records nothing more). Use it for jobs whose effect is a database
        write: a crash before the commit leaves neither the effect nor the ack, a crash after
        it leaves both, so a redelivery never repeats the effect.

        A transaction that was already open when the attempt started is not the handler's:
        that of a test in which :func:`django_jobq.testing.run_jobs` runs the job. The block
        is then a savepoint of it, and commits (effect and ack) with the test's transaction.

        Raises:
            LeaseLost: the ack matched nothing (another attempt holds the job); the block's
                writes were rolled back.
            RuntimeError: called inside another transaction on the queue's database that
                the handler opened (the ack would then commit only with that outer
                transaction), or twice.
        """
        alias = get_settings().DATABASE
        opened = len(connections[alias].atomic_blocks) > self._held.outer_atomic_blocks
        if opened or self._held.acked:
            raise RuntimeError(
                "ctx.atomic() opens the job's transaction itself: it cannot run inside "
                "another transaction on the queue's database, nor twice."
            )
        with transaction.atomic(using=alias):
            yield
            with connections[alias].cursor() as cursor:
                if not outcomes.ack_in_transaction(cursor, self.job_id, self.attempt):
                    raise LeaseLost(
                        f"job {self.job_id} attempt {self.attempt}: lease lost before commit; "
                        f"this attempt's writes were rolled back"
                    )
        if crash_points.reach is not None:
            crash_points.reach("after_ack")
        self._held.acked = True

    async def aatomic(self, func: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """:meth:`atomic` for an async handler: run the plain function ``func(*args,
        **kwargs)`` inside ``ctx.atomic()``, on Django's sync thread
        (``sync_to_async(thread_sensitive=True)``, where the async ORM runs its queries), and
        return what it returns. ``func``'s writes and the job's fenced ack commit together;
        the event loop runs other jobs meanwhile. ``func`` uses the ORM's sync API (it runs in
        a plain thread)::

            def save(rows: list[dict]) -> None:
                Row.objects.bulk_create(Row(**row) for row in rows)

            await ctx.aatomic(save, rows)

        Django has no async transaction API: a transaction opened by ``async`` code would
        span awaits, and other jobs' queries would run inside it on the shared sync thread.
        Hence a function, run whole on that thread.

        Raises:
            LeaseLost, RuntimeError: as :meth:`atomic`.
            Exception: whatever ``func`` raises (its writes are rolled back, nothing acked).
        """

        def run() -> T:
            with self.atomic():
                return func(*args, **kwargs)

        return await sync_to_async(run, thread_sensitive=True)()

    def idempotent(self, key: str | None = None) -> AbstractContextManager[bool]:
        """:func:`django_jobq.idempotency.idempotent` with this job's kind as namespace and
        ``key`` defaulting to the job id (``"job-<id>"``); yields whether it is new."""
        return idempotent(key or f"job-{self.job_id}", kind=self.kind, job_id=self.job_id)
