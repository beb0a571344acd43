"""Retry delays: how long a failed job waits before its next attempt.

A policy is any callable ``policy(attempt) -> seconds`` where ``attempt`` is the number of the
attempt that just failed (1 after the first run). Give one per kind with
``@job(backoff=...)``; the default is :class:`ExponentialBackoff` with ``JOBQ``'s
``RETRY_BACKOFF_BASE`` and ``RETRY_BACKOFF_CAP``.

The default formula is "equal jitter" from Marc Brooker, *Exponential Backoff And Jitter*
(AWS Architecture Blog, 2015)::

    d     = min(cap, base * 2 ** (attempt - 1))
    delay = uniform(d / 2, d)

so with base 2 s and cap 1 h the waits after attempts 1, 2, 3, … fall in [1, 2] s, [2, 4] s,
[4, 8] s, … and never exceed an hour. The exponential part gives a struggling dependency room
to recover; the jitter spreads out jobs that failed together (an outage) so their retries do
not arrive together; keeping at least half of ``d`` keeps the growth of the wait reliable.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from .conf import get_settings

#: A retry delay policy: attempt number that failed (1, 2, …) -> seconds to wait.
BackoffPolicy = Callable[[int], float]


@dataclass(frozen=True)
class ExponentialBackoff:
    """Exponential backoff with equal jitter and a cap (see the module docs).

    Args:
        base: seconds; the full delay ``d`` after the first failed attempt (> 0).
        cap: seconds; no delay exceeds it (>= base).
    """

    base: float = 2.0
    cap: float = 3600.0

    def __post_init__(self) -> None:
        if not self.base > 0 or not self.cap >= self.base:
            raise ValueError(f"need 0 < base <= cap, got base={self.base!r} cap={self.cap!r}.")

    def ceiling(self, attempt: int) -> float:
        """``d = min(cap, base * 2 ** (attempt - 1))``: the longest delay for ``attempt``."""
        # 2.0 ** 1000 is a finite float: a huge attempt number saturates instead of raising.
        return min(self.cap, self.base * 2.0 ** min(attempt - 1, 1000))

    def __call__(self, attempt: int) -> float:
        ceiling = self.ceiling(attempt)
        return random.uniform(ceiling / 2, ceiling)


@dataclass(frozen=True)
class FixedBackoff:
    """The same delay, in seconds, after every failed attempt."""

    delay: float

    def __post_init__(self) -> None:
        if not self.delay >= 0:
            raise ValueError(f"delay must be >= 0 seconds, got {self.delay!r}.")

    def __call__(self, attempt: int) -> float:
        return self.delay


def default_backoff() -> ExponentialBackoff:
    """The policy for kinds without ``@job(backoff=...)``, from the ``JOBQ`` setting."""
    config = get_settings()
    return ExponentialBackoff(base=config.RETRY_BACKOFF_BASE, cap=config.RETRY_BACKOFF_CAP)
