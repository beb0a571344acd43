"""The process metrics count exactly what the worker did: known workloads, exact values.

Counters are process-wide and accumulate across tests, so each test uses queues of its own
(``metrics-<test>``) and reads the series of those queues only.
"""

import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone
from prometheus_client import REGISTRY

from django_jobq import claims
from django_jobq.models import Job
from django_jobq.outcomes import Action, Outcome
from django_jobq.worker import Worker
from django_jobq.worker.completer import Completer
from django_jobq.worker.heartbeat import Heartbeater
from django_jobq.worker.held import HeldJob, HeldJobs
from django_jobq.worker.observer import Observer
from tests.conftest import wait_until
from tests.factories import JobFactory
from tests.testapp.jobs import always_fails, give_up, record, wait_for_lock

pytestmark = pytest.mark.django_db(transaction=True)

RECORD = "tests.testapp.jobs.record"
ALWAYS_FAILS = "tests.testapp.jobs.always_fails"


def value(name, **labels):
    """The current value of one sample (0.0 when the series does not exist yet)."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


def extend_once(jobs, worker_id):
    """Heartbeat ``jobs`` once, as a worker's heartbeater does; True if all were extended."""
    held = HeldJobs()
    for job in jobs:
        held.add(HeldJob(job))
    heartbeater = Heartbeater(held, worker_id=worker_id)
    extended = heartbeater.extend(held.snapshot())
    heartbeater.start()  # nothing is due yet; start and stop close its connection
    heartbeater.stop()
    return extended


def run_burst(**options):
    return Worker(burst=True, poll_interval=0.05, **options).run()


def test_enqueued_jobs_are_counted_when_their_transaction_commits():
    queue = "metrics-enqueue"
    with transaction.atomic():
        record.using(queue=queue).enqueue("a")
        record.using(queue=queue).enqueue("b")
        assert value("jobq_jobs_enqueued_total", queue=queue, kind=RECORD) == 0  # not yet
    assert value("jobq_jobs_enqueued_total", queue=queue, kind=RECORD) == 2
    with pytest.raises(RuntimeError), transaction.atomic():
        record.using(queue=queue).enqueue("rolled back")
        raise RuntimeError
    record.using(queue=queue, idempotency_key="k").enqueue("keyed")
    record.using(queue=queue, idempotency_key="k").enqueue("the same job again")
    assert value("jobq_jobs_enqueued_total", queue=queue, kind=RECORD) == 3


def test_a_workload_is_counted_outcome_by_outcome():
    queue = "metrics-workload"
    for n in range(3):
        record.using(queue=queue).enqueue(f"ok {n}")
    always_fails.using(queue=queue, max_attempts=1).enqueue(reason="last attempt")
    always_fails.using(queue=queue, max_attempts=2).enqueue(reason="will retry")
    give_up.using(queue=queue).enqueue(reason="card declined")
    JobFactory(queue=queue, kind="added.in.next.deploy")  # no handler here: not claimed

    stats = run_burst(queues=[queue], concurrency=2)

    assert stats.claimed == 6
    assert value("jobq_jobs_claimed_total", queue=queue, kind="added.in.next.deploy") == 0
    assert value("jobq_jobs_claimed_total", queue=queue, kind=RECORD) == 3
    assert value("jobq_jobs_claimed_total", queue=queue, kind=ALWAYS_FAILS) == 2
    assert value("jobq_jobs_succeeded_total", queue=queue, kind=RECORD) == 3
    assert value("jobq_jobs_retried_total", queue=queue, kind=ALWAYS_FAILS) == 1
    dead = "jobq_jobs_dead_lettered_total"
    assert value(dead, queue=queue, kind=ALWAYS_FAILS, reason="max attempts exceeded") == 1
    assert value(dead, queue=queue, kind="tests.testapp.jobs.give_up", reason="failed") == 1
    durations = "jobq_job_duration_seconds_count"
    assert value(durations, queue=queue, kind=RECORD, outcome="succeeded") == 3
    assert value(durations, queue=queue, kind=ALWAYS_FAILS, outcome="failed") == 2
    assert value("jobq_pickup_latency_seconds_count", queue=queue) == 6
    assert value("jobq_leases_reclaimed_total", queue=queue, kind=RECORD) == 0


def test_pickup_latency_counts_from_when_the_job_became_claimable():
    queue = "metrics-pickup"
    now = timezone.now()
    # Waited 10 minutes since its run_at (created before).
    JobFactory(queue=queue, run_at=now - timedelta(minutes=10))
    Job.objects.filter(queue=queue).update(created_at=now - timedelta(minutes=20))
    # run_at an hour in the past, but enqueued 2 minutes ago: it has waited 2 minutes.
    late = JobFactory(queue=queue, run_at=now - timedelta(hours=1))
    Job.objects.filter(pk=late.pk).update(created_at=now - timedelta(minutes=2))
    # A lease that lapsed 40 s ago: reclaimable for 40 s.
    JobFactory(
        queue=queue,
        status=Job.Status.RUNNING,
        attempts=1,
        worker_id="dead:1",
        lease_deadline=now - timedelta(seconds=40),
    )
    run_burst(queues=[queue])

    def bucket(le):
        return value("jobq_pickup_latency_seconds_bucket", queue=queue, le=le)

    assert [bucket(le) for le in ("30.0", "60.0", "300.0", "600.0", "1800.0")] == [0, 1, 2, 2, 3]
    assert value("jobq_leases_reclaimed_total", queue=queue, kind=RECORD) == 1
    assert value("jobq_jobs_claimed_total", queue=queue, kind=RECORD) == 3


def test_refused_writes_and_heartbeats_are_counted(queue_cursor):
    queue = "metrics-fencing"
    refused = "jobq_fenced_writes_refused_total"
    before = {op: value(refused, operation=op) for op in ("ack", "retry", "heartbeat")}
    for label in ("a", "b", "c"):
        record.using(queue=queue, visibility_timeout=0.001).enqueue(label)
    jobs = claims.claim(queue_cursor, worker_id="stalled", limit=3, queues=[queue])
    # Their leases lapse at once; another worker reclaims all three.
    wait_until(
        lambda: claims.claim(queue_cursor, worker_id="other", limit=3, queues=[queue]),
        what="the reclaim",
    )
    observer = Observer(worker_id="stalled", queues=[queue], concurrency=1, kinds=[])
    completer = Completer(on_applied=lambda outcome: None, observer=observer)
    completer.pending = [
        Outcome(jobs[0], Action.ACK, duration=0.01),
        Outcome(jobs[1], Action.RETRY, duration=0.01, retry_delay=1, error="E: e"),
    ]
    completer.flush(queue_cursor)
    assert not extend_once(jobs[2:], "stalled")  # refused: the lease is lost
    assert {op: value(refused, operation=op) - before[op] for op in before} == {
        "ack": 1,
        "retry": 1,
        "heartbeat": 1,
    }
    assert value("jobq_jobs_succeeded_total", queue=queue, kind=RECORD) == 0

    beats = value("jobq_heartbeats_total", queue="metrics-heartbeat")
    record.using(queue="metrics-heartbeat").enqueue("d")
    (fresh,) = claims.claim(queue_cursor, worker_id="w", limit=1, queues=["metrics-heartbeat"])
    assert extend_once([fresh], "w")
    assert value("jobq_heartbeats_total", queue="metrics-heartbeat") - beats == 1


def test_handler_threads_are_counted_busy_while_they_run_a_job():
    lock_id = 5151
    busy, idle = (value("jobq_worker_threads", state=s) for s in ("busy", "idle"))
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s)", [lock_id])
    wait_for_lock.using(queue="metrics-threads").enqueue(lock_id=lock_id, label="done")
    worker = Worker(queues=["metrics-threads"], concurrency=3, poll_interval=0.05)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_until(
            lambda: value("jobq_worker_threads", state="busy") == busy + 1,
            what="the handler to start",
        )
        assert value("jobq_worker_threads", state="idle") == idle + 2
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock_all()")
        worker.stop()
        thread.join(30)
    assert value("jobq_worker_threads", state="busy") == busy
    assert value("jobq_worker_threads", state="idle") == idle
