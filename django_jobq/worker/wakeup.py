"""The main loop's wake-up: an event it waits on together with a socket.

The worker's main loop sleeps between turns until something needs it: an outcome to
record, a stop, a reconnected listener, or a notification that a job was enqueued. The
notification arrives on the listener's socket, and the loop waits on that socket itself
(:meth:`Wakeup.wait` with ``also=``), so a job's pickup does not wait for another thread to
be scheduled and pass it on. Everything else sets the :class:`Wakeup` from its own thread:
a pipe whose read end the loop's wait watches beside the socket (the self-pipe pattern of
``asyncio`` and ``selectors``), since a ``threading.Event`` cannot be waited on together
with a file descriptor.
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import weakref
from collections.abc import Iterable


def readable(fds: Iterable[int], timeout: float | None) -> set[int]:
    """The file descriptors of ``fds`` that are readable (or closed, or in error) within
    ``timeout`` seconds (``None`` or ``math.inf``: however long; 0 or less: look only).
    ``poll``, not ``select``: a descriptor numbered past 1,023 is fine."""
    poll = select.poll()
    for fd in fds:
        poll.register(fd, select.POLLIN)
    if timeout is None or timeout == math.inf:
        return {fd for fd, _ in poll.poll()}
    return {fd for fd, _ in poll.poll(max(0.0, timeout) * 1000)}


class Wakeup:
    """Like ``threading.Event`` for one waiter, whose :meth:`wait` also returns when a
    given file descriptor is readable. Its pipe is closed when it is garbage collected
    (once nothing refers to it, no thread can still :meth:`set` it), not at interpreter
    exit, when a daemon thread may still set it.

    :meth:`set` takes no lock, so it is safe from a signal handler on the waiting thread
    too. The waiter's protocol: :meth:`clear`, then look at what it waits for, then
    :meth:`wait`; a :meth:`set` that comes before the :meth:`clear` returns has made its
    change visible to that look, and one after it writes to the pipe, which ends the wait.
    """

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self._set = False
        weakref.finalize(self, close_all, self._read, self._write).atexit = False

    def set(self) -> None:
        """Wake the waiter (now, or its next :meth:`wait` returns at once)."""
        if not self._set:
            self._set = True
            with contextlib.suppress(BlockingIOError):  # the pipe is full of wake-ups
                os.write(self._write, b"\0")

    def is_set(self) -> bool:
        """Whether :meth:`set` was called since the last :meth:`clear`."""
        return self._set

    def clear(self) -> None:
        """Forget the wake-ups so far: empty the pipe, then mark the event unset."""
        with contextlib.suppress(BlockingIOError):
            while os.read(self._read, 512):
                pass
        self._set = False

    def wait(self, timeout: float | None, *, also: int | None = None) -> tuple[bool, bool]:
        """Wait until the event is set or the file descriptor ``also`` is readable, at
        most ``timeout`` seconds (``None`` or ``math.inf``: however long; 0 or less: look
        only, do not wait).

        Returns:
            ``(set, readable)``: whether the event is set, and whether ``also`` is
            readable; both ``False`` when the timeout passed.
        """
        ready = readable([self._read] if also is None else [self._read, also], timeout)
        return self._set or self._read in ready, also is not None and also in ready


def close_all(*fds: int) -> None:
    """Close the file descriptors ``fds``."""
    for fd in fds:
        os.close(fd)
