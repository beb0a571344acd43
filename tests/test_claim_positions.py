"""Claim positions: claims read on from where the worker's last claim got to, so the dead
index entries of jobs already claimed are not walked again while the xmin horizon is held
back; the probe finds what sorts before a position (django_jobq/claim_positions.py). The
positions' own arithmetic is tested in tests/unit/test_claim_positions.py."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from django_jobq import claim_positions, claims, enqueue_many, outcomes, sql
from django_jobq.claim_positions import (
    FROM_THE_START,
    ClaimPositions,
    Position,
)
from django_jobq.models import Job
from django_jobq.worker import Worker
from tests.conftest import wait_until
from tests.poison import insert_row
from tests.testapp.jobs import enqueue_behind, record
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def labels():
    return sorted(Effect.objects.values_list("label", flat=True))


def claim(cursor, positions, limit=10):
    return claims.claim(cursor, worker_id="w", limit=limit, positions=positions)


def ack(cursor, jobs):
    pending = [job.lease for job in jobs]
    while pending:
        busy = outcomes.ack(cursor, pending).busy
        pending = [lease for lease in pending if lease.job_id in busy]


def enqueue(count, **options):
    return enqueue_many([record.using(**options).prepare(f"job-{n}") for n in range(count)])


# -- claims with positions ---------------------------------------------------------------


def front_buffers(connect, positions):
    """Shared buffers the claim's ``front`` CTE reads (EXPLAIN ANALYZE, rolled back)."""
    conn = connect()
    params: dict[str, Any] = {"worker_id": "explain", "kinds": [record.kind], "queue": "default"}
    params["flow_digest"] = params["claim_note"] = None
    params.update(limit=10, front=10 * sql.claims.CLAIM_FRONT_FACTOR)
    params.update(FROM_THE_START if positions is None else positions.params())
    with conn.transaction(force_rollback=True):
        (document,) = conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql.claims.CLAIM_JOBS_ONE_QUEUE, params
        ).fetchone()
    plan = document if isinstance(document, list) else json.loads(document)

    def nodes(node):
        yield node
        for child in node.get("Plans", []):
            yield from nodes(child)

    (front,) = [node for node in nodes(plan[0]["Plan"]) if node.get("Subplan Name") == "CTE front"]
    return front["Shared Hit Blocks"] + front["Shared Read Blocks"]


def test_with_the_horizon_held_back_a_positioned_claim_skips_the_jobs_already_claimed(connect):
    holder = connect(autocommit=False)  # a pg_dump: one snapshot, held throughout
    holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    holder.execute("SELECT count(*) FROM jobq_job")
    enqueue(5000, run_at=timezone.now() - timedelta(hours=1))  # a backlog
    cursor = connect().cursor()
    positions = ClaimPositions()
    claimed = 0
    while claimed < 4500:  # claimed and acked: dead rows nothing can remove
        jobs = claim(cursor, positions, limit=100)
        ack(cursor, jobs)
        claimed += len(jobs)
    positioned, from_the_start = front_buffers(connect, positions), front_buffers(connect, None)
    # From the start, the front visits the 4,500 dead rows' index entries and heap pages.
    assert from_the_start > 10 * positioned, (from_the_start, positioned)
    assert len(claim(cursor, positions, limit=1000)) == 500  # and still takes every job left
    holder.rollback()


def test_a_job_enqueued_behind_the_position_waits_for_the_probe(queue_cursor):
    enqueue(5)
    positions = ClaimPositions()
    ack(queue_cursor, claim(queue_cursor, positions))
    (straggler,) = enqueue(1, run_at=timezone.now() - timedelta(days=1))  # behind the position
    assert claim(queue_cursor, positions) == []
    assert claims.probe_claim_positions(queue_cursor, positions, queues=["default"])
    assert [job.id for job in claim(queue_cursor, positions)] == [straggler.pk]
    assert not claims.probe_claim_positions(queue_cursor, positions)  # nothing behind now


def test_a_transaction_that_commits_within_the_commit_lag_is_claimed_without_the_probe(
    connect, monkeypatch
):
    monkeypatch.setattr(claim_positions, "COMMIT_LAG", 3600.0)  # the test may run slowly
    late = connect(autocommit=False)
    (late_id,) = late.execute(
        "INSERT INTO jobq_job (queue, kind, payload, max_attempts, visibility_timeout) "
        "VALUES ('default', %s, '{\"label\": \"late\"}', 5, interval '30 s') RETURNING id",
        [record.kind],
    ).fetchone()
    (early,) = enqueue(1)  # inserted after the late one, committed first
    cursor = connect().cursor()
    positions = ClaimPositions()
    assert [job.id for job in claim(cursor, positions)] == [early.pk]
    late.commit()
    assert [job.id for job in claim(cursor, positions)] == [late_id]


def test_a_higher_priority_job_is_claimed_at_once_without_the_probe(queue_cursor):
    enqueue(30)
    positions = ClaimPositions()
    claim(queue_cursor, positions)
    (urgent,) = enqueue(1, priority=10, run_at=timezone.now() - timedelta(days=1))
    assert claim(queue_cursor, positions, limit=1)[0].id == urgent.pk
    lower = enqueue(1, priority=-10, run_at=timezone.now() - timedelta(days=1))
    assert {job.id for job in claim(queue_cursor, positions, limit=100)} >= {lower[0].pk}


def test_a_lapsed_lease_hidden_by_a_lock_is_reclaimed_after_the_probe(connect, queue_cursor):
    (job,) = enqueue(1, visibility_timeout=1)
    (held,) = claims.claim(queue_cursor, worker_id="dead", limit=1)
    Job.objects.filter(pk=job.pk).update(lease_deadline=timezone.now() - timedelta(minutes=1))
    locker = connect(autocommit=False)
    locker.execute("SELECT id FROM jobq_job WHERE id = %s FOR UPDATE", [job.pk])
    positions = ClaimPositions()
    assert claim(queue_cursor, positions) == []  # the claim skipped the locked lapse ...
    assert positions.lapsed_from is not None  # ... and now looks only at later lapses
    locker.rollback()
    assert claim(queue_cursor, positions) == []
    assert claims.probe_claim_positions(queue_cursor, positions)
    (reclaimed,) = claim(queue_cursor, positions)
    assert (reclaimed.id, reclaimed.reclaimed, reclaimed.attempt) == (
        job.pk,
        True,
        held.attempt + 1,
    )


@pytest.mark.parametrize("age", [timedelta(hours=1), timedelta(0)], ids=["backlog", "fresh"])
def test_a_claim_reads_past_a_front_that_other_transactions_hold(connect, queue_cursor, age):
    # A backlog: the positions move past the held front. Fresh jobs (within the commit
    # lag): they cannot, and the walk reads past it.
    jobs = enqueue(60, run_at=timezone.now() - age)
    locker = connect(autocommit=False)  # holds the first 20 rows: the whole front of 10 * 2
    locker.execute(
        "SELECT id FROM jobq_job WHERE id = ANY(%s) FOR UPDATE", [[job.pk for job in jobs[:20]]]
    )
    positions = ClaimPositions()
    claimed = claim(queue_cursor, positions, limit=10)
    assert [job.id for job in claimed] == [job.pk for job in jobs[20:30]]
    locker.rollback()
    ack(queue_cursor, claimed)
    taken = drain(queue_cursor, positions)
    # In the backlog, the held rows sort before the positions now: only the probe finds
    # them. Fresh ones are within the commit lag: the claims read them again.
    assert claims.probe_claim_positions(queue_cursor, positions) == (age > timedelta(0))
    taken += drain(queue_cursor, positions)
    assert not Job.objects.exists()
    assert len(taken) == 50


def drain(cursor, positions):
    taken = []
    while batch := claim(cursor, positions, limit=10):
        taken += batch
        ack(cursor, batch)
    return taken


def test_a_poison_row_before_year_one_does_not_break_the_positions(queue_cursor):
    # The only job of its level: its run_at, which Python cannot hold, is the position's.
    poison = insert_row({"run_at": "'4000-01-01 BC'", "priority": "7"}, label="ancient")
    enqueue(3)
    positions = ClaimPositions()
    claimed = claim(queue_cursor, positions)
    assert poison in {job.id for job in claimed} and len(claimed) == 4
    assert positions.levels[7] == Position(claim_positions.NEGATIVE_INFINITY, poison)


# -- the worker ---------------------------------------------------------------------------


def test_a_burst_worker_probes_before_it_stops():
    # The first job enqueues a job a day in the past: behind the worker's position.
    enqueue_behind.enqueue("straggler")
    enqueue(20)
    Worker(concurrency=2, batch_size=4, burst=True, poll_interval=0.05, scheduler=False).run()
    assert "straggler" in labels() and len(labels()) == 21
    assert not Job.objects.exists()


def test_a_running_worker_claims_a_straggler_within_the_probe_interval():
    from tests.test_poison import RunningWorker

    running = RunningWorker()
    try:
        enqueue(10)
        wait_until(lambda: len(labels()) == 10, what="the first jobs")
        enqueue_behind.enqueue("straggler")  # behind the worker's position: the probe's
        wait_until(lambda: "straggler" in labels(), what="the straggler")
    finally:
        running.stop()
