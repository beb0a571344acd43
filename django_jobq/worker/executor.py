"""Handler threads: each runs claimed jobs one at a time and reports an :class:`Outcome`.

Handlers use Django's ORM on the thread's own Django connection. As around a request,
``close_old_connections()`` runs before and after every job, so a broken or expired
connection never leaks from one job into the next.
"""

from __future__ import annotations

import enum
import logging
import queue
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from django.db import close_old_connections, connections

from .. import registry
from ..context import JobContext
from ..leases import ClaimedJob
from .held import HeldJob

logger = logging.getLogger("django_jobq.worker")


class Result(enum.Enum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    UNKNOWN_KIND = "unknown kind"
    ATTEMPTS_EXHAUSTED = "attempts exhausted"  # reclaimed after its final attempt lapsed


@dataclass(frozen=True)
class Outcome:
    """What happened when a claimed job's handler ran. ``duration`` is in seconds."""

    job: ClaimedJob
    result: Result
    duration: float = 0.0
    error: str = ""
    traceback: str = ""


def execute(held: HeldJob, extend: Callable[[HeldJob], bool]) -> Outcome:
    """Run a held job's handler with its payload as keyword arguments; never raises.

    ``extend`` is what ``JobContext.heartbeat`` calls, for handlers that take a context.
    """
    job = held.job
    if job.attempts_exhausted:
        return Outcome(
            job,
            Result.ATTEMPTS_EXHAUSTED,
            error=f"the lease of attempt {job.max_attempts} of {job.max_attempts} lapsed "
            f"before it was acked (worker crashed, stalled or overran)",
        )
    definition = registry.get(job.kind)
    if definition is None:
        return Outcome(
            job,
            Result.UNKNOWN_KIND,
            error=f"no handler is registered for kind {job.kind!r} in this worker",
        )
    close_old_connections()
    started = held.started = time.monotonic()
    try:
        if definition.takes_context:
            definition.func(JobContext(held, extend), **job.payload)
        else:
            definition.func(**job.payload)
    except BaseException as exc:
        return Outcome(
            job,
            Result.FAILED,
            duration=time.monotonic() - started,
            error=f"{type(exc).__name__}: {exc}",
            traceback=traceback.format_exc(),
        )
    finally:
        close_old_connections()
    return Outcome(job, Result.SUCCEEDED, duration=time.monotonic() - started)


class ExecutorPool:
    """``size`` threads taking held jobs from one local queue.

    ``report`` is called (on the executor thread) with each outcome; ``extend`` backs
    ``JobContext.heartbeat``. Jobs submitted but not yet started can be taken back with
    :meth:`take_unstarted` (for release at shutdown).
    """

    def __init__(
        self,
        size: int,
        *,
        report: Callable[[Outcome], None],
        extend: Callable[[HeldJob], bool],
        name: str,
    ) -> None:
        self._jobs: queue.SimpleQueue[HeldJob | None] = queue.SimpleQueue()
        self._report = report
        self._extend = extend
        self._threads = [
            threading.Thread(target=self._run, name=f"{name}-executor-{n}", daemon=True)
            for n in range(size)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def submit(self, held: HeldJob) -> None:
        self._jobs.put(held)

    def take_unstarted(self) -> list[HeldJob]:
        """Remove and return the jobs no thread has started."""
        taken: list[HeldJob] = []
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                return taken
            if job is not None:
                taken.append(job)

    def stop(self, *, wait: bool = True) -> None:
        """Let every thread finish its current job, then end; ``wait`` joins them."""
        for _ in self._threads:
            self._jobs.put(None)
        if wait:
            for thread in self._threads:
                thread.join()

    def _run(self) -> None:
        try:
            while (held := self._jobs.get()) is not None:
                self._report(execute(held, self._extend))
        finally:
            connections.close_all()
