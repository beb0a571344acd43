"""Crash points: the named instants in a job's life at which a crash test kills the worker.

The worker's code marks each one with a check of a module attribute::

    if crash_points.reach is not None:
        crash_points.reach("after_claim")

:data:`reach` is ``None`` in every process but one started with the test-only environment
variable ``JOBQ_TEST_CRASH_AT`` in a project that installs the opt-in chaos app
(``django_jobq.contrib.chaos``, docs/chaos.md): that app's ``ready()`` arms it (:func:`arm`)
with the function that SIGKILLs the process at the armed arrival. Elsewhere a crash point is
that one check, and nothing of the chaos app is imported. The variable set in a project
without the app is system check ``django_jobq.E019``, so a crash test cannot silently test
nothing.

The crash points, in the order a job meets them (each call site says what holds there):

``before_claim``
    the worker is connected and a claim statement is next (not run, so not committed)
``after_claim``
    a claim committed leases on jobs that no handler has started (prefetched jobs)
``in_handler``
    inside a handler, after its external effect (the chaos app's handler's "email")
``after_handler``
    handlers returned; the ack statement that records them is next
``in_transaction``
    inside ``ctx.atomic()``, after the business write, before the ack and the commit
``after_ack``
    an ack committed (by the worker, or by ``ctx.atomic()``); logging and counts follow
"""

from __future__ import annotations

from collections.abc import Callable

#: The environment variable that arms a crash (``POINT:COUNT``). Test-only.
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

#: Called with a crash point's name each time a thread of this process reaches it, or
#: ``None`` (no crash armed: the default, and always so without the chaos app).
reach: Callable[[str], None] | None = None


def arm(hook: Callable[[str], None]) -> None:
    """Make every crash point of this process call ``hook(point)`` from now on.

    Test-only: the chaos app calls it at start-up when ``JOBQ_TEST_CRASH_AT`` is set.
    ``hook`` is called from the main loop and from handler threads alike.

    Raises:
        RuntimeError: the crash points are armed already.
    """
    global reach
    if reach is not None:
        raise RuntimeError("the crash points are armed already.")
    reach = hook
