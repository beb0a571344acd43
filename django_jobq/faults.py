"""Test-only fault injection: a worker process SIGKILLs itself at a named crash point.

**Never set this in production.** The chaos suite (:mod:`django_jobq.chaos`, ``manage.py
jobq_chaos``) starts workers with the environment variable::

    JOBQ_TEST_CRASH_AT=after_handler:7

and that worker kills itself with SIGKILL the 7th time it reaches ``after_handler``: no
``finally``, no ``atexit``, no log flush, as if the machine lost power at that instant. The
variable is read once, when this module is imported. Without it, :func:`reached` returns at
once (one module-level bool check), so the call sites cost nothing measurable.

The crash points, in the order a job meets them (each call site says what holds there):

``before_claim``
    the worker is connected and a claim statement is next (not run, so not committed)
``after_claim``
    a claim committed leases on jobs that no handler has started (prefetched jobs)
``in_handler``
    inside a handler, after its external effect (the chaos handler's "email")
``after_handler``
    handlers returned; the ack statement that records them is next
``in_transaction``
    inside ``ctx.atomic()``, after the business write, before the ack and the commit
``after_ack``
    an ack committed (by the worker, or by ``ctx.atomic()``); logging and tallies follow

Raises:
    ValueError: on import, if ``JOBQ_TEST_CRASH_AT`` is set but is not ``point:count`` with a
        known point and a count >= 1 (a typo must not silently disable a crash test).
"""

from __future__ import annotations

import os
import signal
import threading

#: The environment variable that arms a crash. Test-only.
ENV_VAR = "JOBQ_TEST_CRASH_AT"

#: Every crash point, in the order a job meets them.
POINTS = (
    "before_claim",
    "after_claim",
    "in_handler",
    "after_handler",
    "in_transaction",
    "after_ack",
)


def parse(value: str) -> tuple[str, int]:
    """``"after_handler:7"`` -> ``("after_handler", 7)``.

    Raises:
        ValueError: not ``point:count`` with a point of :data:`POINTS` and a count >= 1.
    """
    point, _, count = value.partition(":")
    if point not in POINTS or not count.isdigit() or int(count) < 1:
        raise ValueError(
            f"{ENV_VAR}={value!r}: expected POINT:COUNT with COUNT >= 1 and POINT one of "
            f"{', '.join(POINTS)}."
        )
    return point, int(count)


_armed = parse(os.environ[ENV_VAR]) if os.environ.get(ENV_VAR) else None
#: True only in a process started with ``JOBQ_TEST_CRASH_AT``.
ENABLED = _armed is not None
_arrivals = 0
_lock = threading.Lock()


def reached(point: str) -> None:
    """Mark that this process reached ``point``; SIGKILL it if this is the armed arrival.

    A no-op unless ``JOBQ_TEST_CRASH_AT`` was set at import. Thread-safe: arrivals from the
    main loop and from handler threads are counted together.
    """
    if not ENABLED:
        return
    _arrive(point)


def _arrive(point: str) -> None:
    global _arrivals
    assert _armed is not None
    armed_point, count = _armed
    if point != armed_point:
        return
    with _lock:
        _arrivals += 1
        if _arrivals != count:
            return
        # One write(2), so the line is complete in the log even though nothing is flushed.
        os.write(2, f"jobq faults: SIGKILL at {point} (arrival {count})\n".encode())
        os.kill(os.getpid(), signal.SIGKILL)
