"""The worker's periodic chores' timing: :class:`Every`, a deadline that comes round.

Used from the worker's main loop (the registration beat, the rollup flush, the queue sample,
the maintenance round and the unknown-kind sweep) and by :class:`.outage.OutageLog` (the
fewest seconds between two warnings).
"""

from __future__ import annotations

import time
from collections.abc import Callable


class Every:
    """A deadline that comes round every ``interval`` seconds, on ``clock`` (seconds of
    ``time.monotonic()``; tests pass a simulated one). Due at once when made.

    :attr:`interval` may be changed between two looks; it applies from the next time the
    deadline comes round. Not thread-safe: its user holds a lock if threads share it.
    """

    def __init__(self, interval: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self._clock = clock
        self._next = clock()

    def due(self) -> bool:
        """Whether the deadline has come; if so, the next one is ``interval`` seconds from
        now."""
        now = self._clock()
        if now < self._next:
            return False
        self._next = now + self.interval
        return True

    def restart(self) -> None:
        """Count the chore as done now: the next deadline is ``interval`` seconds away."""
        self._next = self._clock() + self.interval

    def seconds_left(self) -> float:
        """Seconds until the deadline (0 once it has come)."""
        return max(self._next - self._clock(), 0.0)
