"""The claim with 1,000,000 rows in ``jobq_job``: still an index scan, and how fast.

The table is filled with one ``INSERT ... SELECT generate_series`` statement, categories
interleaved row by row so the heap is mixed as in a long-lived queue: 40% ready (due now),
30% scheduled (``run_at`` up to a day ahead), 30% running (leased by a worker that is not
there, deadlines an hour or more ahead, so nothing is reclaimed during the run). A fifth of
the ready and scheduled rows belong to another queue with a higher priority, which the
claimer does not serve: ahead of its jobs in the all-queues claim order, so the one-queue
claim must seek by queue (``jobq_job_claim_idx``) rather than walk past them. Then
``VACUUM ANALYZE`` and a ``CHECKPOINT``: the steady state autovacuum keeps a busy table in.

Measured: the plan of the one-queue claim statement (``EXPLAIN (ANALYZE, BUFFERS)`` in a
transaction that is rolled back: the real plan, its buffers and time, nothing claimed), and
one claimer's claim + ``ack_many`` latency over ``claims`` iterations at batch sizes 1 and
10, next to the same loop on a table holding only the jobs it claims.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import psycopg
from measure import HarnessError, summary_ms

QUEUE = "bench"
OTHER_QUEUE = "bench-other"
KIND = "bench.noop"

#: Categories by ``n % 10``: 0-3 ready, 4-6 scheduled, 7-9 running; ``n % 5 = 0`` (a fifth
#: of the ready and scheduled rows) on the other queue, at priority 1.
FILL = """
INSERT INTO jobq_job (queue, kind, payload, status, run_at, attempts, max_attempts,
                      visibility_timeout, lease_deadline, worker_id, started_at, priority)
SELECT CASE WHEN n %% 5 = 0 THEN %(other_queue)s ELSE %(queue)s END,
       %(kind)s, jsonb_build_object('n', n),
       CASE WHEN n %% 10 >= 7 THEN 'running' ELSE 'ready' END,
       CASE WHEN n %% 10 BETWEEN 4 AND 6 THEN now() + make_interval(secs => 60 + n %% 86400)
            ELSE now() - make_interval(secs => n %% 3600) END,
       CASE WHEN n %% 10 >= 7 THEN 1 ELSE 0 END,
       5, interval '30 seconds',
       CASE WHEN n %% 10 >= 7 THEN now() + make_interval(secs => 3600 + n %% 3600) END,
       CASE WHEN n %% 10 >= 7 THEN 'bench-filler' ELSE '' END,
       CASE WHEN n %% 10 >= 7 THEN now() END,
       CASE WHEN n %% 5 = 0 THEN 1 ELSE 0 END
FROM generate_series(1, %(rows)s) AS n
"""

#: Only ready jobs, numbered 0 to rows - 1 (payload ``{"n": n}``, as the benchmark's
#: handlers record them), for the small-table baseline and bench/backlog.py's backlogs.
FILL_READY = """
INSERT INTO jobq_job (queue, kind, payload, max_attempts, visibility_timeout)
SELECT %(queue)s, %(kind)s, jsonb_build_object('n', n), 5, interval '30 seconds'
FROM generate_series(0, %(rows)s - 1) AS n
"""


def plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from plan_nodes(child)


def explain_claim(conn: psycopg.Connection[Any], limit: int) -> dict[str, Any]:
    """The claim's executed plan, rolled back: scans used, buffers, execution time."""
    from django_jobq import sql

    try:  # a checkout with claim positions: read from the start, as a fresh worker does
        from django_jobq.claim_positions import FROM_THE_START
    except ImportError:
        FROM_THE_START = {}
    statement = "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql.claims.CLAIM_JOBS_ONE_QUEUE
    params = {
        **FROM_THE_START,
        "limit": limit,
        "queue": QUEUE,
        "worker_id": "bench-explain",
        "kinds": [KIND],
        "front": limit * sql.claims.CLAIM_FRONT_FACTOR,
        "flow_digest": None,  # no flow control: the claim compares no digest
        "claim_note": None,  # no task to start: the claim keeps no note of its leases
    }
    with conn.transaction(force_rollback=True):
        row = conn.execute(statement, params).fetchone()
    assert row is not None
    document = row[0] if isinstance(row[0], list) else json.loads(row[0])
    top = document[0]
    nodes = list(plan_nodes(top["Plan"]))
    scans = [
        f"{node['Node Type']} on {node.get('Relation Name', '?')}"
        + (f" using {node['Index Name']}" if "Index Name" in node else "")
        for node in nodes
        if "Scan" in node["Node Type"] and node.get("Relation Name") == "jobq_job"
    ]
    buffers = top["Plan"].get("Shared Hit Blocks", 0) + top["Plan"].get("Shared Read Blocks", 0)
    return {
        "scans": scans,
        # Of the jobs table: the flow-control digest reads its two small tables whole.
        "seq_scan": any(
            node["Node Type"] == "Seq Scan" and node.get("Relation Name") == "jobq_job"
            for node in nodes
        ),
        "buffers": buffers,
        "execution_ms": top.get("Execution Time", 0.0),
        "planning_ms": top.get("Planning Time", 0.0),
    }


def claim_loop(conn: psycopg.Connection[Any], iterations: int, batch: int) -> dict[str, Any]:
    """``iterations`` x (claim ``batch`` + ack them), timed; every claim must be full."""
    from django_jobq import claims, outcomes

    cursor = conn.cursor()
    claim_times: list[int] = []
    acks: list[int] = []
    started = time.perf_counter()
    for _ in range(iterations):
        t0 = time.perf_counter_ns()
        jobs = claims.claim(
            cursor, worker_id="bench-million", limit=batch, queues=[QUEUE], kinds=[KIND]
        )
        t1 = time.perf_counter_ns()
        if len(jobs) != batch:
            raise HarnessError(f"claim of {batch} returned {len(jobs)} jobs")
        acked = outcomes.ack(cursor, [job.lease for job in jobs])
        t2 = time.perf_counter_ns()
        if len(acked) != batch:
            raise HarnessError(f"ack of {batch} jobs accepted {len(acked)}")
        claim_times.append(t1 - t0)
        acks.append(t2 - t1)
    seconds = time.perf_counter() - started
    return {
        "batch": batch,
        "iterations": iterations,
        "jobs_per_second": iterations * batch / seconds,
        "claim_ms": summary_ms(claim_times),
        "ack_ms": summary_ms(acks),
    }


def count_by_status(conn: psycopg.Connection[Any]) -> dict[str, int]:
    """Rows by ``"<queue> <ready|scheduled|running>"``."""
    rows = conn.execute(
        "SELECT queue || ' ' || CASE WHEN status = 'running' THEN 'running'"
        " WHEN run_at > now() THEN 'scheduled' ELSE 'ready' END, count(*)"
        " FROM jobq_job GROUP BY 1"
    ).fetchall()
    return {str(kind): int(count) for kind, count in rows}


def run(conn: psycopg.Connection[Any], rows: int, iterations: int) -> dict[str, Any]:
    """Fill, explain, time; then the same on a small table. Leaves ``jobq_job`` empty."""
    batches = (1, 10)
    result: dict[str, Any] = {"rows": rows, "iterations": iterations}
    try:
        conn.execute("TRUNCATE jobq_job RESTART IDENTITY")
        started = time.perf_counter()
        conn.execute(FILL, {"queue": QUEUE, "other_queue": OTHER_QUEUE, "kind": KIND, "rows": rows})
        conn.execute("VACUUM (ANALYZE) jobq_job")
        conn.execute("CHECKPOINT")
        result["fill_seconds"] = time.perf_counter() - started
        result["table"] = count_by_status(conn)
        needed = iterations * sum(batches)
        ready = f"{QUEUE} ready"
        if result["table"].get(ready, 0) < needed:
            raise HarnessError(f"{rows:,} rows hold fewer than the {needed:,} ready jobs needed")
        result["explain"] = explain_claim(conn, 10)
        result["large"] = [claim_loop(conn, iterations, batch) for batch in batches]
        after = count_by_status(conn)
        expected = {**result["table"], ready: result["table"][ready] - needed}
        if after != expected:
            raise HarnessError(f"after the claims the table holds {after}, not {expected}")
        conn.execute("TRUNCATE jobq_job RESTART IDENTITY")
        conn.execute(FILL_READY, {"queue": QUEUE, "kind": KIND, "rows": needed})
        conn.execute("VACUUM (ANALYZE) jobq_job")
        result["explain_small"] = explain_claim(conn, 10)
        result["small"] = [claim_loop(conn, iterations, batch) for batch in batches]
        left = conn.execute("SELECT count(*) FROM jobq_job").fetchone()
        if left and left[0]:
            raise HarnessError(f"{left[0]} jobs left after the small-table loop")
    finally:
        conn.execute("TRUNCATE jobq_job RESTART IDENTITY")
    if result["explain"]["seq_scan"]:
        raise HarnessError(f"the claim used a sequential scan: {result['explain']['scans']}")
    return result
