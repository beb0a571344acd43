"""Observability benchmark: what the gauge and statistics statements cost on a large queue.

Not a test: it measures. For each N (100,000 and 1,000,000 live jobs by default) the script
empties the queue's tables and loads N jobs with one ``INSERT … SELECT generate_series``
(not timed): 5 queues, 3 priorities, 90% ready and due, 5% scheduled an hour ahead, 5%
running with a live lease; plus 10,000 dead letters of 20 kinds. Then ``VACUUM ANALYZE``,
and each statement runs ``--reps`` times (median and min reported, in ms):

- ``QUEUE_STATES``: depth by state and oldest ready age of every queue (``jobq_stats``, the
  dashboard, the metrics view: once per scrape, cached 5 s);
- ``SAMPLE_QUEUES`` (the once-a-minute sample, one worker per minute), and
  ``QUEUES_SAMPLED_THIS_MINUTE`` (what the other workers run instead);
- the dead letters grouped by queue and kind (the ORM query of ``stats``);
- ``UPSERT_OUTCOME_ROLLUPS`` of 20 (queue, kind) rows (each worker, every 5 s);
- a claim of 10 jobs from one queue, then releasing them (the claim now joins its lapsed
  leases to report reclaims and pickup latency).

PostgreSQL runs with the server's own settings (durability printed, never changed). The
database defaults to ``jobq_bench_gauges``; its tables are truncated.

Usage (from the repository root)::

    .venv/bin/python bench/gauges.py                       # N = 100,000 and 1,000,000
    .venv/bin/python bench/gauges.py --sizes 10000 --reps 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from claims import prepare_database

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/jobq_bench_gauges"
SIZES = (100_000, 1_000_000)
#: The kinds of the loaded jobs (``LOAD_JOBS``), which the measured claim takes.
GAUGE_KINDS = [f"bench.kind{n}" for n in range(20)]
REPS = 5

LOAD_JOBS = """
INSERT INTO jobq_job (queue, kind, payload, priority, status, run_at, attempts, max_attempts,
                      visibility_timeout, lease_deadline, worker_id, created_at)
SELECT 'queue-' || (n %% 5), 'bench.kind' || (n %% 20), jsonb_build_object('n', n), n %% 3,
       CASE WHEN n %% 20 = 0 THEN 'running' ELSE 'ready' END,
       CASE WHEN n %% 20 = 1 THEN now() + interval '1 hour'
            ELSE now() - make_interval(secs => n / 1000.0) END,
       CASE WHEN n %% 20 = 0 THEN 1 ELSE 0 END, 5, interval '30 seconds',
       CASE WHEN n %% 20 = 0 THEN now() + interval '1 hour' END,
       CASE WHEN n %% 20 = 0 THEN 'bench:1' ELSE '' END,
       now() - make_interval(secs => n / 1000.0)
FROM generate_series(1, %(count)s) AS n
"""

LOAD_DEAD_LETTERS = """
INSERT INTO jobq_dead_letter (job_id, queue, kind, payload, priority, attempts, max_attempts,
                              visibility_timeout, created_at, reason, last_error, traceback,
                              died_at)
SELECT n, 'queue-' || (n % 5), 'bench.kind' || (n % 20), '{}', 0, 5, 5,
       interval '30 seconds', now(), 'max attempts exceeded', 'RuntimeError: boom', '', now()
FROM generate_series(1, 10000) AS n
"""


def timed(reps: int, run: Callable[[], Any]) -> tuple[float, float]:
    """Median and minimum milliseconds of ``reps`` calls of ``run``."""
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        run()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), min(times)


def measure(count: int, reps: int) -> list[tuple[str, float, float]]:
    from django_jobq import claims, db, leases, sql, stats
    from django_jobq.worker.history import OutcomeRollups

    with db.connect(application_name="jobq bench gauges") as conn:
        conn.execute(
            "TRUNCATE jobq_job, jobq_dead_letter, jobq_queue_sample, jobq_outcome_rollup "
            "RESTART IDENTITY"
        )
        conn.execute(LOAD_JOBS, {"count": count})
        conn.execute(LOAD_DEAD_LETTERS)
        conn.execute("VACUUM ANALYZE jobq_job")
        conn.execute("VACUUM ANALYZE jobq_dead_letter")
        cursor = conn.cursor()

        def claim_and_release() -> None:
            jobs = claims.claim(
                cursor, worker_id="bench", limit=10, queues=["queue-2"], kinds=GAUGE_KINDS
            )
            leases.release(cursor, [job.lease for job in jobs])

        def flush_rollups() -> None:
            rollups = OutcomeRollups()
            for n in range(20):
                rollups.add(f"queue-{n % 5}", f"bench.kind{n}", "succeeded", 0.01 * n)
            rollups.flush(cursor)

        conn.execute(sql.stats.SAMPLE_QUEUES)  # this minute is sampled: the others' skip path
        return [
            ("QUEUE_STATES", *timed(reps, lambda: conn.execute(sql.stats.QUEUE_STATES).fetchall())),
            (
                "SAMPLE_QUEUES (the scan)",
                *timed(reps, lambda: conn.execute(sql.stats.SAMPLE_QUEUES).fetchall()),
            ),
            (
                "QUEUES_SAMPLED_THIS_MINUTE",
                *timed(reps, lambda: conn.execute(sql.stats.QUEUES_SAMPLED_THIS_MINUTE).fetchall()),
            ),
            ("dead letters by kind", *timed(reps, stats.dead_letter_groups)),
            ("UPSERT_OUTCOME_ROLLUPS, 20 rows", *timed(reps, flush_rollups)),
            ("claim 10 + release", *timed(reps, claim_and_release)),
        ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="comma-separated N")
    parser.add_argument("--reps", type=int, default=REPS)
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args(argv)
    database_url = args.database_url or os.environ.get("DATABASE_URL", DEFAULT_DATABASE_URL)
    prepare_database(database_url)
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT version(), current_setting('jit'), current_setting('fsync')")
        version, jit, fsync = cursor.fetchone()
    print(f"{version.split(',')[0]}; jit={jit}; fsync={fsync}")
    print(f"{'live jobs':>10}  {'statement':<32}  {'median ms':>9}  {'min ms':>8}")
    for count in (int(size) for size in args.sizes.split(",")):
        for name, median, fastest in measure(count, args.reps):
            print(f"{count:>10,}  {name:<32}  {median:>9.1f}  {fastest:>8.1f}")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
