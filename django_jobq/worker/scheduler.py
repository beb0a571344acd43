"""The scheduler: each worker enqueues the jobs of due schedule ticks.

Every worker runs one (``jobq_worker --no-scheduler`` opts out); however many run, each
tick yields one job (see :func:`django_jobq.scheduling.enqueue_due`). :meth:`Scheduler.run_if_due`
is called from the worker's main loop and returns at once until the next tick is due;
:attr:`Scheduler.next_due` tells the idle worker when to wake up for it.

The enqueue goes through Django's connection on the worker's main thread, with
``close_old_connections()`` around each round, as around a request.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from django.db import DatabaseError, close_old_connections
from django.utils import timezone

from .. import scheduling

logger = logging.getLogger("django_jobq.worker")

#: How long a scheduler waits before trying again after a database error. A missed tick is
#: not lost: the next round enqueues it (see the missed-tick policy).
RETRY_AFTER_ERROR = timedelta(seconds=5)


class Scheduler:
    """Enqueues due ticks' jobs, one round per due time.

    Args:
        scheduled: the schedules to run; default every declared one
            (:func:`django_jobq.scheduling.collect`).
        clock: returns the current aware datetime (tests pass a simulated clock).

    Raises:
        ImproperlyConfigured: a declared schedule is invalid (on construction).
    """

    def __init__(
        self,
        scheduled: Sequence[scheduling.ScheduledJob] | None = None,
        *,
        clock: Callable[[], datetime] = timezone.now,
    ) -> None:
        self._schedules = list(scheduling.collect() if scheduled is None else scheduled)
        self._clock = clock
        self._next_due: datetime | None = clock() if self._schedules else None
        self._floors: dict[str, datetime] = {}  # see enqueue_due

    @property
    def next_due(self) -> datetime | None:
        """When :meth:`run_if_due` next has work (an aware datetime); ``None``: never."""
        return self._next_due

    def run_if_due(self) -> list[scheduling.Enqueued]:
        """Enqueue the due ticks' jobs if a tick is due; return what was enqueued."""
        if self._next_due is None:
            return []
        now = self._clock()
        if now < self._next_due:
            return []
        close_old_connections()
        try:
            result = scheduling.enqueue_due(self._schedules, now=now, floors=self._floors)
        except DatabaseError as exc:  # e.g. the database is unreachable: try again later
            logger.warning("scheduler: could not enqueue due ticks, retrying soon: %s", exc)
            self._next_due = now + RETRY_AFTER_ERROR
            return []
        finally:
            close_old_connections()
        self._next_due = result.next_due
        for enqueued in result.enqueued:
            logger.debug(
                "scheduler: enqueued job %s of schedule %s for tick %s",
                enqueued.job.pk,
                enqueued.schedule,
                enqueued.tick.isoformat(),
            )
        return result.enqueued
