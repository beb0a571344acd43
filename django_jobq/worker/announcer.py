"""Sends Django's ``task_finished`` for the worker, on a thread of its own.

The statements that record outcomes return each task result they finished
(:class:`django_jobq.outcomes.FinishedResult`): as JSON text, or, for an ack's result the
worker holds already, as the time it finished. Making the framework's ``TaskResult`` of it
and sending the signal is Python work for each task, and the
receivers are the project's code: on the main loop, both held back the next claim (18 % of
the loop's time in a burn-down of tasks, docs/performance.md), and a slow receiver stalled
every job of the process. The main loop hands them here once committed (and the results the
maintenance sweep failed), in the order it recorded them, and claims on.

Receivers run on this thread, one result at a time, in that order; an exception a receiver
raises, even ``SystemExit``, is logged and the next result is announced. While
:data:`MAX_WAITING` results are unannounced the worker claims no job (:meth:`Announcer.behind`):
memory stays bounded when receivers are slower than the jobs, and the main loop goes on
recording outcomes, extending leases and heeding a stop. A worker finishes only once the
thread has announced everything (a burst worker then looks for jobs once more: a receiver
may have enqueued some); a stopping worker waits for it until its shutdown deadline, like
its running jobs. What is still unannounced when the worker exits is counted in a warning,
and never sent.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Sequence

from django.db import connections

from .. import db, task_results
from ..models import StoredTaskResult
from ..outcomes import FinishedResult

logger = logging.getLogger("django_jobq.worker")

#: Unannounced results from which the worker claims no more jobs until the announcer has
#: caught up below it (as many as a claim of the largest batch size takes).
MAX_WAITING = 10_000

#: A result to announce: as an outcome statement returned it (unread), or read already.
Finished = FinishedResult | StoredTaskResult


class Announcer:
    """The thread that sends ``task_finished`` for finished task results.

    ``wake`` is called (on the announcer's thread) each time it has announced every result
    handed to it, or caught up below :data:`MAX_WAITING`, and when the thread ends: the
    worker's wake-up, so that a worker waiting to finish, or to claim, goes on.
    """

    def __init__(self, *, name: str, wake: Callable[[], None]) -> None:
        self._wake = wake
        self._waiting: collections.deque[Finished] = collections.deque()
        self._changed = threading.Condition()
        self._stopping = False
        self._abandoned = False  # stopped: announce nothing more
        self._handed = 0  # results handed to the thread
        self._done = 0  # of them, announced (or found unreadable), by the thread alone
        self._thread = threading.Thread(target=self._run, name=f"{name}-announcer", daemon=True)

    def start(self) -> None:
        """Start the thread (once; before that, :meth:`announce` sends on the caller's
        thread).

        Raises:
            RuntimeError: it was started already.
        """
        self._thread.start()

    def announce(self, results: Sequence[Finished]) -> None:
        """Announce ``results`` (committed) on the announcer's thread; return at once. If the
        thread is not running (not started, or ended by a bug), announce them on the
        caller's thread."""
        with self._changed:
            if self._thread.is_alive():
                self._waiting.extend(results)
                self._handed += len(results)
                self._changed.notify_all()
                return
        for finished in results:
            _announce(finished)

    def idle(self) -> bool:
        """Whether every result handed to the thread has been announced (or the thread has
        ended, and never will)."""
        return self._done == self._handed or not self._thread.is_alive()

    def behind(self) -> bool:
        """Whether :data:`MAX_WAITING` results or more are unannounced (the thread
        running): the worker should claim nothing until it is woken."""
        return self._handed - self._done >= MAX_WAITING and self._thread.is_alive()

    def stop(self, *, timeout: float) -> None:
        """End the thread once it has announced what waits, waiting for that ``timeout``
        seconds at most; what it has not announced by then is logged (a warning) and never
        announced. Calling it again does nothing."""
        with self._changed:
            if self._stopping:
                return
            self._stopping = True
            self._changed.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)
        with self._changed:
            self._abandoned = True
            left = self._handed - self._done
        if left:
            logger.warning(
                "%s: task_finished not sent for %s finished task(s): %s",
                self._thread.name,
                left,
                "the receivers had not got to them when the worker exited"
                if self._thread.is_alive()
                else "the announcer thread had ended",
            )

    def _run(self) -> None:
        try:
            while (batch := self._take()) is not None:
                try:
                    db.close_unusable_connections()
                except Exception:  # announce all the same; a receiver meets the problem
                    logger.exception("announcer: closing unusable connections failed")
                for finished in batch:
                    if self._abandoned:
                        return
                    was_behind = self.behind()
                    try:
                        _announce(finished)
                    except BaseException:  # a receiver's SystemExit must not end the thread
                        logger.exception("job %s: task_finished raised", _job_id(finished))
                    self._done += 1
                    if was_behind and not self.behind():
                        self._wake()  # the worker may claim again
                if self.idle():
                    self._wake()
        finally:
            connections.close_all()  # those the receivers opened on this thread
            self._wake()  # a worker waiting for it: it will announce nothing more

    def _take(self) -> list[Finished] | None:
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


def _announce(finished: Finished) -> None:
    """Send ``task_finished`` for one result (a receiver's ``Exception`` is logged by
    :func:`django_jobq.task_results.announce_finished`)."""
    if isinstance(finished, StoredTaskResult):
        task_results.announce_finished([finished])
    else:
        task_results.read_and_announce([finished])


def _job_id(finished: Finished) -> int | None:
    return finished.job_id if isinstance(finished, StoredTaskResult) else finished.job
