"""The gauges read from the queue database, as a prometheus-client collector.

They describe the whole queue, whichever process reads them: the metrics view
(:mod:`django_jobq.views`) serves :func:`database_registry`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

from .. import mvcc, stats
from ..conf import get_settings
from ..rates import parse_rate


class DatabaseCollector:
    """A collector of the gauges read from the queue database, for a registry.

    ``collect()`` reads :func:`django_jobq.stats.snapshot` (without the history) and
    :func:`django_jobq.mvcc.read` at most once per ``cache_timeout`` seconds (default
    ``JOBQ['METRICS_CACHE_TIMEOUT']``); concurrent scrapes share one read. Its cost: see
    ``sql.stats.QUEUE_STATES`` (the MVCC statements read catalogs only).

    Raises (from ``collect``): database errors, as Django raises them.
    """

    def __init__(self, cache_timeout: float | None = None) -> None:
        self._cache_timeout = cache_timeout
        self._lock = threading.Lock()
        self._cached: tuple[float, stats.Snapshot, mvcc.Health] | None = None

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield from self._families(None)
        yield from self._mvcc_families(None)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        snapshot, health = self._read()
        yield from self._families(snapshot)
        yield from self._mvcc_families(health)

    def _read(self) -> tuple[stats.Snapshot, mvcc.Health]:
        timeout = self._cache_timeout
        if timeout is None:
            timeout = get_settings().METRICS_CACHE_TIMEOUT
        with self._lock:
            now = time.monotonic()
            if self._cached is None or now - self._cached[0] >= timeout:
                self._cached = (now, stats.snapshot(history=False), mvcc.read())
            return self._cached[1], self._cached[2]

    @staticmethod
    def _mvcc_families(health: mvcc.Health | None) -> Iterator[GaugeMetricFamily]:
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
            for holder in mvcc.HOLDERS:
                horizon_transactions.add_metric((holder,), health.oldest_xmin_age(holder))
            for table in health.tables:
                dead.add_metric((table.table,), table.dead_rows)
                live.add_metric((table.table,), table.live_rows)
                autovacuum.add_metric((table.table,), int(table.autovacuum))
            for index in health.indexes:
                index_size.add_metric((index.table, index.index), index.index_bytes)
        yield from (horizon_age, horizon_transactions, dead, live, autovacuum, index_size)

    @staticmethod
    def _families(snapshot: stats.Snapshot | None) -> Iterator[GaugeMetricFamily]:
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
        paused = GaugeMetricFamily(
            "jobq_queue_paused",
            "1 while the queue is paused (no worker claims its jobs; its oldest ready age "
            "grows), else 0; every known queue.",
            labels=("queue",),
        )
        concurrency_limit = GaugeMetricFamily(
            "jobq_queue_concurrency_limit",
            "The queue's effective fleet-wide concurrency limit (the most of its jobs running "
            "at once), by where it comes from: setting (JOBQ['QUEUES']) or operator (set at "
            "run time); queues without one have no sample.",
            labels=("queue", "source"),
        )
        rate_limit = GaugeMetricFamily(
            "jobq_queue_rate_limit_per_second",
            "The queue's effective fleet-wide rate limit as starts per second (count / "
            "window: 600/m is 10), by source as jobq_queue_concurrency_limit; queues without "
            "one have no sample.",
            labels=("queue", "source"),
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
            for control in snapshot.controls.values():
                paused.add_metric((control.name,), int(control.paused))
                if control.concurrency_limit is not None:
                    concurrency_limit.add_metric(
                        (control.name, str(control.concurrency_limit_source)),
                        control.concurrency_limit,
                    )
                if control.rate_limit is not None:
                    rate_limit.add_metric(
                        (control.name, str(control.rate_limit_source)),
                        parse_rate(control.rate_limit).per_second,
                    )
            stale = sum(worker.stale for worker in snapshot.workers)
            workers.add_metric(("live",), len(snapshot.workers) - stale)
            workers.add_metric(("stale",), stale)
        yield from (depth, oldest, dead, waiting, paused, concurrency_limit, rate_limit, workers)


def database_registry(cache_timeout: float | None = None) -> CollectorRegistry:
    """A registry holding only a :class:`DatabaseCollector` (what the metrics view serves)."""
    registry = CollectorRegistry()
    registry.register(DatabaseCollector(cache_timeout))
    return registry
