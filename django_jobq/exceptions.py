"""Exceptions a handler raises to steer its job.

::

    from django_jobq.exceptions import Fail, Retry

    @job
    def charge(order_id: int) -> None:
        try:
            gateway.charge(order_id)
        except RateLimited as exc:
            raise Retry(delay=exc.retry_after) from exc     # wait as long as the API asks
        except CardDeclined as exc:
            raise Fail(f"card declined: {exc.code}") from exc  # retrying cannot help
"""

from __future__ import annotations

from .conf import MAX_DURATION


class Retry(Exception):
    """Retry this job after ``delay`` seconds instead of the backoff policy's delay.

    The attempt still counts: on the final attempt the job becomes a dead letter
    ("max attempts exceeded") like any other failure.
    """

    def __init__(self, delay: float | None = None, message: str = "") -> None:
        if delay is not None and not 0 <= delay <= MAX_DURATION:  # also refuses NaN
            raise ValueError(f"Retry delay must be 0 to {MAX_DURATION:g} seconds, got {delay!r}.")
        self.delay = delay
        super().__init__(message or (f"retry in {delay:g} s" if delay is not None else "retry"))


class PermanentError(Exception):
    """Base for failures that retrying cannot fix: the job becomes a dead letter at once,
    with reason ``"failed: <message>"``. Subclass it for your own permanent errors."""


class Fail(PermanentError):
    """Dead-letter this job now: ``raise Fail("order was deleted")``."""
