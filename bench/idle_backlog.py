"""A backlog that arrives at an idle worker: how long one worker takes to drain it.

Not a test: it measures. A worker's main connection prepares its statements, and PostgreSQL
keeps a generic plan made while ``jobq_job`` was empty however much the table grows (see
``django_jobq/worker/plans.py``). Each run, on the benchmark database:

1. empties ``jobq_job`` and ANALYZEs it (an idle queue, as autovacuum leaves it); with
   ``--no-autovacuum``, turns autovacuum off for the table (as on a server that runs
   without it, or whose autovacuum is far behind), and back on at the end;
2. ``idle`` (the case): starts ``jobq_worker --concurrency 32`` (bench/benchsite's no-op
   handler), runs :data:`SETTLING_JOBS` jobs through it one at a time (its statements are
   prepared and planned on the empty table), then inserts the backlog in one statement
   (``million.FILL_READY``) that also wakes the workers, and times from that commit until
   no job is left;
   ``backlog`` (the control): inserts the backlog first, then starts the worker, and times
   from its start until no job is left (the worker's start-up included);
   ``again`` (``--orders again,again-fresh``): a first backlog drained by the worker, then
   ``VACUUM`` (which cuts the emptied table to nothing) and ``ANALYZE``, the settling jobs,
   and the second backlog, timed as ``idle``; ``again-fresh`` (its control): the same
   history, but the worker that drained the first backlog stops after the settling jobs,
   and a new one starts after the second backlog is inserted, timed as ``backlog``;
3. stops the worker (SIGTERM) and checks that no job and no dead letter is left.

A run that has not drained after ``--give-up`` seconds reports the jobs it ran by then.

Usage (from the repository root)::

    .venv/bin/python bench/idle_backlog.py --database-url postgres://postgres@127.0.0.1:5440/jobq_bench
    .venv/bin/python bench/idle_backlog.py --no-autovacuum --jobs 100000 --reps 2
    .venv/bin/python bench/idle_backlog.py --orders again,again-fresh
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import psycopg
from claims import DEFAULT_DATABASE_URL, prepare_database
from million import FILL_READY

BENCH_DIR = Path(__file__).resolve().parent
QUEUE = "bench"
KIND = "bench.noop"
#: Jobs run one at a time through the idle worker before the backlog: more than the five
#: custom plans PostgreSQL makes of a prepared statement before it may keep a generic one.
SETTLING_JOBS = 10
CONCURRENCY = 32
#: Seconds between two looks at the jobs left.
POLL = 0.1

WAKE = "SELECT pg_notify('jobq', %(queue)s)"


def jobs_left(conn: psycopg.Connection) -> int:
    row = conn.execute("SELECT count(*) FROM jobq_job").fetchone()
    assert row is not None
    return int(row[0])


def wait_until_empty(conn: psycopg.Connection, give_up: float) -> float | None:
    """Seconds until ``jobq_job`` is empty, or ``None`` past ``give_up`` seconds."""
    started = time.perf_counter()
    while jobs_left(conn):
        if time.perf_counter() - started > give_up:
            return None
        time.sleep(POLL)
    return time.perf_counter() - started


def fill(conn: psycopg.Connection, rows: int) -> None:
    """``rows`` ready jobs in one transaction that wakes the workers at its commit."""
    with conn.transaction():
        conn.execute(FILL_READY, {"queue": QUEUE, "kind": KIND, "rows": rows})
        conn.execute(WAKE, {"queue": QUEUE})


def start_worker(database_url: str, record_dir: str) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "benchsite.settings",
        "JOBQ_BENCH_SYSTEM": "jobq",
        "JOBQ_BENCH_DATABASE_URL": database_url,
        "JOBQ_BENCH_RECORD_DIR": record_dir,
        "PYTHONPATH": os.pathsep.join([str(BENCH_DIR), str(BENCH_DIR.parent)]),
    }
    command = [sys.executable, "-m", "django", "jobq_worker", "--concurrency", str(CONCURRENCY)]
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait_for_listener(conn: psycopg.Connection) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        row = conn.execute(
            "SELECT 1 FROM pg_stat_activity WHERE application_name LIKE 'jobq listener %%' "
            "AND datname = current_database() AND state = 'idle'"
        ).fetchone()
        if row:
            return
        time.sleep(POLL)
    raise SystemExit("the worker's listener did not connect within 30 s")


def settle(conn: psycopg.Connection) -> None:
    """Run :data:`SETTLING_JOBS` jobs one at a time through the worker."""
    wait_for_listener(conn)
    for _ in range(SETTLING_JOBS):
        fill(conn, 1)
        if wait_until_empty(conn, 30) is None:
            raise SystemExit("a single job did not run within 30 s")


def empty_the_table(conn: psycopg.Connection) -> None:
    """The drained table as autovacuum leaves it: cut to nothing, analysed empty."""
    conn.execute("VACUUM jobq_job")
    conn.execute("ANALYZE jobq_job")


def stop(worker: subprocess.Popen[bytes]) -> None:
    worker.send_signal(signal.SIGTERM)
    worker.wait(timeout=60)


def run_once(database_url: str, order: str, jobs: int, give_up: float) -> tuple[float | None, int]:
    """One run; returns (seconds to drain or ``None``, jobs run)."""
    with (
        psycopg.connect(database_url, autocommit=True) as conn,
        tempfile.TemporaryDirectory(prefix="jobq-idle-backlog-") as record_dir,
    ):
        conn.execute("TRUNCATE jobq_job, jobq_dead_letter")
        conn.execute("ANALYZE jobq_job")
        if order in ("backlog", "again", "again-fresh"):
            fill(conn, jobs)
        worker = start_worker(database_url, record_dir)
        try:
            if order in ("again", "again-fresh"):
                if wait_until_empty(conn, give_up) is None:
                    raise SystemExit(f"the first backlog did not drain within {give_up} s")
                empty_the_table(conn)
                settle(conn)
                if order == "again-fresh":
                    stop(worker)
                    fill(conn, jobs)
                    worker = start_worker(database_url, record_dir)
            started = time.perf_counter()
            if order in ("idle", "again"):
                if order == "idle":
                    settle(conn)
                fill(conn, jobs)
                started = time.perf_counter()
            drained = wait_until_empty(conn, give_up)
            if drained is not None:
                drained = time.perf_counter() - started
            ran = jobs - jobs_left(conn)
        finally:
            stop(worker)
        row = conn.execute("SELECT count(*) FROM jobq_dead_letter").fetchone()
        if drained is not None and row is not None and row[0]:
            raise SystemExit(f"{row[0]} dead letters: broken")
        return drained, ran


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--no-autovacuum", action="store_true")
    parser.add_argument("--give-up", type=float, default=180.0, help="seconds")
    parser.add_argument(
        "--orders",
        default="idle,backlog",
        help="comma-separated: idle, backlog, again, again-fresh",
    )
    args = parser.parse_args(argv)
    database_url = args.database_url or os.environ.get("DATABASE_URL", DEFAULT_DATABASE_URL)
    prepare_database(database_url)
    with psycopg.connect(database_url, autocommit=True) as conn:
        if args.no_autovacuum:
            conn.execute("ALTER TABLE jobq_job SET (autovacuum_enabled = off)")
        try:
            print(
                f"{args.jobs:,} no-op jobs, jobq_worker --concurrency {CONCURRENCY}, "
                f"autovacuum {'off' if args.no_autovacuum else 'on'} for jobq_job"
            )
            print(f"{'order':>8}  {'seconds':>8}  {'jobs/s':>8}")
            for _ in range(args.reps):
                for order in args.orders.split(","):
                    drained, ran = run_once(database_url, order, args.jobs, args.give_up)
                    if drained is None:
                        print(
                            f"{order:>8}  {'> ' + str(int(args.give_up)):>8}  "
                            f"{ran / args.give_up:>8,.0f}  ({ran:,} ran)"
                        )
                    else:
                        print(f"{order:>8}  {drained:>8.1f}  {args.jobs / drained:>8,.0f}")
                    sys.stdout.flush()
        finally:
            if args.no_autovacuum:
                conn.execute("ALTER TABLE jobq_job RESET (autovacuum_enabled)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
