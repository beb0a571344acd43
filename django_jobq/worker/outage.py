"""Log lines for repeated failures, with back-off.

During an outage every worker thread that talks to the database fails again and again
(the heartbeater about three times a second). :class:`OutageLog` logs the first failure at
once, then at most one line every :data:`FAILURE_LOG_INTERVAL` seconds, saying how many
failures were not logged meanwhile, and one line when the outage is over.
"""

from __future__ import annotations

import logging
import threading
import time

from .timers import Every

logger = logging.getLogger("django_jobq.worker")

#: The fewest seconds between two log lines about the same repeated failure.
FAILURE_LOG_INTERVAL = 30.0


class OutageLog:
    """One kind of repeated failure (the heartbeat's, the main loop's, the listener's).

    Args:
        interval: the fewest seconds between two warnings.
    """

    def __init__(self, *, interval: float = FAILURE_LOG_INTERVAL) -> None:
        self._lock = threading.Lock()
        self._since: float | None = None  # time.monotonic() of the outage's first failure
        self._failures = 0
        self._unlogged = 0
        self._lines = Every(interval)

    def failed(self, message: str, *args: object) -> None:
        """Count a failure; log ``message % args`` as a warning if the last line is
        ``interval`` seconds old (with the count of failures not logged since)."""
        now = time.monotonic()
        with self._lock:
            self._failures += 1
            if self._since is None:  # an outage starts: its first failure is logged at once
                self._since = now
                self._lines.restart()
            elif not self._lines.due():
                self._unlogged += 1
                return
            unlogged, self._unlogged = self._unlogged, 0
        if unlogged:
            logger.warning(message + " (%s more failure(s) since the last line)", *args, unlogged)
        else:
            logger.warning(message, *args)

    def restored(self, message: str, *args: object) -> None:
        """After failures, log ``message % args`` once (with the outage's failures and
        length) and start afresh; without failures, do nothing."""
        now = time.monotonic()
        with self._lock:
            if self._since is None:
                return
            failures, since = self._failures, self._since
            self._since, self._failures, self._unlogged = None, 0, 0
        logger.info(message + " after %s failure(s) in %.1f s", *args, failures, now - since)
