"""The worker: claims jobs, runs their handlers on threads, records each outcome.

- ``worker.py``: :class:`Worker`, the main loop (claim → dispatch → complete → shutdown).
- ``executor.py``: the handler threads; turns one claimed job into an :class:`Outcome`.
- ``completer.py``: applies outcomes with fenced writes (ack, retry, dead letter).
"""

from .worker import Worker, WorkerStats

__all__ = ["Worker", "WorkerStats"]
