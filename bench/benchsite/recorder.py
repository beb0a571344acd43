"""Timestamps of handler starts, written without touching the database.

Every handler of every system calls :func:`record` first. It appends ``"<n> <ns>\\n"`` (the
job's number from its payload and ``time.monotonic_ns()``) to a file of the process's own,
``$JOBQ_BENCH_RECORD_DIR/<pid>.rec``, with one ``os.write`` on an ``O_APPEND`` descriptor:
one system call, no lock held across threads, no database write to distort what is measured.
``CLOCK_MONOTONIC`` is one clock for every process of the host, so the harness can subtract
the producer's commit times from these. :mod:`benchsite.pickup_trace` writes its events the
same way, to ``<pid>.trace``.
"""

from __future__ import annotations

import os
import threading
import time

_lock = threading.Lock()
_descriptors: dict[tuple[str, int], int] = {}  # (suffix, pid) -> descriptor


def _descriptor(suffix: str) -> int:
    pid = os.getpid()  # a forked child opens its own file
    fd = _descriptors.get((suffix, pid))
    if fd is None:
        with _lock:
            fd = _descriptors.get((suffix, pid))
            if fd is None:
                directory = os.environ["JOBQ_BENCH_RECORD_DIR"]
                path = os.path.join(directory, f"{pid}.{suffix}")
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                _descriptors[(suffix, pid)] = fd
    return fd


def record_line(line: bytes, *, suffix: str = "rec") -> None:
    """Append ``line`` to this process's ``<pid>.<suffix>`` file (one system call)."""
    os.write(_descriptor(suffix), line)


def record(n: int) -> None:
    """Record that the handler of job number ``n`` starts now."""
    record_line(b"%d %d\n" % (n, time.monotonic_ns()))
