"""The watchdog: cuts a worker's connection whose statement hangs.

A silent network partition (a proxy or firewall that stops forwarding, a host that
vanished) leaves a connection whose socket is open and whose statement never returns: the
server's ``statement_timeout`` never reaches the server, and TCP keepalives see nothing
while a proxy keeps acknowledging. So the worker bounds its statements itself, with one
thread per worker: every :data:`POLL` seconds at most it looks at its connections
(:class:`~django_jobq.db.WatchedConnection`, which record since when they wait), and shuts
down the socket of one whose statement has been in flight longer than :attr:`Watchdog.bound`,
or past the deadline its worker gives (the shutdown deadline). The waiting thread then gets
``psycopg.OperationalError`` and goes through its usual reconnect path. The statements
themselves pay nothing but two attribute writes.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar

import psycopg

from ..db import shut_down

logger = logging.getLogger("django_jobq.worker")

W = TypeVar("W", bound="Watched")

#: The longest pause, in seconds, between two looks at the connections.
POLL = 0.25


class Watched(Protocol):
    """What the watchdog needs of a connection (or a block of statements) it watches."""

    @property
    def closed(self) -> bool: ...
    @property
    def in_flight_since(self) -> float | None: ...
    def cut(self) -> bool: ...


class _GuardedBlock:
    """Statements run on a connection the worker does not own (Django's, for the
    scheduler's enqueues), watched as one statement from the start of the block to its end:
    cutting it shuts that connection's socket down (``connection()`` returns it, or ``None``
    before Django connected)."""

    def __init__(self, connection: Callable[[], psycopg.Connection[Any] | None]) -> None:
        self._connection = connection
        self.in_flight_since: float | None = time.monotonic()
        self.closed = False

    def cut(self) -> bool:
        connection = self._connection()
        if self.closed or connection is None or connection.closed:
            return False
        return shut_down(connection)


class Watchdog:
    """Runs on a thread of its own from :meth:`start` to :meth:`stop`.

    Args:
        bound: seconds a statement may be in flight before its connection is cut.
        name: names the thread.
        deadline: returns the ``time.monotonic()`` seconds from which every statement in
            flight is cut (``math.inf``: none); called on the watchdog's thread at every look.
    """

    def __init__(
        self, *, bound: float, name: str, deadline: Callable[[], float] = lambda: math.inf
    ) -> None:
        self.bound = bound
        self._poll = min(POLL, bound / 4)
        self._connections: dict[int, tuple[Watched, str]] = {}
        self._lock = threading.Lock()
        self._deadline = deadline
        self._changed = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self.run, name=f"{name}-watchdog", daemon=True)
        self.cuts = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        self._changed.set()
        self._thread.join(timeout=1.0)

    def watch(self, connection: W, name: str) -> W:
        """Watch ``connection`` (a :class:`~django_jobq.db.WatchedConnection`; ``name`` is
        for the log) until it is closed; return it."""
        with self._lock:
            self._connections[id(connection)] = (connection, name)
        return connection

    @contextmanager
    def guard(
        self, name: str, connection: Callable[[], psycopg.Connection[Any] | None]
    ) -> Iterator[None]:
        """Watch the statements of the ``with`` block, which run on a connection the worker
        does not own (``connection()`` returns it when it exists), as one statement: past
        the bound or the deadline its socket is shut down and the block's statement fails
        with a database error."""
        block = _GuardedBlock(connection)
        self.watch(block, name)
        try:
            yield
        finally:
            block.in_flight_since = None
            block.closed = True

    def run(self) -> None:
        while not self._stopping:
            deadline = self._deadline()
            self.check(time.monotonic(), deadline)
            until_deadline = deadline - time.monotonic()
            timeout = self._poll if until_deadline <= 0 else min(self._poll, until_deadline)
            self._changed.wait(timeout)
            self._changed.clear()

    def check(self, now: float, deadline: float = math.inf) -> int:
        """Cut the connections whose statement is overdue at ``now`` (in flight longer than
        the bound, or at all from ``deadline`` on); return how many."""
        with self._lock:
            for key in [k for k, (c, _) in self._connections.items() if c.closed]:
                del self._connections[key]
            watched = list(self._connections.values())
        cut = 0
        for connection, name in watched:
            since = connection.in_flight_since
            if since is None or (now - since <= self.bound and now < deadline):
                continue
            if connection.cut():
                cut += 1
                logger.warning(
                    "%s: statement in flight for %.1f s, %s: connection cut",
                    name,
                    now - since,
                    "past the shutdown deadline" if now >= deadline else "too long",
                )
        self.cuts += cut
        return cut
