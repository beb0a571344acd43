"""The history behind the statistics: per-minute outcome rollups written by workers (one
statement per flush), queue samples, the windows and percentiles read from them, and their
retention."""

from datetime import timedelta

import psycopg
import pytest
from django.test.utils import override_settings
from django.utils import timezone

from django_jobq import stats
from django_jobq.metrics.buckets import DURATION_BUCKETS
from django_jobq.models import OutcomeRollup, QueueSample, WorkerProcess
from django_jobq.worker import Worker
from django_jobq.worker.history import OutcomeRollups, sample_queues
from django_jobq.worker.maintenance import Maintenance
from tests.factories import JobFactory, database_now
from tests.testapp.jobs import always_fails, record

#: Tests with workers or extra connections need committed data; the others run in one
#: transaction, whose database clock stands still (see ``database_now``).
committed = pytest.mark.django_db(transaction=True)
in_one_transaction = pytest.mark.django_db

BUCKETS = len(DURATION_BUCKETS) + 1
RECORD = "tests.testapp.jobs.record"


def buckets(**counts_by_bound):
    """Bucket counts from ``{"b0_1": 3}`` meaning 3 values in the bucket whose bound is 0.1
    (``"inf"``: above the last bound)."""
    counts = [0] * BUCKETS
    for name, count in counts_by_bound.items():
        bound = name.removeprefix("b").replace("_", ".")
        counts[BUCKETS - 1 if bound == "inf" else DURATION_BUCKETS.index(float(bound))] = count
    return counts


def rollup(minutes_ago, queue="q", kind="k", **fields):
    minute = stats.current_minute(database_now()) - timedelta(minutes=minutes_ago)
    fields.setdefault("duration_buckets", [0] * BUCKETS)
    return OutcomeRollup.objects.create(queue=queue, kind=kind, minute=minute, **fields)


# -- percentiles ---------------------------------------------------------------------------


def test_quantiles_interpolate_inside_the_bucket_holding_the_rank():
    # 100 durations: 50 in (0.05, 0.1], 40 in (0.1, 0.25], 10 in (0.25, 0.5].
    counts = buckets(b0_1=50, b0_25=40, b0_5=10)
    assert stats.quantile(0.5, counts) == pytest.approx(0.1)  # the 50th: top of its bucket
    assert stats.quantile(0.25, counts) == pytest.approx(0.05 + 0.05 * 25 / 50)
    assert stats.quantile(0.99, counts) == pytest.approx(0.25 + 0.25 * 9 / 10)


def test_a_quantile_in_the_overflow_bucket_is_the_last_bound_and_empty_is_none():
    assert stats.quantile(0.99, buckets(b0_005=1, inf=99)) == 3600.0
    assert stats.quantile(0.5, [0] * BUCKETS) is None
    with pytest.raises(ValueError, match="bucket counts"):
        stats.quantile(0.5, [1, 2])


# -- what the workers write ----------------------------------------------------------------


@committed
def test_a_worker_rolls_its_outcomes_up_per_minute_in_one_row_per_kind():
    queue = "rollup"
    for n in range(4):
        record.using(queue=queue).enqueue(f"r{n}")
    always_fails.using(queue=queue, max_attempts=2).enqueue()
    always_fails.using(queue=queue, max_attempts=1).enqueue()
    record.using(queue=queue, expires_at=timezone.now() - timedelta(seconds=1)).enqueue("late")

    Worker(queues=[queue], burst=True, poll_interval=0.05).run()

    rows = {row.kind: row for row in OutcomeRollup.objects.filter(queue=queue)}
    assert set(rows) == {RECORD, "tests.testapp.jobs.always_fails"}
    assert {kind: (r.succeeded, r.retried, r.dead_lettered) for kind, r in rows.items()} == {
        RECORD: (4, 0, 1),  # the expired one dead-lettered unrun: no duration
        "tests.testapp.jobs.always_fails": (0, 1, 1),
    }
    assert sum(rows[RECORD].duration_buckets) == 4
    assert sum(rows["tests.testapp.jobs.always_fails"].duration_buckets) == 2
    assert rows[RECORD].duration_sum > 0
    minute = stats.current_minute(timezone.now())
    assert all(r.minute in (minute, minute - timedelta(minutes=1)) for r in rows.values())


@committed
def test_flushes_add_up_in_the_same_minute(queue_cursor):
    rollups = OutcomeRollups()
    rollups.add("q", "k", "succeeded", 0.07)
    rollups.add("q", "k", "retried", 4.0)
    assert rollups.flush(queue_cursor) == 1
    rollups.add("q", "k", "succeeded", 0.08)
    rollups.add("q", "k", "dead_lettered", None)
    rollups.add("q", "other", "succeeded", 7200.0)
    assert rollups.flush(queue_cursor) == 2
    assert rollups.flush(queue_cursor) == 0  # nothing pending: no statement
    row = OutcomeRollup.objects.get(kind="k")
    assert (row.succeeded, row.retried, row.dead_lettered) == (2, 1, 1)
    assert row.duration_buckets == buckets(b0_1=2, b5_0=1)
    assert row.duration_sum == pytest.approx(0.07 + 4.0 + 0.08)
    assert OutcomeRollup.objects.get(kind="other").duration_buckets == buckets(inf=1)


@committed
def test_a_failed_flush_keeps_the_outcomes_for_the_next(connect):
    rollups = OutcomeRollups()
    rollups.add("q", "k", "succeeded", 0.01)
    broken = connect()
    broken.close()
    with pytest.raises(psycopg.Error):
        rollups.flush(broken.cursor())
    rollups.add("q", "k", "succeeded", 0.01)
    assert rollups.flush(connect().cursor()) == 1
    assert OutcomeRollup.objects.get().succeeded == 2


@committed
def test_the_queues_are_sampled_once_a_minute_however_many_workers_try(queue_cursor):
    JobFactory.create_batch(3, queue="sampled")
    JobFactory(queue="sampled", run_at=timezone.now() + timedelta(hours=1))
    assert sample_queues(queue_cursor) == 1
    assert sample_queues(queue_cursor) == 0  # this minute is done
    sample = QueueSample.objects.get()
    assert (sample.queue, sample.ready, sample.scheduled, sample.running) == (
        "sampled",
        3,
        1,
        0,
    )
    assert sample.minute == stats.current_minute(sample.minute)


# -- what the readers see ------------------------------------------------------------------


@in_one_transaction
def test_windows_are_whole_minutes_before_the_current_one():
    rollup(0, succeeded=100)  # the current minute: not in any window yet
    rollup(1, succeeded=5, retried=2, duration_buckets=buckets(b0_1=7))
    rollup(30, succeeded=10, dead_lettered=1, duration_buckets=buckets(b1_0=11))
    rollup(30, kind="k2", succeeded=1, duration_buckets=buckets(b0_1=1))
    rollup(61, succeeded=1000)  # older than the hour
    rollup(1, queue="other", succeeded=3)

    taken = stats.snapshot()

    activity = taken.activity["q"]
    assert activity.last_minute == stats.Outcomes(succeeded=5, retried=2)
    assert activity.last_hour == stats.Outcomes(succeeded=16, retried=2, dead_lettered=1)
    assert activity.last_hour.failed == 3
    # 19 runs: 8 in (0.05, 0.1], 11 in (0.5, 1]; the median is the 9.5th.
    assert activity.duration_p50 == pytest.approx(0.5 + 0.5 * 1.5 / 11)
    assert activity.duration_p99 == pytest.approx(0.5 + 0.5 * (0.99 * 19 - 8) / 11)
    assert taken.activity["other"].last_hour.succeeded == 3
    history = taken.history["q"]
    assert len(history.minutes) == stats.HISTORY_MINUTES
    assert history.succeeded[-1] == 5 and history.failed[-1] == 2
    assert history.succeeded[-30] == 11 and history.failed[-30] == 1
    assert sum(history.succeeded) == 16
    assert history.ready == [None] * stats.HISTORY_MINUTES  # never sampled
    assert taken.queue_names == ["other", "q"]


@in_one_transaction
def test_the_history_carries_the_sampled_depths():
    minute = stats.current_minute(database_now())
    for ago, ready in ((1, 40), (2, 25)):
        QueueSample.objects.create(
            queue="q",
            minute=minute - timedelta(minutes=ago),
            ready=ready,
            scheduled=0,
            running=2,
            oldest_ready_age=ago * 60.0,
        )
    history = stats.snapshot().history["q"]
    assert history.ready[-2:] == [25, 40]
    assert history.oldest_ready_age[-2:] == [120.0, 60.0]
    assert history.ready[:-2] == [None] * (stats.HISTORY_MINUTES - 2)


@in_one_transaction
def test_workers_not_seen_for_a_minute_are_stale():
    WorkerProcess.objects.create(worker_id="h:1", host="h", pid=1, concurrency=2)
    old = WorkerProcess.objects.create(worker_id="h:2", host="h", pid=2, concurrency=2)
    WorkerProcess.objects.filter(pk=old.pk).update(
        last_seen=database_now() - timedelta(seconds=stats.STALE_AFTER + 5)
    )
    workers = stats.snapshot(history=False).workers
    assert [(w.worker_id, w.stale) for w in workers] == [("h:1", False), ("h:2", True)]
    assert workers[1].seen_ago >= stats.STALE_AFTER + 5


def test_format_seconds_reads_well_at_every_scale():
    assert [stats.format_seconds(s) for s in (None, 0.0382, 4.25, 720, 12600)] == [
        "-",
        "38 ms",
        "4.2 s",
        "12 min",
        "3.5 h",
    ]


# -- retention -----------------------------------------------------------------------------


@override_settings(JOBQ={"STATS_RETENTION": timedelta(days=2)})
@committed
def test_maintenance_prunes_old_statistics_and_forgotten_workers(connect):
    old = rollup(3 * 24 * 60)
    recent = rollup(60)
    minute = stats.current_minute(timezone.now())
    for days in (3, 1):
        QueueSample.objects.create(
            queue="q",
            minute=minute - timedelta(days=days),
            ready=0,
            scheduled=0,
            running=0,
            oldest_ready_age=0,
        )
    gone = WorkerProcess.objects.create(worker_id="gone", host="h", pid=1, concurrency=1)
    WorkerProcess.objects.filter(pk=gone.pk).update(last_seen=timezone.now() - timedelta(hours=2))
    stale = WorkerProcess.objects.create(worker_id="stale", host="h", pid=2, concurrency=1)
    WorkerProcess.objects.filter(pk=stale.pk).update(
        last_seen=timezone.now() - timedelta(minutes=10)
    )

    Maintenance().run_if_due(connect())

    assert list(OutcomeRollup.objects.values_list("pk", flat=True)) == [recent.pk]
    assert old.pk != recent.pk
    assert [s.minute for s in QueueSample.objects.all()] == [minute - timedelta(days=1)]
    assert list(WorkerProcess.objects.values_list("worker_id", flat=True)) == ["stale"]
