"""Timestamps of handler starts, written without touching the database.

Every handler of every system calls :func:`record` first. It appends ``"<n> <ns>\\n"`` (the
job's number from its payload and ``time.monotonic_ns()``) to a file of the process's own,
``$JOBQ_BENCH_RECORD_DIR/<pid>.rec``, with one ``os.write`` on an ``O_APPEND`` descriptor:
one system call, no lock held across threads, no database write to distort what is measured.
``CLOCK_MONOTONIC`` is one clock for every process of the host, so the harness can subtract
the producer's commit times from these.
"""

from __future__ import annotations

import os
import threading
import time

_lock = threading.Lock()
_fd: int | None = None
_fd_pid = 0


def _descriptor() -> int:
    global _fd, _fd_pid
    pid = os.getpid()
    if _fd is None or _fd_pid != pid:  # first call, or a forked child
        with _lock:
            if _fd is None or _fd_pid != pid:
                directory = os.environ["JOBQ_BENCH_RECORD_DIR"]
                path = os.path.join(directory, f"{pid}.rec")
                _fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                _fd_pid = pid
    return _fd


def record(n: int) -> None:
    """Record that the handler of job number ``n`` starts now."""
    now = time.monotonic_ns()
    os.write(_descriptor(), b"%d %d\n" % (n, now))
