"""A pickup's claim taken apart: the wall time and CPU of a one-job claim, with and without
the durable commit.

Not a test: it measures. One connection, prepared as a worker's main loop prepares its
statements (``worker.PREPARE_THRESHOLD``), claims (``claims.claim``, ``limit`` 4, claim
positions kept, as a ``--concurrency 4`` worker's idle loop does) the one job a second
connection has just committed, ``--claims`` times after 100 warm-up claims; each claimed job
is deleted (untimed). For each claim it records the wall time (``time.perf_counter``) and the
claiming thread's CPU time (``time.thread_time``: Python, psycopg and libpq, not the server).
It does so in two sessions, each on an emptied ``jobq_job``: the server's own
``synchronous_commit`` (``on`` by default: the commit waits for its WAL to reach the disk),
then ``synchronous_commit = off`` for the claimer's session only, so that the difference is
the durable commit's wait. (The claim cannot commit asynchronously in a worker: its attempt
number is the lease's fencing token, and a claim lost in a server crash would give the same
token to the job's next claim.)
Last, it reads ``pg_prepared_statements`` of the claimer's session: how many custom plans
PostgreSQL made for the claim, and how often it ran its generic plan instead (a generic plan
made again after an ``ANALYZE`` is not counted apart). Unlike a worker, the script never
discards its plans as the table grows (``sql.plans``).

Usage (from the repository root; the server's own settings are printed first)::

    .venv/bin/python bench/claim_round_trip.py --database-url postgres://postgres@127.0.0.1/jobq_bench
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from claims import code_version, prepare_database

QUEUE = "bench"
KIND = "bench.noop"
WARM_UP = 100
#: One ready job, committed by the producer's connection before each claim.
_ENQUEUE_ONE = """
INSERT INTO jobq_job (queue, kind, payload, max_attempts, visibility_timeout)
VALUES (%(queue)s, %(kind)s, '{}', 5, interval '30 s')
"""
_DELETE = "DELETE FROM jobq_job WHERE id = ANY(%(ids)s)"
#: The claim's plans in the claimer's session: runs of its generic plan, and custom plans.
_PLANS = """
SELECT COALESCE(sum(generic_plans), 0), COALESCE(sum(custom_plans), 0)
FROM pg_prepared_statements WHERE statement LIKE '%WITH flow AS MATERIALIZED%'
"""


def measure(
    producer: Any, claimer: Any, claims: int
) -> tuple[list[float], list[float], tuple[int, int]]:
    """Milliseconds of wall time and of the claiming thread's CPU time of each timed claim,
    and the claim's (generic, custom) plans in the claimer's session."""
    from django_jobq import claims as claiming
    from django_jobq.claim_positions import ClaimPositions

    cursor = claimer.cursor()
    positions = ClaimPositions()
    walls: list[float] = []
    cpus: list[float] = []
    for n in range(WARM_UP + claims):
        producer.execute(_ENQUEUE_ONE, {"queue": QUEUE, "kind": KIND})
        started, cpu_started = time.perf_counter(), time.thread_time()
        jobs = claiming.claim(
            cursor, worker_id="bench", limit=4, queues=[QUEUE], kinds=[KIND], positions=positions
        )
        wall, cpu = time.perf_counter() - started, time.thread_time() - cpu_started
        if len(jobs) != 1:
            raise SystemExit(f"claim {n} took {len(jobs)} jobs, not the one just enqueued")
        claimer.execute(_DELETE, {"ids": [job.id for job in jobs]})
        if n >= WARM_UP:
            walls.append(wall * 1000)
            cpus.append(cpu * 1000)
    # Not prepared itself (a worker's connection prepares every statement): its own text
    # would match, and count as a run of the claim's generic plan.
    generic, custom = claimer.execute(_PLANS, prepare=False).fetchone()
    return walls, cpus, (generic, custom)


def report(name: str, walls: list[float], cpus: list[float], plans: tuple[int, int]) -> None:
    wall, cpu = statistics.quantiles(walls, n=100), statistics.quantiles(cpus, n=100)
    print(
        f"{name:34} wall p50 {wall[49]:6.3f} p99 {wall[98]:6.3f} ms   "
        f"claimer CPU p50 {cpu[49]:6.3f} p99 {cpu[98]:6.3f} ms   "
        f"plans generic {plans[0]}, custom {plans[1]}   ({len(walls)} claims)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--database-url", required=True, help="the database to create (if missing) and use"
    )
    parser.add_argument(
        "--claims", type=int, default=2000, help="timed claims per session (default 2000)"
    )
    options = parser.parse_args()
    prepare_database(options.database_url)
    from django_jobq import db
    from django_jobq.worker.worker import PREPARE_THRESHOLD

    with db.connect(application_name="jobq-bench-claim-producer") as producer:
        settings = ("server_version", "fsync", "synchronous_commit", "wal_sync_method")
        print(", ".join(f"{s}={producer.execute(f'SHOW {s}').fetchone()[0]}" for s in settings))
        print(f"django_jobq: {code_version()}; {options.claims} claims after {WARM_UP} warm-up")
        for commit in ("the server's", "off"):
            producer.execute("TRUNCATE jobq_job")
            with db.connect(application_name="jobq-bench-claimer") as claimer:
                claimer.prepare_threshold = PREPARE_THRESHOLD
                if commit == "off":
                    claimer.execute("SET synchronous_commit = off")
                walls, cpus, plans = measure(producer, claimer, options.claims)
            report(f"synchronous_commit {commit}", walls, cpus, plans)


if __name__ == "__main__":
    main()
