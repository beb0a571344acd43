"""The worker's timing: deadlines that come round, and delays that double.

:class:`Every` times the periodic chores of the worker's main loop (the registration beat,
the rollup flush, the queue sample, the maintenance round and the unknown-kind sweep) and
the fewest seconds between two warnings of :class:`.outage.OutageLog`. :func:`doubling`
spaces out tries that fail: reconnections (:func:`reconnect_delays`, the main loop's and
the listener's) and the writes of rows another transaction had locked (the main loop's).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator

#: Seconds before a worker connection's first reconnection attempt, and the most between
#: two: the wait doubles from the first to the most.
RECONNECT_DELAYS = (0.1, 5.0)
#: The fraction of each reconnection delay cut at random, so that workers cut off together
#: do not reconnect in lockstep.
RECONNECT_JITTER = 0.1


def doubling(first: float, most: float, *, jitter: float = 0.0) -> Iterator[float]:
    """Seconds to wait before each try of a series: ``first``, doubling up to ``most``,
    each cut at random by up to ``jitter`` of itself (a fraction: 0.1 is 10 %)."""
    delay = first
    while True:
        yield delay * random.uniform(1.0 - jitter, 1.0) if jitter else delay
        delay = min(delay * 2, most)


def reconnect_delays() -> Iterator[float]:
    """Seconds to wait before each reconnection attempt of a worker connection
    (:data:`RECONNECT_DELAYS`, :data:`RECONNECT_JITTER`); a new series for each outage."""
    return doubling(*RECONNECT_DELAYS, jitter=RECONNECT_JITTER)


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
