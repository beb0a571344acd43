"""The listener: wakes the worker as soon as a job is enqueued.

An autocommit connection of its own runs ``LISTEN`` on ``sql.wake.WAKE_CHANNEL``. Enqueue
sends one notification per queue at commit (``sql.enqueue.INSERT_JOBS``); when it names a
queue this worker serves, ``wake()`` is called and the worker claims at once instead of
sleeping out its poll interval.

The worker's main loop waits on the connection's socket itself, beside its other wake-ups
(:meth:`Listener.wait`, :class:`.wakeup.Wakeup`), and reads the notifications as they
arrive: a job's pickup does not wait for another thread to be scheduled to pass them on.
The listener's thread does the rest, which may block: it opens the connection, checks it,
runs ``LISTEN``, then hands the connection to the loop and waits (:meth:`Listener._serve`).
When the socket is readable but brings no notification (most likely the server closed the
connection), the loop hands the connection back and the thread runs a round trip on it.

If the connection is lost (``pg_terminate_backend``, a server restart, a network cut) the
listener reconnects with exponential backoff (:func:`.timers.reconnect_delays`), listens
again and calls ``wake()``: jobs enqueued while it was away were announced to nobody, so
the worker claims them right away (so it does after each round trip on a connection handed
back). Meanwhile the worker still polls at its poll interval; no
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
import math
import os
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Collection
from typing import Any

import psycopg

from .. import db, sql
from ..conf import get_settings
from .outage import OutageLog
from .timers import reconnect_delays
from .wakeup import Wakeup, close_all, readable
from .watchdog import Watchdog

logger = logging.getLogger("django_jobq.worker")

#: Seconds the check of a listener connection waits for its notification, from the moment
#: the notifying transaction committed. Paid in full only by a connection that cannot hear
#: (a healthy server delivers in milliseconds); generous, so a slow server passes.
CHECK_TIMEOUT = 5.0

#: Seconds between the listener thread's looks at the socket while the loop is busy (not in
#: :meth:`Listener.wait`): it reads what waits there itself (``wake()`` then wakes the loop
#: for the turn after), so a long turn or a reconnect of the loop's own connection never
#: leaves notifications unread long enough to fill the socket's buffers. A server whose
#: send to a full socket blocks holds its backend's snapshot meanwhile: VACUUM could then
#: remove no dead row anywhere in the cluster.
DRAIN_INTERVAL = 0.5


class CannotHear(Exception):
    """The listener's connection received no notification of its check: it keeps no
    ``LISTEN`` across transactions (a pooler in transaction mode)."""


class Listener:
    """Runs its connection's life on a thread of its own (:meth:`start`, :meth:`stop`);
    whoever waits for its notifications calls :meth:`wait` (the worker's main loop).

    Args:
        queues: the worker's queues; ``None`` means every queue.
        wake: called with the served queues named when they get a job (on the thread in
            :meth:`wait`), and with ``None`` each time the thread hands a connection over
            (on the listener's thread: jobs of any queue may have come meanwhile).
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
        # Written by wait() when it hands the connection back (see _serve).
        self._back_read, self._back_write = os.pipe()
        # Closes the pipes: in stop() once the thread has ended, else once collected.
        self._close_pipes = weakref.finalize(
            self, close_all, self._stop_read, self._stop_write, self._back_read, self._back_write
        )
        self._close_pipes.atexit = False  # a daemon thread may still use them
        # The connection handed to wait(), or None while the thread has it.
        self._ready: psycopg.Connection[Any] | None = None
        # Held by whoever reads the handed-over connection: wait() (the loop) for its whole
        # wait, the thread for a look while the loop is busy (see _serve).
        self._reading = threading.Lock()
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
            self._close_pipes()

    def wait(self, timeout: float | None) -> bool:
        """Wait until the wakeup is set or a notification names a served queue, ``timeout``
        seconds at most (``None`` or ``math.inf``: however long; 0 or less: look only):
        read the notifications that arrive meanwhile and call ``wake()`` with the served
        queues they name (those of other queues are read and dropped).

        Returns:
            Whether the wakeup was set or ``wake()`` called before the timeout.
        """
        deadline = None if timeout is None or timeout == math.inf else time.monotonic() + timeout
        with self._reading:
            return self._wait_until(deadline)

    def _wait_until(self, deadline: float | None) -> bool:
        """:meth:`wait` until ``deadline`` (``time.monotonic()``; ``None``: however long),
        holding ``_reading``."""
        while True:
            connection, socket = self._handed_over()
            time_left = None if deadline is None else deadline - time.monotonic()
            woken, arrived = self._wakeup.wait(time_left, also=socket)
            # Read what arrived even when the wakeup ended the wait: the next turn then
            # knows of the job (and claims it before it records outcomes).
            if arrived and connection is not None and self._read(connection):
                return True
            if woken:
                return True
            if not arrived or (deadline is not None and time.monotonic() >= deadline):
                return False  # the timeout passed

    def read_waiting(self, *, blocking: bool = True) -> None:
        """Read the notifications waiting on the socket, without waiting for more: ``wake()``
        is called if they name a served queue (for a turn about to decide what comes first,
        whatever ended the wait before it). With ``blocking=False``, nothing is read while
        another reader (the loop's :meth:`wait`) holds the socket."""
        if not self._reading.acquire(blocking=blocking):
            return
        try:
            connection, socket = self._handed_over()
            if connection is not None and socket is not None and readable([socket], 0):
                self._read(connection)
        finally:
            self._reading.release()

    def _handed_over(self) -> tuple[psycopg.Connection[Any] | None, int | None]:
        """The connection handed to :meth:`wait` and its socket; ``(None, None)`` while the
        listener's thread has it, or once it is closed (``_serve()`` is ending)."""
        connection = self._ready
        if connection is None:
            return None, None
        try:
            return connection, connection.fileno()
        except psycopg.Error:
            return None, None

    def _read(self, connection: psycopg.Connection[Any]) -> bool:
        """Read the notifications that arrived on ``connection`` (readable); call
        ``wake()`` and return ``True`` if they name a served queue. A socket readable with
        nothing to read (most likely the server closed the connection), or a fault, hands
        the connection back to the listener's thread, whose round trip finds out whether it
        still works (see :meth:`_serve`)."""
        try:
            received = list(connection.notifies(timeout=0))
        except psycopg.Error:
            received = []  # the thread's round trip raises it again, and reconnects
        if not received:
            self._ready = None
            os.write(self._back_write, b"x")
            return False
        named = frozenset(n.payload for n in received if n.channel == sql.wake.WAKE_CHANNEL)
        if self._queues is not None:
            named &= self._queues
        if not named:
            return False
        self._wake(named)
        return True

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
        arrived: set[int] = set()
        while True:
            received = list(connection.notifies(timeout=0))  # what arrived, and any backlog
            if any(n.channel == sql.wake.CHECK_CHANNEL and n.payload == payload for n in received):
                heard = True
                break
            if arrived and not received:
                # Readable but no notification (see Listener._read): the round trip raises if
                # the server closed the connection; what it brings is read on the next turn.
                connection.execute(sql.wake.PING)
                arrived = set()
                continue
            time_left = deadline - time.monotonic()
            if time_left <= 0:
                heard = False
                break
            arrived = readable([connection.fileno(), self._stop_read], time_left)
            if self._stop_read in arrived:
                return True
        connection.execute(sql.wake.UNLISTEN_CHECK)
        return heard

    def _serve(self, connection: psycopg.Connection[Any]) -> None:
        """Hand ``connection`` to :meth:`wait` (and end a wait under way, which then watches
        it) and call ``wake()`` (whatever was enqueued while nobody listened, or while the
        connection was handed back: notifications read by the round trip wait in psycopg,
        not on the socket); each time :meth:`wait` hands it back, a round trip on it
        (``sql.wake.PING``) raises ``psycopg.Error`` if it is broken, else it is handed on
        again. Every :data:`DRAIN_INTERVAL` seconds meanwhile, if the loop is not waiting,
        reads what waits on the socket itself. Returns when stopped."""
        try:
            while True:
                self._ready = connection
                self._wakeup.set()
                self._wake(None)
                while not (woke := readable([self._back_read, self._stop_read], DRAIN_INTERVAL)):
                    self.read_waiting(blocking=False)  # unless the loop is waiting on it
                if self._stop_read in woke:
                    return
                os.read(self._back_read, 512)
                connection.execute(sql.wake.PING)
        finally:
            self._ready = None

    def _wait_for_stop(self, seconds: float) -> None:
        readable([self._stop_read], seconds)
