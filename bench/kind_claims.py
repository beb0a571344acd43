"""Claim latency with a kind filter: p50/p99 of one ``claims.claim`` call, per scenario.

Not a test: it measures. One connection claims ``--limit`` jobs per call from queue
``bench`` (``CLAIM_JOBS_ONE_QUEUE``) and acks them (the ack is not timed), ``--claims``
times after 50 warm-up claims; the script reports the claim's p50, p99 and maximum. Before
each scenario it empties ``jobq_job``, loads it with one ``INSERT ... generate_series`` and
runs ``VACUUM ANALYZE jobq_job``. Scenarios:

- ``one-kind``: 50,000 ready jobs of the claimed kind;
- ``200-kinds``: the same jobs; the worker has 200 kinds (199 without jobs);
- ``200-kinds-with-jobs``: 50,000 ready jobs spread over the worker's 200 kinds;
- ``unserved-head``: 100,000 ready jobs of a kind nobody claims at the head of the queue
  (earlier ``run_at``), then 50,000 of the claimed kind.

It runs whatever django_jobq is importable, so the same script measures a commit from
before claims took ``kinds`` (``git worktree add /tmp/old <commit>``, then run this file
with ``PYTHONPATH=/tmp/old``): that claim ignores kinds (it takes every kind, the unserved
head included), and the script also times the naive filter on it, the old statement with
``AND kind = ANY(kinds)`` added to its ready arm, which walks the unserved jobs. Each code
version needs its own database (its own migrations).

Usage (from the repository root; the server's own settings, printed first)::

    .venv/bin/python bench/kind_claims.py --database-url postgres://postgres@127.0.0.1/kinds_new
    PYTHONPATH=/tmp/old .venv/bin/python bench/kind_claims.py --database-url .../kinds_old
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import time
from collections.abc import Callable
from typing import Any

from claims import code_version, prepare_database

QUEUE = "bench"
KIND = "bench.noop"
OTHER_KINDS = [f"bench.kind{n:03}" for n in range(199)]
WARM_UP = 50

_LOAD = """
INSERT INTO jobq_job (queue, kind, payload, run_at, max_attempts, visibility_timeout)
SELECT 'bench', {kind}, '{{}}', now() - interval '1 hour' + n * interval '1 ms' + {offset},
       5, interval '30 s'
FROM generate_series(1, {rows}) AS n
"""
SCENARIOS: dict[str, tuple[list[str], list[str]]] = {
    # name: (loads, the worker's kinds)
    "one-kind": ([_LOAD.format(kind=f"'{KIND}'", offset="interval '0'", rows=50_000)], [KIND]),
    "200-kinds": (
        [_LOAD.format(kind=f"'{KIND}'", offset="interval '0'", rows=50_000)],
        [KIND, *OTHER_KINDS],
    ),
    "200-kinds-with-jobs": (
        [
            _LOAD.format(
                kind=f"CASE WHEN n % 200 = 0 THEN '{KIND}' "
                "ELSE 'bench.kind' || lpad((n % 200 - 1)::text, 3, '0') END",
                offset="interval '0'",
                rows=50_000,
            )
        ],
        [KIND, *OTHER_KINDS],
    ),
    "unserved-head": (
        [
            _LOAD.format(kind="'bench.unserved'", offset="- interval '1 hour'", rows=100_000),
            _LOAD.format(kind=f"'{KIND}'", offset="interval '0'", rows=50_000),
        ],
        [KIND],
    ),
}


def load(conn: Any, statements: list[str]) -> None:
    conn.execute("TRUNCATE jobq_job")
    for statement in statements:
        conn.execute(statement)
    conn.execute("VACUUM ANALYZE jobq_job")


def measure(conn: Any, claim: Callable[[Any], list[Any]], claims: int) -> list[float]:
    """Milliseconds of each timed claim (each claim's jobs acked, untimed)."""
    from django_jobq import outcomes

    cursor = conn.cursor()
    timings = []
    for n in range(WARM_UP + claims):
        started = time.perf_counter()
        jobs = claim(cursor)
        elapsed = time.perf_counter() - started
        if not jobs:
            raise SystemExit("the queue ran dry: load more jobs or claim fewer times")
        outcomes.ack(cursor, [job.lease for job in jobs])
        if n >= WARM_UP:
            timings.append(elapsed * 1000)
    return timings


def naive_claim(limit: int, kinds: list[str]) -> Callable[[Any], list[Any]]:
    """The old claim with ``AND kind = ANY(kinds)`` in its ready arm (old code only)."""
    from django_jobq import claims, sql

    arm = "WHERE status = 'ready' AND run_at <= now() AND queue = %(queue)s"
    statement = sql.claims.CLAIM_JOBS_ONE_QUEUE.replace(arm, arm + " AND kind = ANY(%(kinds)s)")
    assert statement != sql.claims.CLAIM_JOBS_ONE_QUEUE

    def claim(cursor: Any) -> list[Any]:
        params = {"limit": limit, "worker_id": "bench", "queue": QUEUE, "kinds": kinds}
        params["flow_digest"] = None
        cursor.execute(statement, params)
        return [claims._claimed_job(*row) for row in cursor.fetchall()]

    return claim


def report(name: str, timings: list[float]) -> None:
    cuts = statistics.quantiles(timings, n=100)
    print(
        f"{name:38} p50 {cuts[49]:7.3f} ms   p99 {cuts[98]:7.3f} ms   "
        f"max {max(timings):7.3f} ms   ({len(timings)} claims)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--claims", type=int, default=2000)
    parser.add_argument("--limit", type=int, default=10)
    parser.add_argument("--scenarios", nargs="*", default=list(SCENARIOS))
    options = parser.parse_args()
    prepare_database(options.database_url)
    from django_jobq import claims, db

    takes_kinds = "kinds" in inspect.signature(claims.claim).parameters
    with db.connect(application_name="jobq-bench-kind-claims") as conn:
        settings = ("server_version", "fsync", "synchronous_commit", "autovacuum", "jit")
        print(", ".join(f"{s}={conn.execute(f'SHOW {s}').fetchone()[0]}" for s in settings))
        print(f"django_jobq: {code_version()}; claim takes kinds: {takes_kinds}")
        print(f"limit {options.limit}, {options.claims} claims after {WARM_UP} warm-up ones")
        for name in options.scenarios:
            statements, kinds = SCENARIOS[name]
            load(conn, statements)
            extra = {"kinds": kinds} if takes_kinds else {}

            def claim(cursor: Any, extra: dict[str, Any] = extra) -> list[Any]:
                return claims.claim(
                    cursor, worker_id="bench", limit=options.limit, queues=[QUEUE], **extra
                )

            report(name, measure(conn, claim, options.claims))
            if not takes_kinds and name in ("unserved-head", "200-kinds-with-jobs"):
                load(conn, statements)
                naive = naive_claim(options.limit, kinds)
                report(f"{name} (naive kind = ANY)", measure(conn, naive, options.claims))


if __name__ == "__main__":
    main()
