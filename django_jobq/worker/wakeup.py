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


class Wakeup:
    """Like ``threading.Event`` for one waiter, whose :meth:`wait` also returns when a
    given file descriptor is readable. Its pipe is closed when it is garbage collected:
    once nothing refers to it, no thread can still :meth:`set` it.

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
        weakref.finalize(self, _close, self._read, self._write)

    def set(self) -> None:
        """Wake the waiter (now, or its next :meth:`wait` returns at once)."""
        if not self._set:
            self._set = True
            with contextlib.suppress(BlockingIOError):  # the pipe is full of wake-ups
                os.write(self._write, b"\0")

    def is_set(self) -> bool:
        return self._set

    def clear(self) -> None:
        """Forget the wake-ups so far: empty the pipe, then mark the event unset."""
        with contextlib.suppress(BlockingIOError):
            while os.read(self._read, 512):
                pass
        self._set = False

    def wait(self, timeout: float | None, *, also: int | None = None) -> tuple[bool, bool]:
        """Wait until the event is set or the file descriptor ``also`` is readable, at
        most ``timeout`` seconds (``None`` or ``math.inf``: however long).

        Returns:
            ``(set, readable)``: whether the event is set, and whether ``also`` is
            readable; both ``False`` when the timeout passed.
        """
        poll = select.poll()
        poll.register(self._read, select.POLLIN)
        if also is not None:
            poll.register(also, select.POLLIN)
        milliseconds = None if timeout is None or timeout == math.inf else timeout * 1000
        ready = {fd for fd, _ in poll.poll(milliseconds)}
        return self._set or self._read in ready, also is not None and also in ready


def _close(*fds: int) -> None:
    for fd in fds:
        os.close(fd)
