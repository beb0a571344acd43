"""The jobs a worker holds leases on (prefetched or running), shared by its threads, and
whether the worker's main loop is making progress (:class:`Progress`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from ..claims import ClaimedJob
from ..leases import Lease
from ..limited_claims import RatedStart


@dataclass(eq=False)
class HeldJob:
    """A leased job and what the worker knows of its lease.

    ``deadline`` is the last deadline the database confirmed. ``next_heartbeat`` and
    ``started`` are ``time.monotonic()`` seconds; ``started`` is ``None`` until a handler
    thread picks the job up. ``max_runtime`` is in seconds (``None``: no limit).
    ``asynchronous``: its handler runs on the worker's event loop, which cancels it at
    ``max_runtime`` (a handler thread cannot be stopped: its lease is left to lapse).
    ``outer_atomic_blocks``: the atomic blocks open on the queue database's connection, of
    the thread that runs the handler's queries, before the attempt started: none on a
    worker; the test's when :func:`django_jobq.testing.run_jobs` runs the job inside the
    test's transaction (``ctx.atomic()`` nests in those, see
    :class:`~django_jobq.context.JobContext`).

    ``abort_requested``: an operator asked this attempt to stop (set from the claim, or by
    the heartbeater when a heartbeat or a look between two sees the request; never unset).
    ``next_abort_look`` (``time.monotonic()`` seconds) is when the heartbeater next reads
    the request, at :attr:`abort_look_interval`. ``on_abort`` is called once the request is
    seen (from the heartbeater's thread; set by the event loop while an async handler runs,
    to cancel its task).
    """

    job: ClaimedJob
    max_runtime: float | None = None
    asynchronous: bool = False
    outer_atomic_blocks: int = 0
    deadline: datetime = field(init=False)
    next_heartbeat: float = field(init=False)
    started: float | None = None
    lease_lost: bool = False
    overran: bool = False
    acked: bool = False  # by the handler, in its transaction (JobContext.atomic)
    finished: bool = False  # its outcome is reported; the worker's ack may have deleted it
    # Where its start is logged for rate limits (None: no rate limit counts it).
    rated: RatedStart | None = None
    abort_requested: bool = False
    next_abort_look: float = field(init=False)
    on_abort: Callable[[], None] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.deadline = self.job.lease_deadline
        now = time.monotonic()
        self.next_heartbeat = now + self.heartbeat_interval
        self.next_abort_look = now + self.abort_look_interval
        self.abort_requested = self.abort_requested or self.job.abort_requested

    @property
    def abort_look_interval(self) -> float:
        """Half the heartbeat interval, in seconds: the heartbeater reads a held job's abort
        request at least this often (a heartbeat returns it, a look between two reads it),
        so a request is seen within half a heartbeat interval and the handler can stop
        within one."""
        return self.heartbeat_interval / 2

    def abort_seen(self) -> None:
        """The heartbeater saw an abort request for this attempt: set the flag and, the
        first time, call :attr:`on_abort`."""
        if self.abort_requested:
            return
        self.abort_requested = True
        if (hook := self.on_abort) is not None:
            hook()

    @property
    def heartbeat_interval(self) -> float:
        """A third of the visibility timeout, in seconds: two heartbeats can be missed
        (a slow statement, a GC pause) before the lease lapses."""
        return self.job.visibility_timeout.total_seconds() / 3


class HeldJobs:
    """Thread-safe set of :class:`HeldJob`, keyed by lease (job id and attempt): after a
    stall a worker may reclaim a job whose lapsed attempt it still runs, and then holds two
    attempts of one job. ``changed`` is set whenever a job is added, so the heartbeater can
    plan its next wake-up."""

    def __init__(self) -> None:
        self._jobs: dict[Lease, HeldJob] = {}
        self._lock = threading.Lock()
        self.changed = threading.Event()

    def add(self, held: HeldJob) -> None:
        with self._lock:
            self._jobs[held.job.lease] = held
        self.changed.set()

    def discard(self, lease: Lease) -> None:
        with self._lock:
            self._jobs.pop(lease, None)

    def snapshot(self) -> list[HeldJob]:
        with self._lock:
            return list(self._jobs.values())


class Progress:
    """Whether the main loop is making progress, for the heartbeater: the loop calls
    :meth:`busy` when a pass begins and :meth:`progressed` when it ends (before it waits
    for work); a pass that does not end (a hung statement, a reconnect that does not
    succeed, a wedged thread) makes :meth:`stalled_for` grow."""

    def __init__(self) -> None:
        self._busy_since: float | None = None  # time.monotonic() the current pass began

    def busy(self) -> None:
        if self._busy_since is None:
            self._busy_since = time.monotonic()

    def progressed(self) -> None:
        self._busy_since = None

    def stalled_for(self, now: float) -> float:
        """Seconds the current pass has lasted at ``now`` (0 while the loop waits)."""
        since = self._busy_since
        return 0.0 if since is None else max(0.0, now - since)
