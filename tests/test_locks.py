"""Row locks: a lock on one job never stops the worker's writes about its other jobs, an
idempotent enqueue takes no lock on a live job, and keyed batches cannot deadlock."""

import random
import threading
from collections import Counter
from contextlib import contextmanager

import pytest
from django.db import DatabaseError, connection, connections, transaction

from django_jobq import claims, enqueue_many, leases, outcomes
from django_jobq.models import DeadLetter, Job
from django_jobq.worker import Worker
from tests.conftest import run_together, wait_until
from tests.testapp.jobs import always_fails, hold_lock, record
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)

HELD_LOCK, NEIGHBOUR_LOCK = 7101, 7102


def start_worker(**options):
    worker = Worker(poll_interval=0.05, **options)
    thread = threading.Thread(target=worker.run)
    thread.start()
    return worker, thread


def advisory(function, *lock_ids):
    with connection.cursor() as cursor:
        for lock_id in lock_ids:
            cursor.execute(f"SELECT {function}(%s)", [lock_id])


def lease_deadline(job):
    return Job.objects.get(pk=job.pk).lease_deadline


@contextmanager
def producer_holding_the_key(connect, job):
    """Enqueue with ``job``'s idempotency key in a transaction left open (another thread,
    another connection) until the block ends; then it commits."""
    has_key, may_commit = threading.Event(), threading.Event()
    found = []

    def produce():
        try:
            with transaction.atomic():
                found.append(
                    hold_lock.using(idempotency_key=job.idempotency_key).enqueue(
                        lock_id=HELD_LOCK, label="again"
                    )
                )
                has_key.set()
                may_commit.wait(60)
        finally:
            connections.close_all()

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        assert has_key.wait(20), "the producer's enqueue did not return"
        yield
        assert producer.is_alive(), "the producer's transaction was open throughout"
    finally:
        may_commit.set()
        producer.join(30)
    assert [found_job.pk for found_job in found] == [job.pk]  # the live job, nothing inserted


@contextmanager
def operator_locking_the_row(connect, job):
    """``SELECT ... FOR UPDATE`` of ``job``'s row in a transaction left open until the
    block ends, as an operator's session might; then it rolls back."""
    operator = connect(autocommit=False)
    operator.execute("SELECT id FROM jobq_job WHERE id = %s FOR UPDATE", [job.pk])
    try:
        yield
    finally:
        operator.rollback()


@pytest.mark.parametrize(
    ("holder", "own_ack_waits"),
    [(producer_holding_the_key, False), (operator_locking_the_row, True)],
    ids=["producer", "operator"],
)
def test_a_lock_on_one_running_job_stops_none_of_the_workers_other_writes(
    connect, holder, own_ack_waits
):
    advisory("pg_advisory_lock", HELD_LOCK, NEIGHBOUR_LOCK)
    held = hold_lock.using(idempotency_key="held", visibility_timeout=2).enqueue(
        lock_id=HELD_LOCK, label="held"
    )
    neighbour = hold_lock.using(visibility_timeout=1).enqueue(
        lock_id=NEIGHBOUR_LOCK, label="neighbour"
    )
    worker, thread = start_worker(concurrency=4)
    try:
        wait_until(
            lambda: (
                Job.objects.filter(pk__in=[held.pk, neighbour.pk], status="running").count() == 2
            ),
            what="both long jobs to run",
        )
        with holder(connect, held):
            extended_before = lease_deadline(neighbour)
            advisory("pg_advisory_unlock", HELD_LOCK)  # the held job finishes: its ack is due
            for n in range(100):
                record.enqueue(f"ready {n}")
            wait_until(
                lambda: (
                    Effect.objects.filter(label__startswith="ready ").count() == 100
                    and not Job.objects.filter(kind=record.kind).exists()
                ),
                what="the 100 ready jobs to run and be acked while the row is locked",
            )
            wait_until(
                lambda: lease_deadline(neighbour) > extended_before,
                what="the neighbour's lease to be extended while the row is locked",
            )
            if own_ack_waits:
                assert Job.objects.filter(pk=held.pk, status="running").exists()
            else:
                wait_until(
                    lambda: not Job.objects.filter(pk=held.pk).exists(),
                    what="the held job's ack",
                )
        wait_until(
            lambda: not Job.objects.filter(pk=held.pk).exists(),
            what="the held job's ack once the lock is released",
        )
        assert Job.objects.get(pk=neighbour.pk).attempts == 1
    finally:
        with connection.cursor() as cursor:  # the neighbour (and a held job still waiting) ends
            cursor.execute("SELECT pg_advisory_unlock_all()")
        worker.stop()
        thread.join(30)
    labels = Counter(
        Effect.objects.exclude(label__startswith="ready ").values_list("label", flat=True)
    )
    assert labels == {"held attempt 1": 1, "neighbour attempt 1": 1}
    assert not Job.objects.exists()


KEYS = [f"key-{n}" for n in range(12)]


def deadlocks(cursor):
    cursor.execute("SELECT pg_stat_clear_snapshot()")
    cursor.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
    return cursor.fetchone()[0]


def only_these_connections(cursor, pids):
    """Wait until every other client connection to the test database has ended (a backend
    flushes its statistics, the deadlocks it detected among them, before it leaves)."""
    cursor.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND backend_type = 'client backend' AND NOT pid = ANY(%s)",
        [list(pids)],
    )
    return cursor.fetchone()[0] == 0


def test_keyed_enqueue_many_racing_with_workers_never_deadlocks(queue_cursor):
    """4 producers x 15 transactions, each enqueueing 8 of 12 keys in a shuffled order, while
    2 workers run and ack the jobs."""
    before = deadlocks(queue_cursor)
    workers = [start_worker(concurrency=2) for _ in range(2)]

    def produce(producer):
        shuffled = random.Random(producer)
        committed: list[tuple[str, int, str]] = []
        failed: list[DatabaseError] = []
        for round_number in range(15):
            keys = shuffled.sample(KEYS, 8)
            labels = {key: f"{producer}-{round_number}-{key}" for key in keys}
            try:
                with transaction.atomic():
                    jobs = enqueue_many(
                        [record.using(idempotency_key=key).prepare(labels[key]) for key in keys]
                    )
                    with connection.cursor() as cursor:  # hold the keys a moment, as a request
                        cursor.execute("SELECT pg_sleep(0.005)")
            except DatabaseError as exc:
                failed.append(exc)
                continue
            committed.extend(
                (labels[key], job.pk, job.payload["label"])
                for key, job in zip(keys, jobs, strict=True)
            )
        return committed, failed

    try:
        results = run_together(4, produce)
        wait_until(lambda: not Job.objects.exists(), what="the workers to run every job")
    finally:
        for worker, _ in workers:
            worker.stop()
        for _, thread in workers:
            thread.join(30)
    failures = [exc for _, failed in results for exc in failed]
    assert failures == []
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (own,) = cursor.fetchone()
    queue_cursor.execute("SELECT pg_backend_pid()")
    (queue_pid,) = queue_cursor.fetchone()
    wait_until(
        lambda: only_these_connections(queue_cursor, {own, queue_pid}),
        what="the producers' and workers' connections to end",
    )
    assert deadlocks(queue_cursor) - before == 0
    # The idempotency contract: a returned job is either the one this enqueue inserted (its
    # own label) or the live job another committed enqueue inserted for that key; each
    # inserted job ran exactly once.
    committed = [row for rows, _ in results for row in rows]
    inserted = {job_id: label for own_label, job_id, label in committed if label == own_label}
    assert all(inserted.get(job_id) == label for _, job_id, label in committed)
    ran = Counter(Effect.objects.values_list("label", flat=True))
    assert ran == Counter(inserted.values())
    assert not DeadLetter.objects.exists()


def test_every_fenced_write_skips_a_locked_row_and_reports_it_busy(connect, queue_cursor):
    record.enqueue("locked")
    (job,) = claims.claim(queue_cursor, worker_id="w", limit=1)
    before = Job.objects.values().get(pk=job.id)
    with operator_locking_the_row(connect, Job.objects.get(pk=job.id)):
        acked = outcomes.ack(queue_cursor, [job.lease])
        extended = leases.heartbeat(queue_cursor, [job.lease])
        released = leases.release(queue_cursor, [job.lease])
        assert (set(acked), acked.busy) == (set(), frozenset({job.id}))
        assert (dict(extended), extended.busy) == ({}, frozenset({job.id}))
        assert (set(released), released.busy) == (set(), frozenset({job.id}))
        with pytest.raises(leases.LeaseBusy):
            outcomes.retry(queue_cursor, job.id, job.attempt, delay=0, error="x")
        with pytest.raises(leases.LeaseBusy):
            outcomes.dead_letter(queue_cursor, job.id, job.attempt, reason="failed")
        # A stale attempt is lost, not busy, even while the row is locked.
        stale = leases.Lease(job.id, job.attempt + 1)
        assert outcomes.ack(queue_cursor, [stale]).busy == frozenset()
    assert Job.objects.values().get(pk=job.id) == before
    assert outcomes.ack(queue_cursor, [job.lease]) == {job.id}


def test_a_table_lock_on_the_task_results_delays_no_plain_jobs_outcome(connect):
    # A CREATE INDEX (or LOCK TABLE) on jobq_task_result: a plain job's ack, retry and dead
    # letter name no task result (sql.outcomes.ACK_JOBS, RETRY_JOB, DEAD_LETTER_JOB), so
    # none waits for the lock; only a task's outcome would.
    operator = connect(autocommit=False)
    operator.execute("LOCK TABLE jobq_task_result IN ACCESS EXCLUSIVE MODE")
    for n in range(50):
        record.enqueue(f"plain {n}")
    failing = always_fails.enqueue("retried, then dead")  # backoff 0.25-0.5 s (testproject)
    worker, thread = start_worker(concurrency=2)
    try:
        wait_until(
            lambda: not Job.objects.exists(),
            what="the plain jobs' outcomes while the task results' table is locked",
        )
        assert Effect.objects.count() == 50
        dead = DeadLetter.objects.get(job_id=failing.pk)
        assert dead.attempts == 2  # retried once, then dead-lettered: both during the lock
    finally:
        operator.rollback()
        worker.stop()
        thread.join(timeout=30)
    assert not thread.is_alive()


def test_a_table_lock_on_the_dead_letters_delays_only_that_jobs_dead_letter(connect):
    # A CREATE INDEX (or LOCK TABLE) on jobq_dead_letter: the dead letter's insert waits a
    # moment at most (sql.outcomes.SET_SHORT_LOCK_TIMEOUT), then the outcome stays pending
    # while the worker records the others and claims on.
    operator = connect(autocommit=False)
    operator.execute("LOCK TABLE jobq_dead_letter IN ACCESS EXCLUSIVE MODE")
    failing = always_fails.using(max_attempts=1).enqueue("no luck")
    healthy = [record.enqueue(f"healthy {n}") for n in range(50)]
    worker, thread = start_worker(concurrency=2)
    try:
        wait_until(
            lambda: Effect.objects.count() == len(healthy),
            what="the healthy jobs to run while the dead-letter table is locked",
        )
        assert Job.objects.filter(pk=failing.pk, status="running").exists()
        operator.rollback()  # the lock is released
        wait_until(
            lambda: DeadLetter.objects.filter(job_id=failing.pk).exists(),
            what="the pending dead letter to be written once the table is free",
        )
        wait_until(lambda: not Job.objects.exists(), what="every job recorded")
    finally:
        operator.rollback()
        worker.stop()
        thread.join(timeout=30)
    assert not thread.is_alive()
