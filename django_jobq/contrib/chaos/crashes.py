"""Test-only fault injection: a worker process SIGKILLs itself at a named crash point.

**Never set this in production.** The chaos run (``manage.py jobq_chaos``) starts workers
with the environment variable::

    JOBQ_TEST_CRASH_AT=after_handler:7

and that worker kills itself with SIGKILL the 7th time it reaches ``after_handler``: no
``finally``, no ``atexit``, no log flush, as if the machine lost power at that instant. The
chaos app's ``ready()`` reads the variable once (:func:`arm_from_environment`) and arms the
core's crash points (:mod:`django_jobq.crash_points`, which names them) with a
:class:`Crash`. Without the variable nothing is armed.
"""

from __future__ import annotations

import os
import signal
import threading

from django.core.exceptions import ImproperlyConfigured

from ... import crash_points


def parse(value: str) -> tuple[str, int]:
    """``"after_handler:7"`` -> ``("after_handler", 7)``.

    Raises:
        ValueError: not ``point:count`` with a point of :data:`~django_jobq.crash_points.POINTS`
            and a count >= 1.
    """
    point, _, count = value.partition(":")
    if point not in crash_points.POINTS or not count.isdigit() or int(count) < 1:
        raise ValueError(
            f"{crash_points.ENV_VAR}={value!r}: expected POINT:COUNT with COUNT >= 1 and POINT "
            f"one of {', '.join(crash_points.POINTS)}."
        )
    return point, int(count)


class Crash:
    """SIGKILL this process at its ``arrival``-th pass through crash point ``point``.

    Thread-safe: passes from the main loop and from handler threads are counted together.
    """

    def __init__(self, point: str, arrival: int) -> None:
        self.point = point
        self.arrival = arrival
        self._arrivals = 0
        self._lock = threading.Lock()

    def __call__(self, point: str) -> None:
        """Count a pass through ``point``; at the armed arrival of the armed point, write one
        line to stderr and SIGKILL the process (this call then never returns)."""
        if point != self.point:
            return
        with self._lock:
            self._arrivals += 1
            if self._arrivals != self.arrival:
                return
            # One write(2), so the line is complete in the log even though nothing is flushed.
            os.write(2, f"jobq crash point: SIGKILL at {point} (arrival {self.arrival})\n".encode())
            os.kill(os.getpid(), signal.SIGKILL)


def arm_from_environment() -> None:
    """Arm the crash points if ``JOBQ_TEST_CRASH_AT`` is set (and not empty).

    Raises:
        ImproperlyConfigured: the value is not ``POINT:COUNT`` with a known point and a count
            >= 1: a typo must not silently disable a crash test.
    """
    value = os.environ.get(crash_points.ENV_VAR)
    if not value:
        return
    try:
        point, arrival = parse(value)
    except ValueError as exc:
        raise ImproperlyConfigured(str(exc)) from None
    crash_points.arm(Crash(point, arrival))
