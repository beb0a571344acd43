"""Sends Django's ``task_finished`` for the worker, on a thread of its own.

The statements that record outcomes return each task result they finished as JSON text
(:class:`django_jobq.outcomes.FinishedResult`). Reading one (a model instance, then the
framework's ``TaskResult``) and sending the signal is Python work for each task, and the
receivers are the project's code: on the main loop, both held back the next claim (a
quarter of its time in a burn-down of tasks, docs/performance.md), and a slow receiver
stalled every job of the process. The main loop hands them here once committed, in the
order it recorded them, and claims on.

Receivers run on this thread, one at a time, in that order. If :data:`MAX_WAITING`
results wait for it (beside those it is announcing), the main loop waits until it takes them:
memory stays bounded when receivers are slower than the jobs, and a receiver that never
returns stalls the worker then, as it did on the main loop. A worker
that stops waits for the results handed here to be announced, within its exit timeout;
those still waiting after it are logged and not announced.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Sequence

from django.db import connections

from .. import db, task_results
from ..outcomes import FinishedResult

logger = logging.getLogger("django_jobq.worker")

#: Results waiting for the announcer's thread to take them at which the main loop waits
#: before it hands it more (as many as a claim of the largest batch size takes).
MAX_WAITING = 10_000


class Announcer:
    """The thread that reads finished task results and sends ``task_finished`` for them."""

    def __init__(self, *, name: str) -> None:
        self._waiting: collections.deque[FinishedResult] = collections.deque()
        self._changed = threading.Condition()
        self._stopping = False
        self._handed = 0  # results handed to the thread
        self._done = 0  # of them, announced (or found unreadable), by the thread alone
        self._thread = threading.Thread(target=self._run, name=f"{name}-announcer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def announce(self, results: Sequence[FinishedResult]) -> None:
        """Announce ``results`` (committed) on the announcer's thread; return at once, unless
        :data:`MAX_WAITING` results wait already: then once the thread has taken them."""
        with self._changed:
            while len(self._waiting) >= MAX_WAITING and self._thread.is_alive():
                self._changed.wait()
            self._waiting.extend(results)
            self._handed += len(results)
            self._changed.notify_all()

    def stop(self, *, timeout: float) -> None:
        """Announce what waits, then end the thread; wait for that ``timeout`` seconds at
        most. Results still waiting then are logged (with a warning) and not announced."""
        deadline = time.monotonic() + timeout
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        if self._thread.is_alive():
            self._thread.join(max(0.0, deadline - time.monotonic()))
        left = self._handed - self._done
        if left:
            logger.warning(
                "%s: task_finished not sent for %s finished task(s): a receiver still ran "
                "when the worker exited",
                self._thread.name,
                left,
            )

    def _run(self) -> None:
        try:
            while (batch := self._take()) is not None:
                try:
                    db.close_unusable_connections()
                except Exception:  # announce all the same; a receiver meets the problem
                    logger.exception("announcer: closing unusable connections failed")
                for finished in batch:
                    try:
                        task_results.announce_read([finished])
                    except Exception:  # a bug here must not end the announcements
                        logger.exception("job %s: announcing its task's end failed", finished.job)
                    self._done += 1
        finally:
            connections.close_all()  # those the receivers opened on this thread

    def _take(self) -> list[FinishedResult] | None:
        """The results waiting, taken (``None``: stopping and nothing waits)."""
        with self._changed:
            while not self._waiting:
                if self._stopping:
                    return None
                self._changed.wait()
            batch = list(self._waiting)
            self._waiting.clear()
            self._changed.notify_all()
            return batch
