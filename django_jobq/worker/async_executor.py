"""The event loop of async handlers: one per worker process, on a thread of its own, running
up to ``size`` async jobs side by side and reporting each one's :class:`Outcome`.

It has :class:`~.executor.ExecutorPool`'s interface (``start``, ``submit``,
``take_unstarted``, ``stop``), so the worker hands each claimed job to one or the other by
its kind's ``is_async``. Each job runs in an asyncio task of its own, with a fresh
``contextvars`` context (its tracing span, Django's async-safety state), through
:func:`~.executor.execute_async`: the verdict logic is the sync path's.

Django connections. Django's async ORM (``acreate``, ``aget``...) and ``sync_to_async``
with ``thread_sensitive=True`` run their queries on one thread per process, asgiref's
single sync thread, so every async job of the worker shares that thread's Django
connection (one connection per alias, not one per job). A job's connection hygiene is done
on that thread, and must not pull a connection from under another job that is using it (a
server-side cursor of ``aiterator()``, a session setting, a transaction opened through
``sync_to_async``). So, after each job (and before a job the loop runs alone):

- when no other async job is running, the thread gets what a handler thread gets between
  jobs: :func:`django_jobq.db.close_unusable_connections` (``CONN_MAX_AGE`` honoured, broken
  connections replaced);
- otherwise, only a connection that already failed (``errors_occurred``) and no longer works
  is closed, outside a transaction: it is broken for every job, and the next query opens a
  fresh one. ``CONN_MAX_AGE`` then waits for a quiet moment.

Shutdown: :meth:`AsyncExecutor.stop` lets the running jobs finish within its timeout, then
cancels those left (their outcomes are not recorded; their leases lapse), closes the sync
thread's connections and ends the loop.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
from collections import deque
from collections.abc import Callable

from asgiref.sync import sync_to_async
from django.db import connections

from .. import db
from ..outcomes import Outcome
from .executor import execute_async, undecided
from .held import HeldJob

logger = logging.getLogger("django_jobq.worker")

#: Seconds :meth:`AsyncExecutor.stop` gives cancelled jobs and the connections' closing.
CANCEL_TIMEOUT = 1.0


def _tidy_connections(*, alone: bool) -> None:
    """Connection hygiene on the thread the async ORM uses (see the module docs): all of
    it when ``alone`` (no other async job runs), else only closing failed, unusable
    connections outside a transaction."""
    if alone:
        db.close_unusable_connections()
        return
    for connection in connections.all(initialized_only=True):
        if (
            connection.connection is not None
            and connection.errors_occurred
            and not connection.in_atomic_block
            and not connection.is_usable()
        ):
            connection.close()


class AsyncExecutor:
    """An event loop on a thread of its own, running up to ``size`` held async jobs at once.

    ``report`` is called (on the loop's thread) with each outcome; ``extend`` backs
    ``JobContext.heartbeat``/``aheartbeat``. Jobs submitted beyond ``size`` wait, and those
    not yet started can be taken back with :meth:`take_unstarted` (for release at shutdown).
    The thread starts with :meth:`start`, or with the first :meth:`submit`.
    """

    def __init__(
        self,
        size: int,
        *,
        report: Callable[[Outcome], None],
        extend: Callable[[HeldJob], bool],
        name: str,
    ) -> None:
        self.size = size
        self._report = report
        self._extend = extend
        self._name = name
        self._waiting: deque[HeldJob] = deque()
        self._lock = threading.Lock()  # _waiting, _loop and _stopping
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._tasks: set[asyncio.Task[None]] = set()  # the loop's thread only

    def start(self) -> None:
        """Start the loop's thread (once; later calls do nothing)."""
        with self._lock:
            if self._loop is not None:
                return
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(
                target=self._run_loop, name=f"{self._name}-async", daemon=True
            )
            self._thread.start()

    def submit(self, held: HeldJob) -> None:
        """Run ``held`` on the loop as soon as fewer than ``size`` jobs run there."""
        self.start()
        with self._lock:
            self._waiting.append(held)
            loop = self._loop
        assert loop is not None
        loop.call_soon_threadsafe(self._dispatch)

    def take_unstarted(self) -> list[HeldJob]:
        """Remove and return the jobs the loop has not started."""
        with self._lock:
            taken = list(self._waiting)
            self._waiting.clear()
        return taken

    def stop(self, *, wait: bool = True, timeout: float | None = None) -> None:
        """Start no more jobs; let the running ones finish, then end the loop. ``wait``:
        wait for them, for ``timeout`` seconds at most (``None``: however long), then cancel
        those left; without ``wait``, cancel them at once (their leases lapse)."""
        with self._lock:
            self._stopping = True
            loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        finished = asyncio.run_coroutine_threadsafe(self._finish(timeout if wait else 0.0), loop)
        try:
            finished.result(None if timeout is None or not wait else timeout + CANCEL_TIMEOUT)
        except TimeoutError:
            logger.warning("worker %s: the async jobs' loop did not stop in time", self._name)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(CANCEL_TIMEOUT)

    def _run_loop(self) -> None:
        loop = self._loop
        assert loop is not None
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(loop.shutdown_default_executor())
            loop.close()

    def _dispatch(self) -> None:
        """Start waiting jobs while fewer than ``size`` run (on the loop's thread)."""
        while len(self._tasks) < self.size:
            with self._lock:
                if self._stopping or not self._waiting:
                    return
                held = self._waiting.popleft()
            # A fresh context: nothing of another job's (span, Django's state) leaks in.
            task = asyncio.get_running_loop().create_task(
                self._run(held), context=contextvars.Context()
            )
            self._tasks.add(task)
            task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._dispatch()

    async def _run(self, held: HeldJob) -> None:
        try:
            if len(self._tasks) == 1:
                await sync_to_async(_tidy_connections, thread_sensitive=True)(alone=True)
            outcome = await execute_async(held, self._extend)
        except Exception as exc:  # a bug here must not wedge the job or the loop
            outcome = undecided(held, exc)
        try:
            alone = len(self._tasks) == 1
            await sync_to_async(_tidy_connections, thread_sensitive=True)(alone=alone)
        except Exception:  # the verdict stands: a failed tidy must not turn it into a retry
            logger.exception("job %s: closing connections after it failed", held.job.id)
        held.finished = True
        self._report(outcome)

    async def _finish(self, timeout: float | None) -> None:
        """Wait ``timeout`` seconds at most for the running jobs, cancel the rest, and close
        the sync thread's connections."""
        if self._tasks and (timeout is None or timeout > 0):
            await asyncio.wait(set(self._tasks), timeout=timeout)
        left = set(self._tasks)
        for task in left:
            task.cancel()
        if left:
            logger.warning(
                "worker %s: cancelled %s async job(s) still running at shutdown",
                self._name,
                len(left),
            )
            await asyncio.wait(left, timeout=CANCEL_TIMEOUT)
        await sync_to_async(connections.close_all, thread_sensitive=True)()
