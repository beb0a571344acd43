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
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .worker.held import HeldJob


class JobContext:
    """The running attempt of a job, as its handler sees it.

    Attributes:
        job_id: the job's id (``Job.id``; ``DeadLetter.job_id`` if it dies).
        attempt: this attempt's number, 1 for the first run; the lease's fencing token.
        kind, queue: the job's kind and queue.
    """

    def __init__(self, held: HeldJob, extend: Callable[[HeldJob], bool]) -> None:
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

    def heartbeat(self) -> bool:
        """Extend the lease to now + visibility timeout at once.

        Returns:
            ``True`` if extended; ``False`` if the lease is lost (then :attr:`lease_lost` is
            true) or the database could not be reached (logged; the worker keeps trying).
        """
        return self._extend(self._held)
