"""The listener: wakes the worker as soon as a job is enqueued.

A thread with its own autocommit connection that runs ``LISTEN`` on ``sql.wake.WAKE_CHANNEL``.
Enqueue sends one notification per queue at commit (``sql.enqueue.INSERT_JOBS``); when it names a
queue this worker serves, the listener calls ``wake()`` and the worker claims at once instead
of sleeping out its poll interval.

If the connection is lost (``pg_terminate_backend``, a server restart, a network cut) the
listener reconnects with exponential backoff (:func:`.timers.reconnect_delays`), listens
again and calls ``wake()`` once: jobs enqueued while it was away were announced to nobody,
so the worker claims them right away. Meanwhile the worker still polls at its poll interval; no
job waits on the listener.
"""

from __future__ import annotations

import os
import select
import threading
from collections.abc import Callable, Collection
from typing import Any

import psycopg

from .. import db, sql
from .outage import OutageLog
from .timers import reconnect_delays
from .watchdog import Watchdog


class Listener:
    """Runs :meth:`run` on a thread of its own; stop with :meth:`stop`.

    Args:
        queues: the worker's queues; ``None`` means every queue.
        wake: called (on the listener thread) when a served queue gets a job, and after
            each reconnection.
        worker_id: names the connection (``application_name``) and the thread.
        watchdog: cuts the connection if a statement on it hangs.
    """

    def __init__(
        self,
        *,
        queues: Collection[str] | None,
        wake: Callable[[], None],
        worker_id: str,
        watchdog: Watchdog | None = None,
    ) -> None:
        self._queues = frozenset(queues) if queues else None
        self._watchdog = watchdog
        self._failures = OutageLog()
        self._wake = wake
        self._worker_id = worker_id
        self._stopping = threading.Event()
        # A self-pipe: stop() writes to it so the select() in run() returns at once.
        self._stop_read, self._stop_write = os.pipe()
        self._thread = threading.Thread(target=self.run, name=f"{worker_id}-listener", daemon=True)
        self.listening = threading.Event()  # set while a LISTEN connection is up
        self.reconnects = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 1.0) -> None:
        """Stop listening, close the connection and wait for the thread, ``timeout``
        seconds at most (it may be opening a connection)."""
        self._stopping.set()
        os.write(self._stop_write, b"x")
        self._thread.join(timeout)
        if not self._thread.is_alive():  # else the pipe stays open for it (a daemon thread)
            os.close(self._stop_read)
            os.close(self._stop_write)

    def run(self) -> None:
        delays = reconnect_delays()
        while not self._stopping.is_set():
            try:
                with self._connect() as connection:
                    delays = reconnect_delays()  # connected: the next outage starts afresh
                    self._listen(connection)
            except psycopg.Error as exc:
                self.listening.clear()
                if self._stopping.is_set():
                    return
                delay = next(delays)
                self._failures.failed(
                    "worker %s: listener connection lost, reconnecting in %.2g s: %s",
                    self._worker_id,
                    delay,
                    exc,
                )
                self._wait_for_stop(delay)
                self.reconnects += 1

    def _connect(self) -> psycopg.Connection[Any]:
        name = f"jobq listener {self._worker_id}"
        connection = db.connect(application_name=name)
        if self._watchdog is not None:
            self._watchdog.watch(connection, name)
        try:
            connection.execute(sql.wake.LISTEN_WAKE)
        except BaseException:
            connection.close()
            raise
        self.listening.set()
        self._failures.restored("worker %s: listener reconnected", self._worker_id)
        self._wake()  # whatever was enqueued while nobody listened
        return connection

    def _listen(self, connection: psycopg.Connection[Any]) -> None:
        """Wait for notifications until stopped; raise ``psycopg.Error`` if the connection
        breaks."""
        while not self._stopping.is_set():
            readable, _, _ = select.select([connection.fileno(), self._stop_read], [], [])
            if self._stop_read in readable:
                return
            notified = [n.payload for n in connection.notifies(timeout=0)]
            if not notified:
                # Readable but no notification: most likely the server closed the connection.
                # A round trip turns that into an error (and is harmless otherwise).
                connection.execute(sql.wake.PING)
            elif self._queues is None or not self._queues.isdisjoint(notified):
                self._wake()

    def _wait_for_stop(self, seconds: float) -> None:
        select.select([self._stop_read], [], [], seconds)
