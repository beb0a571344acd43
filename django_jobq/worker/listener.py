"""The listener: wakes the worker as soon as a job is enqueued.

An autocommit connection of its own runs ``LISTEN`` on ``sql.wake.WAKE_CHANNEL``. Enqueue
sends one notification per queue at commit (``sql.enqueue.INSERT_JOBS``); when it names a
queue this worker serves, ``wake()`` is called and the worker claims at once instead of
sleeping out its poll interval.

The worker's main loop waits on the connection's socket itself, beside its other wake-ups
(:meth:`Listener.wait`, :class:`.wakeup.Wakeup`), and reads the notifications as they
arrive: a job's pickup does not wait for another thread to be scheduled to pass them on.
The listener's thread does the rest, which may block: it opens the connection, checks it,
runs ``LISTEN``, then hands the connection to the loop (:meth:`Listener.fileno`) and waits.
When the socket is readable but brings no notification (most likely the server closed the
connection), the loop hands the connection back and the thread runs a round trip on it.

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
from .wakeup import Wakeup
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
    """Runs its connection's life on a thread of its own (:meth:`start`, :meth:`stop`);
    whoever waits for its notifications calls :meth:`wait` (the worker's main loop).

    Args:
        queues: the worker's queues; ``None`` means every queue.
        wake: called with the served queues named when they get a job (on the thread in
            :meth:`wait`), and with ``None`` after each connection is ready (on the
            listener's thread: jobs of any queue may have come meanwhile).
        wakeup: what the thread in :meth:`wait` waits on beside the socket; set when a
            connection is handed over, so that a wait under way starts watching it.
        worker_id: names the connection (``application_name``) and the thread.
        watchdog: cuts the connection if a statement on it hangs.
    """

    def __init__(
        self,
        *,
        queues: Collection[str] | None,
        wake: Callable[[frozenset[str] | None], None],
        wakeup: Wakeup,
        worker_id: str,
        watchdog: Watchdog | None = None,
    ) -> None:
        self._queues = frozenset(queues) if queues else None
        self._wakeup = wakeup
        self._watchdog = watchdog
        self._failures = OutageLog()
        self._wake = wake
        self._worker_id = worker_id
        self._stopping = threading.Event()
        # A self-pipe: stop() writes to it so the thread's waits return at once.
        self._stop_read, self._stop_write = os.pipe()
        # Written by wait() when it hands the connection back (see _handed_back).
        self._back_read, self._back_write = os.pipe()
        # The connection handed to wait(), or None while the thread has it.
        self._ready: psycopg.Connection[Any] | None = None
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
        seconds at most (it may be opening a connection). Call it from the thread that
        calls :meth:`wait`, or once no thread does."""
        self._stopping.set()
        self._ready = None
        os.write(self._stop_write, b"x")
        self._thread.join(timeout)
        if not self._thread.is_alive():  # else the pipes stay open for it (a daemon thread)
            for fd in (self._stop_read, self._stop_write, self._back_read, self._back_write):
                os.close(fd)

    def fileno(self) -> int | None:
        """The socket of the connection :meth:`wait` reads; ``None`` while the listener's
        thread has the connection (opening, checking or reconnecting it) or has stopped."""
        ready = self._ready
        return None if ready is None else ready.fileno()

    def wait(self, timeout: float | None) -> bool:
        """Wait until the wakeup is set or notifications arrive, ``timeout`` seconds at most
        (``None`` or ``math.inf``: however long); call ``wake()`` with the served queues
        they name. A connection whose socket is readable but brings no notification is
        handed back to the listener's thread, which finds out whether it still works.

        Returns:
            Whether anything woke the caller before the timeout: the wakeup, or a
            notification (of any queue; one of no served queue calls no ``wake()``).
        """
        connection = self._ready
        woken, readable = self._wakeup.wait(
            timeout, also=None if connection is None else connection.fileno()
        )
        if readable and connection is not None:
            try:
                notified = [n.payload for n in connection.notifies(timeout=0)]
            except psycopg.Error:
                notified = []  # the thread's round trip raises it again, and reconnects
            if not notified:
                self._hand_back()
            elif self._queues is None or not self._queues.isdisjoint(notified):
                named = frozenset(notified)
                self._wake(named if self._queues is None else named & self._queues)
            return True
        return woken

    def _hand_back(self) -> None:
        """Give the connection back to the listener's thread (see :meth:`_serve`)."""
        self._ready = None
        os.write(self._back_write, b"x")

    def run(self) -> None:
        delays = reconnect_delays()
        while not self._stopping.is_set():
            try:
                with self._connect() as connection:
                    delays = reconnect_delays()  # connected: the next outage starts afresh
                    self._serve(connection)
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
                # Readable but no notification (see Listener.wait): the round trip raises if
                # the server closed the connection; what it brings is read on the next turn.
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

    def _serve(self, connection: psycopg.Connection[Any]) -> None:
        """Hand ``connection`` to :meth:`wait` (and end a wait under way, which then watches
        it) and call ``wake()`` (whatever was enqueued while nobody listened); each time
        :meth:`wait` hands it back, a round trip on it (``sql.wake.PING``) raises
        ``psycopg.Error`` if it is broken, else it is handed on again. Returns when
        stopped."""
        while True:
            self._ready = connection
            self._wakeup.set()
            self._wake(None)
            readable, _, _ = select.select([self._back_read, self._stop_read], [], [])
            if self._stop_read in readable:
                self._ready = None
                return
            os.read(self._back_read, 512)
            connection.execute(sql.wake.PING)

    def _wait_for_stop(self, seconds: float) -> None:
        select.select([self._stop_read], [], [], seconds)
