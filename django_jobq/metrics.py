"""Prometheus metrics: what each process does, and gauges read from the queue database.

Two kinds, served in two places (docs/operations.md has every name, label and alert):

- **Process metrics**, recorded by the process that does the work: jobs enqueued (by any
  process that enqueues, counted at commit), claimed, succeeded, retried, dead-lettered,
  leases reclaimed, refused fenced writes, heartbeats, job durations, pickup latency and
  handler threads. ``jobq_worker --metrics-port PORT`` serves a worker's (:func:`serve`).
  They live in prometheus-client's default registry, so a web process's enqueue counts
  appear wherever that registry is already exposed.
- **Database gauges** (:class:`DatabaseCollector`): queue depth by state, the oldest ready
  age, dead letters by queue and kind, live and stale workers, and the MVCC health of the
  queue database (the xmin horizon's age, the jobq tables' live and dead rows, whether
  autovacuum may clean them, their indexes' sizes: :mod:`django_jobq.mvcc`). They describe
  the whole queue, whichever process reads them, so one place serves them: the view in
  :mod:`django_jobq.urls`. Reads are cached ``JOBQ['METRICS_CACHE_TIMEOUT']`` seconds.

Several processes on one host (``jobq_worker --processes N``) use prometheus-client's
multiprocess mode: each process writes its values to files in one directory, and the
supervisor serves their sum. The supervisor calls, in this order::

    directory = metrics.prepare_multiprocess(path)     # before starting any child
    server = metrics.serve_multiprocess(port, addr)    # serves the children's sum
    ...
    metrics.mark_process_dead(child_pid)               # each time a child has exited
    server.close()                                     # at exit

Counters of a child that died stay in the sum (a restart never makes a counter go back);
its live gauges (``jobq_worker_threads``) leave with it.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter as Tally
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from wsgiref.simple_server import WSGIServer

from django.db import transaction
from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    multiprocess,
    start_http_server,
    values,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from .claims import ClaimedJob
    from .mvcc import Health
    from .stats import Snapshot

#: Upper bounds (seconds) of the job duration and pickup latency buckets, from 5 ms to an
#: hour: handlers range from a cache write to a report, and an idle worker claims within
#: milliseconds of a wake-up while a backlog makes jobs wait minutes. The per-minute
#: rollups use the same bounds (``OutcomeRollup.duration_buckets`` has one more count, for
#: values above the last bound).
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                    60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)  # fmt: skip

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
    "Handler threads of the running workers: busy (running a job) or idle.",
    ("state",),
    multiprocess_mode="livesum",
)

#: Every process metric; all have labels, so none holds a value before its first use
#: (which :func:`prepare_multiprocess` relies on).
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

# -- recording (each call costs microseconds: no I/O outside multiprocess mode's mmap) -----


def count_enqueued(alias: str, jobs: Iterable[tuple[str, str]]) -> None:
    """Count inserted jobs, given as ``(queue, kind)`` pairs, once the transaction on
    ``alias`` commits (at once outside a transaction; never if it rolls back)."""
    counts = Tally(jobs)
    if not counts:
        return

    def count() -> None:
        for (queue, kind), number in counts.items():
            JOBS_ENQUEUED.labels(queue, kind).inc(number)

    transaction.on_commit(count, using=alias)


def observe_claims(jobs: Sequence[ClaimedJob]) -> None:
    """Count claimed jobs and reclaims, and observe each job's pickup latency."""
    for (queue, kind), number in Tally((job.queue, job.kind) for job in jobs).items():
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
    """A worker started ``count`` handler threads (idle until they take a job)."""
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


# -- database gauges -----------------------------------------------------------------------


class DatabaseCollector:
    """A collector of the gauges read from the queue database, for a registry.

    ``collect()`` reads :func:`django_jobq.stats.snapshot` (without the history) and
    :func:`django_jobq.mvcc.read` at most once per ``cache_timeout`` seconds (default
    ``JOBQ['METRICS_CACHE_TIMEOUT']``); concurrent scrapes share one read. Its cost: see
    ``sql.QUEUE_STATES`` (the MVCC statements read catalogs only: milliseconds).

    Raises (from ``collect``): database errors, as Django raises them.
    """

    def __init__(self, cache_timeout: float | None = None) -> None:
        self._cache_timeout = cache_timeout
        self._lock = threading.Lock()
        self._cached: tuple[float, Snapshot, Health] | None = None

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield from self._families(None)
        yield from self._mvcc_families(None)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        snapshot, health = self._read()
        yield from self._families(snapshot)
        yield from self._mvcc_families(health)

    def _read(self) -> tuple[Snapshot, Health]:
        from . import mvcc
        from .conf import get_settings
        from .stats import snapshot

        timeout = self._cache_timeout
        if timeout is None:
            timeout = get_settings().METRICS_CACHE_TIMEOUT
        with self._lock:
            now = time.monotonic()
            if self._cached is None or now - self._cached[0] >= timeout:
                self._cached = (now, snapshot(history=False), mvcc.read())
            return self._cached[1], self._cached[2]

    @staticmethod
    def _mvcc_families(health: Health | None) -> Iterator[GaugeMetricFamily]:
        from .mvcc import HOLDERS

        horizon_age = GaugeMetricFamily(
            "jobq_xmin_horizon_age_seconds",
            "Seconds the oldest transaction holding back the queue database's xmin horizon has "
            "been open: a session's or a prepared transaction's (other roles' sessions count "
            "only with pg_read_all_stats); 0: none. Vacuum removes no row version that died "
            "since.",
        )
        horizon_transactions = GaugeMetricFamily(
            "jobq_xmin_horizon_age_transactions",
            "Transactions by which each kind of holder holds the xmin horizon back, the "
            "oldest: backend (a session), prepared_transaction, replication_slot (its xmin), "
            "standby (hot_standby_feedback); 0: none.",
            labels=("holder",),
        )
        dead = GaugeMetricFamily(
            "jobq_table_dead_rows",
            "Dead row versions of each jobq table (the statistics' estimate).",
            labels=("table",),
        )
        live = GaugeMetricFamily(
            "jobq_table_live_rows",
            "Live rows of each jobq table (the statistics' estimate).",
            labels=("table",),
        )
        autovacuum = GaugeMetricFamily(
            "jobq_table_autovacuum_enabled",
            "1 if autovacuum may vacuum the jobq table (the server's autovacuum and "
            "track_counts on, the table's autovacuum_enabled not false), else 0.",
            labels=("table",),
        )
        index_size = GaugeMetricFamily(
            "jobq_index_size_bytes",
            "Size of each index of the jobq tables, in bytes.",
            labels=("table", "index"),
        )
        if health is not None:
            horizon_age.add_metric((), health.oldest_transaction_age)
            for holder in HOLDERS:
                horizon_transactions.add_metric((holder,), health.oldest_xmin_age(holder))
            for table in health.tables:
                dead.add_metric((table.table,), table.dead_rows)
                live.add_metric((table.table,), table.live_rows)
                autovacuum.add_metric((table.table,), int(table.autovacuum))
            for index in health.indexes:
                index_size.add_metric((index.table, index.index), index.index_bytes)
        yield from (horizon_age, horizon_transactions, dead, live, autovacuum, index_size)

    @staticmethod
    def _families(snapshot: Snapshot | None) -> Iterator[GaugeMetricFamily]:
        depth = GaugeMetricFamily(
            "jobq_queue_jobs",
            "Live jobs by queue and state: ready (due now), scheduled (run_at in the future), "
            "running (leased).",
            labels=("queue", "state"),
        )
        oldest = GaugeMetricFamily(
            "jobq_queue_oldest_ready_age_seconds",
            "Seconds the longest-waiting ready, due job of the queue has waited since it "
            "became claimable (0: none waiting).",
            labels=("queue",),
        )
        dead = GaugeMetricFamily(
            "jobq_dead_letters", "Dead letters by queue and kind.", labels=("queue", "kind")
        )
        waiting = GaugeMetricFamily(
            "jobq_jobs_waiting_for_a_worker",
            "Due jobs whose queue live workers serve but none of them has their kind: they "
            "wait, then become 'unknown kind' dead letters after JOBQ['UNKNOWN_KIND_GRACE'].",
            labels=("queue", "kind"),
        )
        workers = GaugeMetricFamily(
            "jobq_workers",
            "Registered worker processes: live, or stale (not seen for a minute).",
            labels=("state",),
        )
        if snapshot is not None:
            for queue in snapshot.queues:
                depth.add_metric((queue.queue, "ready"), queue.ready)
                depth.add_metric((queue.queue, "scheduled"), queue.scheduled)
                depth.add_metric((queue.queue, "running"), queue.running)
                oldest.add_metric((queue.queue,), queue.oldest_ready_age)
            for group in snapshot.dead_letters:
                dead.add_metric((group.queue, group.kind), group.count)
            for kind in snapshot.waiting:
                waiting.add_metric((kind.queue, kind.kind), kind.jobs)
            stale = sum(worker.stale for worker in snapshot.workers)
            workers.add_metric(("live",), len(snapshot.workers) - stale)
            workers.add_metric(("stale",), stale)
        yield from (depth, oldest, dead, waiting, workers)


def database_registry(cache_timeout: float | None = None) -> CollectorRegistry:
    """A registry holding only a :class:`DatabaseCollector` (what the metrics view serves)."""
    registry = CollectorRegistry()
    registry.register(DatabaseCollector(cache_timeout))
    return registry


# -- serving -------------------------------------------------------------------------------


@dataclass(frozen=True)
class MetricsServer:
    """An HTTP server answering every GET (``/metrics`` included) with the metrics, on a
    daemon thread. ``port`` is the bound port (useful after asking for port 0)."""

    server: WSGIServer
    thread: threading.Thread

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def close(self) -> None:
        """Stop serving and release the port."""
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def multiprocess_directory() -> str | None:
    """The multiprocess directory this process records to, or ``None`` outside that mode."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


def serve(port: int, addr: str = "0.0.0.0", registry: Collector | None = None) -> MetricsServer:  # noqa: S104
    """Serve ``registry`` over HTTP on ``addr:port`` (port 0: any free port).

    The default registry is this process's (prometheus-client's default registry, with the
    process and Python collectors), or, in multiprocess mode, the sum of every process's
    files (:func:`multiprocess_registry`).

    Raises:
        OSError: the port is taken, or the address cannot be bound.
    """
    if registry is None:
        directory = multiprocess_directory()
        registry = REGISTRY if directory is None else multiprocess_registry(directory)
    server, thread = start_http_server(port, addr, registry=registry)
    return MetricsServer(server, thread)


def multiprocess_registry(directory: str | os.PathLike[str]) -> CollectorRegistry:
    """A registry summing the metric files every process wrote to ``directory``: counters
    and histograms summed over all processes, dead ones included; ``jobq_worker_threads``
    summed over the live ones."""
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=os.fspath(directory))  # type: ignore[no-untyped-call]
    return registry


def prepare_multiprocess(directory: str | os.PathLike[str]) -> Path:
    """Put this process and the children it starts next into multiprocess mode.

    The supervisor calls this once, before starting (forking or spawning) any child:

    1. creates ``directory`` if needed and deletes the ``*.db`` files a previous run left
       (their counts would otherwise be added to this run's): give it a directory of its
       own, not one another program's processes write to;
    2. sets ``PROMETHEUS_MULTIPROC_DIR`` in ``os.environ``, which spawned children inherit:
       prometheus-client reads it when it is imported;
    3. for forked children, which inherit this process's already-imported prometheus-client,
       switches it to multiprocess values (``prometheus_client.values.ValueClass``, the
       variable the library sets from that environment variable at import) and drops the
       label sets of :data:`PROCESS_METRICS` recorded so far, so every value a child records
       goes to its own file (named after its pid).

    Returns:
        The directory, as a :class:`~pathlib.Path`.

    Raises:
        OSError: the directory cannot be created or cleaned.
    """
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    for stale in path.glob("*.db"):
        stale.unlink()
    if not getattr(values.ValueClass, "_multiprocess", False):
        for metric in PROCESS_METRICS:
            metric.clear()
        values.ValueClass = values.MultiProcessValue()  # type: ignore[no-untyped-call]
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(path)
    return path


def serve_multiprocess(
    port: int,
    addr: str = "0.0.0.0",  # noqa: S104
    directory: str | os.PathLike[str] | None = None,
) -> MetricsServer:
    """Serve the sum of every process's metrics in ``directory`` (default: the one
    :func:`prepare_multiprocess` set) on ``addr:port``; the supervisor calls this.

    Raises:
        ValueError: no directory given and none prepared.
        OSError: the port is taken, or the address cannot be bound.
    """
    directory = directory or multiprocess_directory()
    if directory is None:
        raise ValueError("no multiprocess directory: call prepare_multiprocess() first")
    return serve(port, addr, multiprocess_registry(directory))


def mark_process_dead(pid: int, directory: str | os.PathLike[str] | None = None) -> None:
    """Tell the multiprocess files that the child ``pid`` has exited (the supervisor calls
    this after reaping it, before or after starting its replacement): its live gauges stop
    counting; its counters and histograms stay in the sum."""
    path = directory or multiprocess_directory()
    multiprocess.mark_process_dead(pid, None if path is None else os.fspath(path))  # type: ignore[no-untyped-call]
