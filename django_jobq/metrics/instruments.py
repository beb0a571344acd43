"""The process metrics (prometheus-client counters, histograms and a gauge) and the calls
that record them.

Recorded by the process that does the work: enqueue counts the jobs it inserted (at
commit), the worker its claims, outcomes, heartbeats, refused writes and handler threads.
Every instrument lives in prometheus-client's default registry; none holds a value before
its first use (:func:`django_jobq.metrics.multiprocess.prepare_multiprocess` relies on it).
Recording does no I/O outside multiprocess mode's memory-mapped files.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Sequence
from typing import Protocol

from django.db import transaction
from prometheus_client import Counter, Gauge, Histogram

from .buckets import DURATION_BUCKETS


class Claimed(Protocol):
    """What :func:`observe_claims` reads of a claimed job
    (:class:`django_jobq.leases.ClaimedJob` has it)."""

    @property
    def queue(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def reclaimed(self) -> bool: ...
    @property
    def pickup_latency(self) -> float: ...


_JOB_LABELS = ("queue", "kind")

JOBS_ENQUEUED = Counter(
    "jobq_jobs_enqueued",
    "Jobs inserted by this process, counted when their transaction committed.",
    _JOB_LABELS,
)
JOBS_CLAIMED = Counter(
    "jobq_jobs_claimed", "Jobs claimed (leased) by this process's workers.", _JOB_LABELS
)
JOBS_SUCCEEDED = Counter("jobq_jobs_succeeded", "Jobs whose ack was recorded.", _JOB_LABELS)
JOBS_RETRIED = Counter(
    "jobq_jobs_retried", "Failed attempts recorded as a retry (the job runs again).", _JOB_LABELS
)
JOBS_DEAD_LETTERED = Counter(
    "jobq_jobs_dead_lettered",
    "Jobs moved to the dead letters; reason is the reason's category (the text before ':').",
    (*_JOB_LABELS, "reason"),
)
LEASES_RECLAIMED = Counter(
    "jobq_leases_reclaimed",
    "Claims that took a job whose lease had lapsed (its worker died, stalled or overran).",
    _JOB_LABELS,
)
FENCED_WRITES_REFUSED = Counter(
    "jobq_fenced_writes_refused",
    "Writes refused because another attempt holds the job's lease, by operation.",
    ("operation",),
)
HEARTBEATS = Counter("jobq_heartbeats", "Leases extended by heartbeats.", ("queue",))
JOB_DURATION = Histogram(
    "jobq_job_duration_seconds",
    "Seconds a handler ran, by outcome: succeeded, or failed (retried or dead-lettered).",
    (*_JOB_LABELS, "outcome"),
    buckets=DURATION_BUCKETS,
)
PICKUP_LATENCY = Histogram(
    "jobq_pickup_latency_seconds",
    "Seconds from when a job became claimable (GREATEST(run_at, created_at), or the lapsed "
    "lease deadline of a reclaim) to its claim, on the database clock.",
    ("queue",),
    buckets=DURATION_BUCKETS,
)
WORKER_THREADS = Gauge(
    "jobq_worker_threads",
    "Handler threads and async job slots of the running workers: busy (running a job) or idle.",
    ("state",),
    multiprocess_mode="livesum",
)

#: Every process metric; all have labels, so none holds a value before its first use
#: (which :func:`~django_jobq.metrics.multiprocess.prepare_multiprocess` relies on).
PROCESS_METRICS = (
    JOBS_ENQUEUED,
    JOBS_CLAIMED,
    JOBS_SUCCEEDED,
    JOBS_RETRIED,
    JOBS_DEAD_LETTERED,
    LEASES_RECLAIMED,
    FENCED_WRITES_REFUSED,
    HEARTBEATS,
    JOB_DURATION,
    PICKUP_LATENCY,
    WORKER_THREADS,
)

# -- recording -----------------------------------------------------------------------------


def count_enqueued(alias: str, jobs: Iterable[tuple[str, str]]) -> None:
    """Count inserted jobs, given as ``(queue, kind)`` pairs, once the transaction on
    ``alias`` commits (at once outside a transaction; never if it rolls back).

    A failure to count (e.g. ``PROMETHEUS_MULTIPROC_DIR`` names a directory that is gone) is
    logged by Django (``django.db.backends.base``) and does not reach the caller: the jobs
    are committed, and a metric must not make their enqueue look failed."""
    counts = collections.Counter(jobs)
    if not counts:
        return

    def count() -> None:
        for (queue, kind), number in counts.items():
            JOBS_ENQUEUED.labels(queue, kind).inc(number)

    transaction.on_commit(count, using=alias, robust=True)


def observe_claims(jobs: Sequence[Claimed]) -> None:
    """Count claimed jobs and reclaims, and observe each job's pickup latency."""
    for (queue, kind), number in collections.Counter((job.queue, job.kind) for job in jobs).items():
        JOBS_CLAIMED.labels(queue, kind).inc(number)
    for job in jobs:
        if job.reclaimed:
            LEASES_RECLAIMED.labels(job.queue, job.kind).inc()
        PICKUP_LATENCY.labels(job.queue).observe(max(job.pickup_latency, 0.0))


def reason_category(reason: str) -> str:
    """The bounded part of a dead letter's reason, for a label: ``"failed: card declined"``
    gives ``"failed"``; the other reasons are categories already."""
    return reason.partition(":")[0]


def observe_outcome(
    queue: str, kind: str, outcome: str, *, duration: float | None, reason: str = ""
) -> None:
    """Record a recorded outcome: ``outcome`` is ``"succeeded"``, ``"retried"`` or
    ``"dead_lettered"`` (then ``reason`` is the dead letter's). ``duration`` is the seconds
    the handler ran, or ``None`` if it did not run (a job dead-lettered unrun).

    Raises:
        ValueError: an unknown ``outcome``.
    """
    if outcome == "succeeded":
        JOBS_SUCCEEDED.labels(queue, kind).inc()
    elif outcome == "retried":
        JOBS_RETRIED.labels(queue, kind).inc()
    elif outcome == "dead_lettered":
        JOBS_DEAD_LETTERED.labels(queue, kind, reason_category(reason)).inc()
    else:
        raise ValueError(f"unknown outcome {outcome!r}")
    if duration is not None:
        result = "succeeded" if outcome == "succeeded" else "failed"
        JOB_DURATION.labels(queue, kind, result).observe(duration)


def observe_dead_lettered(queue: str, kind: str, reason: str, count: int) -> None:
    """Count ``count`` jobs dead-lettered unrun by the maintenance sweep (no duration)."""
    JOBS_DEAD_LETTERED.labels(queue, kind, reason_category(reason)).inc(count)


def observe_refused(operation: str, count: int = 1) -> None:
    """Count fenced writes refused: ``operation`` is ``ack``, ``retry``, ``dead_letter`` or
    ``heartbeat``."""
    if count:
        FENCED_WRITES_REFUSED.labels(operation).inc(count)


def observe_heartbeat(queue: str) -> None:
    """Count one lease extended by a heartbeat."""
    HEARTBEATS.labels(queue).inc()


def threads_started(count: int) -> None:
    """A worker started ``count`` handler threads or async job slots (idle until they take
    a job)."""
    WORKER_THREADS.labels("idle").inc(count)


def threads_stopped(count: int) -> None:
    """A worker's ``count`` handler threads ended (all idle by then)."""
    WORKER_THREADS.labels("idle").dec(count)


def handler_started() -> None:
    """A handler thread took a job: one thread less idle, one more busy."""
    WORKER_THREADS.labels("idle").dec()
    WORKER_THREADS.labels("busy").inc()


def handler_finished() -> None:
    """A handler thread finished its job (call once per :func:`handler_started`)."""
    WORKER_THREADS.labels("busy").dec()
    WORKER_THREADS.labels("idle").inc()
