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

Before it listens, each connection is checked (:meth:`Listener._hears`): after ``LISTEN`` on
a channel of its own, another connection to the queue database sends a notification there,
which must arrive within :data:`CHECK_TIMEOUT` seconds. Behind a pooler in transaction mode
(PgBouncer's ``pool_mode = transaction``) it never does: each transaction may run on another
server connection, so a ``LISTEN`` ends with the transaction that ran it and the worker would
never be woken. Then the listener logs an error that says so and what to do (``--no-listen``,
or ``JOBQ['LISTEN_DATABASE']`` for a direct connection), closes its connection and stops: the
worker finds new jobs by polling. It does not stop the worker: a check that timed out on a
database too slow to deliver one notification in that time costs pickup latency, not jobs.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
import uuid
from collections.abc import Callable, Collection
from typing import Any

import psycopg

from .. import db, sql
from ..conf import get_settings
from .outage import OutageLog
from .timers import reconnect_delays
from .watchdog import Watchdog

logger = logging.getLogger("django_jobq.worker")

#: Seconds the check of a listener connection waits for its notification, from the moment
#: the notifying transaction committed. Paid in full only by a connection that cannot hear
#: (a healthy server delivers in milliseconds); generous, so a slow server passes.
CHECK_TIMEOUT = 5.0


class CannotHear(Exception):
    """The listener's connection received no notification of its check: it keeps no
    ``LISTEN`` across transactions (a pooler in transaction mode)."""


class Listener:
    """Runs :meth:`run` on a thread of its own; stop with :meth:`stop`.

    Args:
        queues: the worker's queues; ``None`` means every queue.
        wake: called (on the listener thread) with the served queues named when they get a
            job, and with ``None`` after each reconnection (jobs of any queue may have come
            meanwhile).
        worker_id: names the connection (``application_name``) and the thread.
        watchdog: cuts the connection if a statement on it hangs.
    """

    def __init__(
        self,
        *,
        queues: Collection[str] | None,
        wake: Callable[[frozenset[str] | None], None],
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
        #: Set when the check found that the connection hears no notifications: the listener
        #: has stopped, and the worker polls.
        self.cannot_hear = threading.Event()
        #: Set once a check found that the connection hears notifications: connections to
        #: ``JOBQ['LISTEN_DATABASE']`` keep session state (a ``LISTEN``) across transactions,
        #: so they reach PostgreSQL directly or through a pool in session mode.
        self.keeps_session_state = threading.Event()
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
            except CannotHear:
                self.cannot_hear.set()
                logger.error(
                    "worker %s: the listener's connection receives no notifications: a test "
                    "notification sent to the queue database did not arrive within %g s. A "
                    "connection pooler in transaction mode (PgBouncer's pool_mode = "
                    "transaction) keeps no LISTEN across transactions. The listener stops and "
                    "the worker finds new jobs by polling only (--poll-interval). Run the "
                    "worker with --no-listen, or set JOBQ['LISTEN_DATABASE'] to a DATABASES "
                    "alias that connects to PostgreSQL directly (or through a pool in session "
                    "mode); see docs/pgbouncer.md.",
                    self._worker_id,
                    CHECK_TIMEOUT,
                )
                return
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
        """Open the listener's connection (``JOBQ['LISTEN_DATABASE']``), check that it hears
        notifications, and ``LISTEN``.

        Raises:
            CannotHear: the connection receives no notifications.
            psycopg.Error: a connection fault.
        """
        name = f"jobq listener {self._worker_id}"
        connection = db.connect(application_name=name, alias=get_settings().LISTEN_DATABASE)
        if self._watchdog is not None:
            self._watchdog.watch(connection, name)
        try:
            if not self._hears(connection):
                raise CannotHear
            if not self._stopping.is_set():  # else _hears() returned without a verdict
                self.keeps_session_state.set()
            connection.execute(sql.wake.LISTEN_WAKE)
        except BaseException:
            connection.close()
            raise
        self.listening.set()
        self._failures.restored("worker %s: listener reconnected", self._worker_id)
        self._wake(None)  # whatever was enqueued while nobody listened
        return connection

    def _hears(self, connection: psycopg.Connection[Any]) -> bool:
        """Whether ``connection`` receives a notification sent after its ``LISTEN`` from
        another connection to the queue database (``JOBQ['DATABASE']``, the way enqueue's
        notifications travel), within :data:`CHECK_TIMEOUT` seconds of its commit. ``True``
        as well if the listener is stopped meanwhile (no verdict is needed).

        Raises:
            psycopg.Error: a connection fault.
        """
        payload = uuid.uuid4().hex
        connection.execute(sql.wake.LISTEN_CHECK)
        name = f"jobq listener check {self._worker_id}"
        with db.connect(application_name=name) as notifier:
            if self._watchdog is not None:
                self._watchdog.watch(notifier, name)
            notifier.execute(sql.wake.NOTIFY_CHECK, {"payload": payload})
        deadline = time.monotonic() + CHECK_TIMEOUT
        readable: list[int] = []
        while True:
            received = list(connection.notifies(timeout=0))  # what arrived, and any backlog
            if any(n.channel == sql.wake.CHECK_CHANNEL and n.payload == payload for n in received):
                heard = True
                break
            if readable and not received:
                # Readable but no notification (see _listen): the round trip raises if the
                # server closed the connection; what it brings is read on the next turn.
                connection.execute(sql.wake.PING)
                readable = []
                continue
            time_left = deadline - time.monotonic()
            if time_left <= 0:
                heard = False
                break
            readable, _, _ = select.select(
                [connection.fileno(), self._stop_read], [], [], time_left
            )
            if self._stop_read in readable:
                return True
        connection.execute(sql.wake.UNLISTEN_CHECK)
        return heard

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
                named = frozenset(notified)
                self._wake(named if self._queues is None else named & self._queues)

    def _wait_for_stop(self, seconds: float) -> None:
        select.select([self._stop_read], [], [], seconds)
