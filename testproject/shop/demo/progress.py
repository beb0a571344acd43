"""The live view of the demo's jobs, read from the database.

The jobs table holds live jobs only (an ack deletes the row), so the jobs done are those
enqueued that are neither live nor dead letters. Only the shop's kinds are counted: other
apps' jobs in the same database are not the demo's business.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass

from django.core.management.base import OutputWrapper
from django.db.models import Count, Q
from django.db.models.functions import Now

from django_jobq.models import Job

from .reset import demo_dead_letters, demo_jobs


@dataclass(frozen=True)
class QueueSnapshot:
    """The shop's live jobs by state, and its dead letters, at one moment.

    ``ready``: due now. ``retry_scheduled``: ready but with ``run_at`` in the future (here:
    waiting out a retry delay). ``running``: leased by a worker.
    """

    ready: int
    retry_scheduled: int
    running: int
    dead_letters: int

    @property
    def live(self) -> int:
        return self.ready + self.retry_scheduled + self.running

    @classmethod
    def take(cls) -> QueueSnapshot:
        ready = Q(status=Job.Status.READY)
        counts = demo_jobs().aggregate(
            ready=Count("id", filter=ready & Q(run_at__lte=Now())),
            retry_scheduled=Count("id", filter=ready & Q(run_at__gt=Now())),
            running=Count("id", filter=Q(status=Job.Status.RUNNING)),
        )
        return cls(**counts, dead_letters=demo_dead_letters().count())


class ProgressDisplay:
    """One status line: redrawn in place on a terminal, printed every ~2 s otherwise.

    Call :meth:`update` as often as you like; it queries the database only when a line is
    due. ``jobs/s`` is the rate over the last interval.
    """

    def __init__(self, out: OutputWrapper, total_requests: int) -> None:
        self._out = out
        self._tty = out.isatty()
        self._interval = 0.25 if self._tty else 2.0
        self._total_requests = total_requests
        self._started = self._last_time = time.monotonic()
        self._last_drawn = -1.0
        self._last_done = 0
        self._width = 0

    def update(self, requests: int, enqueued: int, *, force: bool = False) -> QueueSnapshot | None:
        """Draw a line if one is due (or ``force``); return the snapshot it showed."""
        now = time.monotonic()
        if not force and now - self._last_drawn < self._interval:
            return None
        snapshot = QueueSnapshot.take()
        done = enqueued - snapshot.live - snapshot.dead_letters
        elapsed = now - self._last_time
        rate = (done - self._last_done) / elapsed if elapsed > 0 else 0.0
        self._last_time, self._last_done, self._last_drawn = now, done, now
        line = (
            f"{now - self._started:5.1f}s  requests {requests}/{self._total_requests}"
            f" | enqueued {enqueued} | done {done} | ready {snapshot.ready}"
            f" | running {snapshot.running} | retry-scheduled {snapshot.retry_scheduled}"
            f" | dead letters {snapshot.dead_letters} | {rate:.0f} jobs/s"
        )
        if self._tty:
            # Never wider than the terminal: a wrapped line cannot be redrawn in place.
            line = line[: shutil.get_terminal_size().columns - 1]
            self._out.write("\r" + line.ljust(self._width), ending="")
            self._width = len(line)
            self._out.flush()
        else:
            self._out.write(line)
        return snapshot

    def finish(self) -> None:
        """End the redrawn line (call once, after the last update)."""
        if self._tty and self._width:
            self._out.write("")
