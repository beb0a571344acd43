"""Redrive benchmark: how long turning N dead letters back into jobs takes.

Not a test: it measures. For each N (10,000 and 100,000 by default) and repetition, the
script empties ``jobq_job`` and ``jobq_dead_letter``, inserts N dead letters (one
``INSERT … SELECT generate_series`` statement, not timed), then times
``django_jobq.operations.redrive(DeadLetter.objects.all())`` — what the admin's "select all"
redrive does: read the matching ids, then one statement per batch of 10,000 that inserts the
jobs and deletes the dead letters. Each run checks that exactly N jobs exist afterwards,
each with attempts 0, and no dead letter is left.

PostgreSQL runs with the server's own durability settings (printed, never changed).

Usage (from the repository root)::

    .venv/bin/python bench/redrive.py                  # N = 10,000 and 100,000, 3 repetitions
    .venv/bin/python bench/redrive.py --keys              # dead letters with idempotency keys
    .venv/bin/python bench/redrive.py --sizes 1000000 --reps 1
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Sequence

from claims import DEFAULT_DATABASE_URL, prepare_database

SIZES = (10_000, 100_000)
REPS = 3

# Dead letters that look like the real thing: a payload, an error and a traceback each.
LOAD_DEAD_LETTERS = """
INSERT INTO jobq_dead_letter (job_id, queue, kind, payload, priority, attempts, max_attempts,
                              visibility_timeout, created_at, reason, last_error, traceback,
                              died_at)
SELECT n, 'default', 'bench.redrive', jsonb_build_object('order_id', n), 0, 5, 5,
       interval '30 seconds', now(), 'max attempts exceeded', 'RuntimeError: boom',
       repeat('Traceback line\n', 20), now()
FROM generate_series(1, %(count)s) AS n
"""

# With --keys, every dead letter also carries an idempotency key (redrive then checks each
# key against live jobs and the other dead letters of the batch).
SET_KEYS = "UPDATE jobq_dead_letter SET idempotency_key = 'order-' || job_id"


def run_once(count: int, keys: bool) -> float:
    from django.db import connection

    from django_jobq.models import DeadLetter, Job
    from django_jobq.operations import redrive

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE jobq_job, jobq_dead_letter RESTART IDENTITY")
        cursor.execute(LOAD_DEAD_LETTERS, {"count": count})
        if keys:
            cursor.execute(SET_KEYS)
        cursor.execute("ANALYZE jobq_dead_letter")
    started = time.perf_counter()
    created = redrive(DeadLetter.objects.all())
    elapsed = time.perf_counter() - started
    jobs = Job.objects.filter(attempts=0, kind="bench.redrive").count()
    if (created, jobs, DeadLetter.objects.count()) != (count, count, 0):
        raise SystemExit(f"redrive of {count} created {created}, found {jobs} jobs: broken")
    return elapsed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="comma-separated N")
    parser.add_argument("--reps", type=int, default=REPS)
    parser.add_argument("--keys", action="store_true", help="dead letters with idempotency keys")
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args(argv)
    database_url = args.database_url or os.environ.get("DATABASE_URL", DEFAULT_DATABASE_URL)
    prepare_database(database_url)
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('fsync'), current_setting('synchronous_commit')")
        fsync, synchronous_commit = cursor.fetchone()
    print(f"PostgreSQL durability: fsync={fsync} synchronous_commit={synchronous_commit}")
    print(f"{'dead letters':>12}  {'median s':>9}  {'min s':>7}  {'per second':>11}")
    for count in (int(size) for size in args.sizes.split(",")):
        times = [run_once(count, args.keys) for _ in range(args.reps)]
        median = statistics.median(times)
        print(f"{count:>12,}  {median:>9.2f}  {min(times):>7.2f}  {count / median:>11,.0f}")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
