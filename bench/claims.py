"""Claim throughput benchmark: jobs claimed and acked per second by 1, 2, 4 and 8 claimers.

Not a test: it measures. Every cell of the table is one (claimer count, batch size) pair.
For each repetition the script empties ``jobq_job``, loads a fixed number of ready jobs on
one queue with ``django_jobq.enqueue_many``, then starts that many separate processes. Each
opens its own connection (``django_jobq.db.connect()``, autocommit, as the worker does) and
loops ``claims.claim(limit=batch)`` + ``outcomes.ack(...)`` until a claim comes back
empty. Throughput is the jobs claimed and acked divided by the wall time from the shared
start barrier to the last claimer's last ack. Each run checks that every loaded job was
claimed exactly once and acked, and that the table is empty afterwards.

PostgreSQL runs with the server's own durability settings (the script reads and prints
``fsync``, ``synchronous_commit`` and ``full_page_writes``; it never changes them), so each
claim and each ack is one durable commit.

Usage (from the repository root)::

    .venv/bin/python bench/claims.py            # full run: 20,000 jobs, 3 repetitions
    .venv/bin/python bench/claims.py --quick    # smoke run: 2,000 jobs, 1 repetition
    DATABASE_URL=postgres://user@host:5432/db .venv/bin/python bench/claims.py

See bench/README.md for the methodology and how to read the numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import math
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.context import SpawnContext
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

import dj_database_url
import psycopg
from psycopg import sql as pgsql

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/jobq_bench"
QUEUE = "bench"
#: Queue of the optional background jobs (``--background-jobs``), which no claimer serves.
BACKGROUND_QUEUE = "bench-background"
#: An always-empty queue that ``--multi-queue`` claimers also name, so that ``claim`` takes
#: its several-queues statement instead of its one-queue statement.
IDLE_QUEUE = "bench-idle"
KIND = "bench.noop"
CLAIMER_COUNTS = (1, 2, 4, 8)
BATCH_SIZES = (1, 10)
DEFAULT_JOBS = 20_000
DEFAULT_REPS = 3
QUICK_JOBS = 2_000
#: Jobs per INSERT statement while loading (one ``enqueue_many`` call each).
LOAD_CHUNK = 5_000
#: Server settings printed with the results; the benchmark only reads them.
REPORTED_SETTINGS = (
    "fsync",
    "synchronous_commit",
    "full_page_writes",
    "wal_sync_method",
    "commit_delay",
    "shared_buffers",
    "max_connections",
)
#: Seconds to wait for claimer processes to start, and for one run to finish.
START_TIMEOUT = 120.0
RUN_TIMEOUT = 1_800.0


class BenchmarkError(Exception):
    """The benchmark could not run, or a run broke the queue's guarantees."""


# -- setup ---------------------------------------------------------------------------------


def configure_django(database_url: str) -> None:
    """Configure a standalone Django with only django_jobq installed (idempotent)."""
    import django
    from django.conf import settings

    if settings.configured:
        return
    settings.configure(
        INSTALLED_APPS=["django_jobq"],
        DATABASES={"default": dj_database_url.parse(database_url)},
        USE_TZ=True,
        TIME_ZONE="UTC",
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        JOBQ={"DATABASE": "default", "DEFAULT_QUEUE": QUEUE},
    )
    django.setup()


def ensure_database(database_url: str) -> None:
    """Create the benchmark database if it does not exist (via the ``postgres`` database)."""
    config = dj_database_url.parse(database_url)
    name = config["NAME"]
    params: dict[str, Any] = {
        "host": config.get("HOST") or None,
        "port": config.get("PORT") or None,
        "user": config.get("USER") or None,
        "password": config.get("PASSWORD") or None,
    }
    params = {key: value for key, value in params.items() if value is not None}
    with psycopg.connect(dbname="postgres", autocommit=True, **params) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if not exists:
            conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
            print(f"created database {name!r}", file=sys.stderr)


def migrate() -> None:
    from django.core.management import call_command

    call_command("migrate", "django_jobq", verbosity=0, interactive=False)


def prepare_database(database_url: str) -> None:
    """Create the benchmark database if needed, point Django at it and migrate it."""
    ensure_database(database_url)
    configure_django(database_url)
    migrate()


def code_version() -> str:
    """Where the benchmarked django_jobq comes from, with its git commit if it has one."""
    import django_jobq

    package = Path(django_jobq.__file__).resolve().parent

    def git(*args: str) -> str:
        command = ["git", "-C", str(package), *args]
        return subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()

    try:
        commit = git("rev-parse", "--short", "HEAD")
        changed = git("status", "--porcelain", "--", ".")
    except (OSError, subprocess.CalledProcessError):
        return f"{package} (not a git checkout)"
    return f"{package} (git {commit}{', with uncommitted changes' if changed else ''})"


@dataclass(frozen=True)
class MachineFacts:
    cpu_model: str
    logical_cpus: int
    usable_cpus: int
    python: str
    code: str
    django: str
    psycopg: str
    server_version: str
    server_settings: dict[str, str]
    server_is_local: bool


def show_setting(conn: psycopg.Connection[Any], name: str) -> str:
    row = conn.execute(pgsql.SQL("SHOW {}").format(pgsql.Identifier(name))).fetchone()
    return str(row[0]) if row else "?"


def machine_facts(conn: psycopg.Connection[Any], database_url: str) -> MachineFacts:
    import django

    cpu_model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    cpu_model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    server_settings = {name: show_setting(conn, name) for name in REPORTED_SETTINGS}
    version = conn.execute("SELECT version()").fetchone()
    host = dj_database_url.parse(database_url).get("HOST") or ""
    return MachineFacts(
        cpu_model=cpu_model,
        logical_cpus=os.cpu_count() or 0,
        usable_cpus=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0,
        python=platform.python_version(),
        code=code_version(),
        django=django.get_version(),
        psycopg=psycopg.__version__,
        server_version=str(version[0]) if version else "?",
        server_settings=server_settings,
        server_is_local=host in ("", "localhost", "127.0.0.1", "::1") or host.startswith("/"),
    )


def durability_warnings(facts: MachineFacts) -> list[str]:
    """Settings that would make the numbers meaningless as durable-queue numbers."""
    expected = {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"}
    return [
        f"{name} = {facts.server_settings[name]} (default: {value})"
        for name, value in expected.items()
        if facts.server_settings[name] != value
    ]


def enqueue_jobs(count: int, queue: str, priority: int) -> list[int]:
    """Enqueue ``count`` ready jobs with small payloads on ``queue``; return their ids."""
    from django_jobq import enqueue_many

    ids: list[int] = []
    for start in range(0, count, LOAD_CHUNK):
        jobs = [
            # No process registers KIND: the raw claim-and-ack loop below never runs a handler.
            {
                "kind": KIND,
                "payload": {"n": n},
                "queue": queue,
                "priority": priority,
                "allow_unregistered": True,
            }
            for n in range(start, min(start + LOAD_CHUNK, count))
        ]
        ids.extend(job.pk for job in enqueue_many(jobs))
    return ids


def load_jobs(count: int, background: int) -> list[int]:
    """Empty the jobs table, enqueue ``count`` ready jobs on the bench queue and return their
    ids; first enqueue ``background`` ready jobs of higher priority on a queue no claimer
    serves (they stay in the table, ahead of the bench jobs in claim order)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE jobq_job RESTART IDENTITY")
    enqueue_jobs(background, BACKGROUND_QUEUE, priority=1)
    ids = enqueue_jobs(count, QUEUE, priority=0)
    with connection.cursor() as cursor:
        # Fresh statistics, so autovacuum's analyze does not change the plan mid-run, and a
        # checkpoint, so the load's dirty pages are not flushed while claimers run.
        cursor.execute("ANALYZE jobq_job")
        cursor.execute("CHECKPOINT")
    return ids


# -- interference ---------------------------------------------------------------------------


def cpu_jiffies() -> tuple[int, int, int] | None:
    """(busy, total, waiting for the disk) CPU time of the whole host so far, from
    /proc/stat (busy leaves idle and iowait out; guest time, already in user time, is not
    counted twice); None elsewhere."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            values = [int(value) for value in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    total = sum(values[:8])  # user .. steal; guest and guest_nice are inside user and nice
    iowait = values[4] if len(values) > 4 else 0
    return total - values[3] - iowait, total, iowait


def other_databases_commits(conn: psycopg.Connection[Any]) -> dict[int, int]:
    """Transactions committed so far in each of the server's other databases, by oid (their
    workload competes with the benchmark for the server, the WAL and, here, the CPUs)."""
    conn.execute("SELECT pg_stat_clear_snapshot()")
    rows = conn.execute(
        "SELECT datid, xact_commit FROM pg_stat_database"
        " WHERE datname IS NOT NULL AND datname <> current_database()"
    ).fetchall()
    return {int(datid): int(commits) for datid, commits in rows}


def commits_between(start: dict[int, int], end: dict[int, int]) -> int:
    """Commits from ``start`` to ``end``; databases created in between count from zero."""
    return sum(commits - start.get(datid, 0) for datid, commits in end.items())


#: Tiny durable commits timed before each run to measure the server's commit latency.
COMMIT_PROBES = 100


def create_probe_table(conn: psycopg.Connection[Any]) -> None:
    """The commit probe's one-row table (the benchmark's own, beside django_jobq's)."""
    conn.execute("CREATE TABLE IF NOT EXISTS jobq_bench_commit_probe (id int PRIMARY KEY, n int)")
    conn.execute("INSERT INTO jobq_bench_commit_probe VALUES (1, 0) ON CONFLICT (id) DO NOTHING")


def commit_latency_ms(conn: psycopg.Connection[Any], count: int = COMMIT_PROBES) -> float:
    """Median wall time of a one-row UPDATE in autocommit, in milliseconds: a round trip and
    a commit that waits for its WAL flush (a transaction that writes no WAL, such as
    ``SELECT txid_current()``, commits without waiting for the flush)."""
    samples: list[int] = []
    for _ in range(count):
        t0 = time.perf_counter_ns()
        conn.execute("UPDATE jobq_bench_commit_probe SET n = n + 1 WHERE id = 1")
        samples.append(time.perf_counter_ns() - t0)
    return statistics.median(samples) / 1e6


@dataclass(frozen=True)
class Activity:
    """What the host and the server did besides the benchmark during one run."""

    #: Share of the host's CPU time that was busy (all processes, the claimers included).
    host_cpu_busy: float | None
    #: Transactions committed in other databases of the same server.
    other_commits: int
    #: Host load average (1 min) when the run started.
    load_before: float
    #: Median latency of a minimal durable commit measured just before the run, in ms.
    commit_ms: float


class ActivityMeter:
    """Samples host CPU and the server's other databases at the start and end of a run."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        self.load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
        self.commit_ms = commit_latency_ms(conn)
        self.cpu_start: tuple[int, int, int] | None = None
        self.commits_start: dict[int, int] = {}

    def start(self) -> None:
        self.cpu_start = cpu_jiffies()
        self.commits_start = other_databases_commits(self.conn)

    def stop(self) -> Activity:
        cpu_end = cpu_jiffies()
        busy: float | None = None
        if self.cpu_start and cpu_end and cpu_end[1] > self.cpu_start[1]:
            busy = (cpu_end[0] - self.cpu_start[0]) / (cpu_end[1] - self.cpu_start[1])
        return Activity(
            host_cpu_busy=busy,
            other_commits=commits_between(self.commits_start, other_databases_commits(self.conn)),
            load_before=self.load_before,
            commit_ms=self.commit_ms,
        )


# -- one claimer process -------------------------------------------------------------------


@dataclass
class ClaimerResult:
    index: int
    start: float
    end: float
    claimed_ids: list[int] = field(default_factory=list)
    claim_calls: int = 0
    #: Wall time of each claim call that returned jobs, in nanoseconds.
    claim_latencies_ns: list[int] = field(default_factory=list)
    #: Wall time of each ack_many call, in nanoseconds.
    ack_latencies_ns: list[int] = field(default_factory=list)
    #: Claimed ids whose ack was refused (the lease did not hold): must stay empty.
    ack_refused: list[int] = field(default_factory=list)
    error: str | None = None


def claimer(
    database_url: str,
    index: int,
    batch_size: int,
    queues: list[str],
    barrier: Barrier,
    results: Queue[ClaimerResult],
) -> None:
    """Claim and ack until the queue is empty; put a :class:`ClaimerResult` on ``results``."""
    result = ClaimerResult(index=index, start=0.0, end=0.0)
    try:
        configure_django(database_url)
        from django_jobq import claims, db, outcomes

        # The claimers register no handler: they claim ``KIND``. A django_jobq from before
        # claims took ``kinds`` (a commit measured for comparison) claims every kind.
        takes_kinds = "kinds" in inspect.signature(claims.claim).parameters
        kinds: dict[str, Any] = {"kinds": [KIND]} if takes_kinds else {}
        worker_id = f"bench-{os.getpid()}-{index}"
        with db.connect(application_name=f"jobq-bench-claimer-{index}") as conn:
            cursor = conn.cursor()
            cursor.execute("SELECT 1")  # connection fully established before the start
            barrier.wait(timeout=START_TIMEOUT)
            result.start = time.monotonic()
            while True:
                t0 = time.perf_counter_ns()
                jobs = claims.claim(
                    cursor, worker_id=worker_id, limit=batch_size, queues=queues, **kinds
                )
                elapsed = time.perf_counter_ns() - t0
                result.claim_calls += 1
                if not jobs:
                    break
                result.claim_latencies_ns.append(elapsed)
                result.claimed_ids.extend(job.id for job in jobs)
                t0 = time.perf_counter_ns()
                # A row another claimer's statement has just locked is busy, not lost: the
                # worker acks it again a moment later, and so does this loop.
                pending = jobs
                while pending:
                    acked = outcomes.ack(cursor, [job.lease for job in pending])
                    result.ack_refused.extend(
                        job.id for job in pending if job.id not in acked | acked.busy
                    )
                    pending = [job for job in pending if job.id in acked.busy]
                result.ack_latencies_ns.append(time.perf_counter_ns() - t0)
            result.end = time.monotonic()
    except BaseException as exc:  # report every failure to the parent, then exit
        result.error = f"{type(exc).__name__}: {exc}"
        barrier.abort()  # wake the others at once rather than after START_TIMEOUT
    results.put(result)


# -- one run -------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunResult:
    claimers: int
    batch_size: int
    jobs: int
    seconds: float
    per_claimer: list[int]
    activity: Activity
    claim_calls: int
    claim_latencies_ns: list[int]
    ack_latencies_ns: list[int]

    @property
    def jobs_per_second(self) -> float:
        return self.jobs / self.seconds


def verify(loaded: Sequence[int], results: Sequence[ClaimerResult]) -> list[str]:
    """Every loaded job claimed exactly once and acked; problems as readable lines."""
    problems: list[str] = []
    claimed_by: dict[int, list[int]] = {}
    for result in results:
        for job_id in result.claimed_ids:
            claimed_by.setdefault(job_id, []).append(result.index)
    total = sum(len(result.claimed_ids) for result in results)
    if total != len(loaded):
        problems.append(f"claimed {total} jobs in all, loaded {len(loaded)}")
    twice = {job_id: who for job_id, who in claimed_by.items() if len(who) > 1}
    if twice:
        sample = ", ".join(
            f"job {job_id} by claimers {who}" for job_id, who in sorted(twice.items())[:10]
        )
        problems.append(f"{len(twice)} jobs claimed more than once, e.g. {sample}")
    loaded_set = set(loaded)
    never = loaded_set - claimed_by.keys()
    if never:
        problems.append(f"{len(never)} loaded jobs never claimed, e.g. {sorted(never)[:10]}")
    unknown = claimed_by.keys() - loaded_set
    if unknown:
        problems.append(f"{len(unknown)} unknown ids claimed, e.g. {sorted(unknown)[:10]}")
    for result in results:
        if result.ack_refused:
            problems.append(
                f"claimer {result.index}: {len(result.ack_refused)} acks refused, "
                f"e.g. {result.ack_refused[:10]}"
            )
    return problems


def run_once(
    context: SpawnContext,
    database_url: str,
    claimers: int,
    batch_size: int,
    jobs: int,
    background: int = 0,
    queues: Sequence[str] = (QUEUE,),
    *,
    monitor: psycopg.Connection[Any],
) -> RunResult:
    """Load ``jobs`` jobs, drain them with ``claimers`` processes, verify, and time it.

    ``monitor`` is a connection of the parent's that samples the server's other activity.
    """
    from django.db import connection

    loaded = load_jobs(jobs, background)
    meter = ActivityMeter(monitor)  # measures the commit latency now, before the start
    barrier = context.Barrier(claimers + 1)  # the claimers and this process
    queue: Queue[ClaimerResult] = context.Queue()
    processes = [
        context.Process(
            target=claimer,
            args=(database_url, index, batch_size, list(queues), barrier, queue),
            name=f"jobq-bench-claimer-{index}",
        )
        for index in range(claimers)
    ]
    for process in processes:
        process.start()
    results: list[ClaimerResult] = []
    try:
        # A claimer that failed to start breaks the barrier; its result says why.
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait(timeout=START_TIMEOUT)
        meter.start()
        for _ in processes:  # read before joining: a full pipe would block the child's exit
            results.append(queue.get(timeout=START_TIMEOUT + RUN_TIMEOUT))
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
                process.join()
    activity = meter.stop()
    errors = [f"claimer {r.index}: {r.error}" for r in results if r.error]
    if errors:
        raise BenchmarkError("a claimer failed:\n  " + "\n  ".join(errors))
    problems = verify(loaded, results)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FILTER (WHERE queue = %s), count(*) FILTER (WHERE queue = %s)"
            " FROM jobq_job",
            [QUEUE, BACKGROUND_QUEUE],
        )
        left, background_left = cursor.fetchone()
    if left:
        problems.append(f"{left} bench jobs left in jobq_job after the run")
    if background_left != background:
        problems.append(f"{background} background jobs loaded, {background_left} left")
    if problems:
        raise BenchmarkError(
            f"{claimers} claimers, batch {batch_size}: the run broke the queue's guarantees:\n  "
            + "\n  ".join(problems)
        )
    results.sort(key=lambda r: r.index)
    return RunResult(
        claimers=claimers,
        batch_size=batch_size,
        jobs=len(loaded),
        seconds=max(r.end for r in results) - min(r.start for r in results),
        per_claimer=[len(r.claimed_ids) for r in results],
        activity=activity,
        claim_calls=sum(r.claim_calls for r in results),
        claim_latencies_ns=[ns for r in results for ns in r.claim_latencies_ns],
        ack_latencies_ns=[ns for r in results for ns in r.ack_latencies_ns],
    )


# -- report --------------------------------------------------------------------------------


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile (``fraction`` in 0..1) of a non-empty sequence."""
    ordered = sorted(values)
    rank = min(max(1, math.ceil(fraction * len(ordered))), len(ordered))
    return ordered[rank - 1]


def describe(activity: Activity, seconds: float) -> str:
    cpu = "?" if activity.host_cpu_busy is None else f"{activity.host_cpu_busy:.0%}"
    return (
        f"commit {activity.commit_ms:.2f} ms before; host CPU busy {cpu}, "
        f"load before {activity.load_before:.1f}, "
        f"other databases {activity.other_commits / seconds:,.0f} tx/s"
    )


#: Commits per second in other databases above which a cell is flagged as disturbed.
DISTURBED_TX_PER_SECOND = 20.0


@dataclass(frozen=True)
class Cell:
    claimers: int
    batch_size: int
    runs: list[RunResult]

    @property
    def rates(self) -> list[float]:
        return [run.jobs_per_second for run in self.runs]

    @property
    def host_cpu_busy(self) -> float | None:
        values = [r.activity.host_cpu_busy for r in self.runs]
        known = [value for value in values if value is not None]
        return statistics.median(known) if known else None

    @property
    def commit_ms(self) -> float:
        return statistics.median(run.activity.commit_ms for run in self.runs)

    @property
    def other_tx_per_second(self) -> float:
        return max(run.activity.other_commits / run.seconds for run in self.runs)

    def claim_ms(self, fraction: float) -> float:
        latencies = [ns for run in self.runs for ns in run.claim_latencies_ns]
        return percentile(latencies, fraction) / 1e6

    def ack_ms(self, fraction: float) -> float:
        latencies = [ns for run in self.runs for ns in run.ack_latencies_ns]
        return percentile(latencies, fraction) / 1e6


def print_header(
    facts: MachineFacts,
    jobs: int,
    reps: int,
    background: int,
    queues: Sequence[str],
    database_url: str,
) -> None:
    settings = facts.server_settings
    print("django-jobq claim benchmark")
    print(f"  machine     {facts.cpu_model}; {facts.logical_cpus} logical CPUs", end="")
    print(f" ({facts.usable_cpus} usable by this process)")
    print(f"  software    Python {facts.python}, Django {facts.django}, psycopg {facts.psycopg}")
    print(f"  django-jobq {facts.code}")
    print(f"  server      {facts.server_version}")
    where = "same machine: claimers and server share the CPUs" if facts.server_is_local else ""
    print(f"  database    {dj_database_url.parse(database_url)['NAME']} ({where or 'remote'})")
    print(
        "  durability  PostgreSQL's default durability settings, read from the server and "
        "left unchanged:"
    )
    print(
        f"              fsync={settings['fsync']} "
        f"synchronous_commit={settings['synchronous_commit']} "
        f"full_page_writes={settings['full_page_writes']} "
        f"wal_sync_method={settings['wal_sync_method']} "
        f"commit_delay={settings['commit_delay']}"
    )
    print(
        f"              shared_buffers={settings['shared_buffers']} "
        f"max_connections={settings['max_connections']}"
    )
    print(
        f"  workload    {jobs:,} ready jobs on one queue per run; each claimer is a process "
        f"with its own autocommit connection looping claim(limit=B) + ack_many until empty"
    )
    if background:
        print(
            f"  background  {background:,} more ready jobs on queue {BACKGROUND_QUEUE!r} with "
            "priority 1 (ahead in claim order), never claimed: the claimers must skip them"
        )
    if len(queues) > 1:
        print(f"  claim from  queues={list(queues)} (the several-queues claim statement)")
    print(f"  repetitions {reps} per cell; jobs/s is the median, range is min-max")
    print()


def print_table(cells: Sequence[Cell]) -> None:
    header = (
        f"{'claimers':>8}  {'batch':>5}  {'jobs/s':>7}  {'min-max':>15}  {'speed-up':>8}  "
        f"{'claim p50':>9}  {'p99':>6}  {'ack p50':>7}  {'p99':>6}  {'commit':>6}  {'cpu':>4}  "
        f"{'other tx/s':>10}"
    )
    print(header)
    print("-" * len(header))
    baseline: dict[int, float] = {}
    for cell in cells:
        median = statistics.median(cell.rates)
        baseline.setdefault(cell.batch_size, median)
        low, high = min(cell.rates), max(cell.rates)
        cpu = "?" if cell.host_cpu_busy is None else f"{cell.host_cpu_busy:.0%}"
        disturbed = "!" if cell.other_tx_per_second >= DISTURBED_TX_PER_SECOND else " "
        print(
            f"{cell.claimers:>8}  {cell.batch_size:>5}  {median:>7,.0f}  "
            f"{f'{low:,.0f}-{high:,.0f}':>15}  {median / baseline[cell.batch_size]:>7.2f}x  "
            f"{cell.claim_ms(0.50):>9.2f}  {cell.claim_ms(0.99):>6.2f}  "
            f"{cell.ack_ms(0.50):>7.2f}  {cell.ack_ms(0.99):>6.2f}  "
            f"{cell.commit_ms:>6.2f}  {cpu:>4}  {cell.other_tx_per_second:>9,.0f}{disturbed}"
        )
    print()
    print(
        "jobs/s: jobs claimed and acked per second of wall time, from the claimers' start\n"
        "  barrier to the last ack; median of the repetitions (min-max: their range).\n"
        "speed-up: jobs/s relative to the first row of the same batch size.\n"
        "claim p50/p99 (ms): wall time of one claim() call that returned jobs, as the claimer\n"
        "  sees it (round trip + statement + commit), pooled over claimers and repetitions.\n"
        "ack p50/p99 (ms): the same for the ack_many() call that follows each claim.\n"
        "commit (ms): median latency of a one-row UPDATE in autocommit (a durable commit),\n"
        f"  {COMMIT_PROBES} of them just before each run; the median of the repetitions.\n"
        "cpu: share of the host's CPU time that was busy during the run (median of the\n"
        "  repetitions; claimers, server and anything else on the host).\n"
        "other tx/s: commits per second in the server's other databases (highest of the\n"
        "  repetitions): work that competed with the benchmark."
    )
    disturbed_cells = [c for c in cells if c.other_tx_per_second >= DISTURBED_TX_PER_SECOND]
    if disturbed_cells:
        print(
            f"\nWARNING: other databases on this server committed transactions during "
            f"{len(disturbed_cells)} of {len(cells)} cells (marked !): those numbers are\n"
            "understated and noisy; rerun on a quiet server."
        )


# -- main ----------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    def counts(text: str) -> tuple[int, ...]:
        values = tuple(int(part) for part in text.split(","))
        if not values or min(values) < 1:
            raise argparse.ArgumentTypeError("expected positive integers, e.g. 1,2,4")
        return values

    parser = argparse.ArgumentParser(
        description="Measure django-jobq claims/s with concurrent claimers on one queue."
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"smoke run: {QUICK_JOBS:,} jobs, 1 repetition (unless --jobs/--reps are given)",
    )
    parser.add_argument("--jobs", type=int, help=f"jobs loaded per run (default {DEFAULT_JOBS:,})")
    parser.add_argument("--reps", type=int, help=f"repetitions per cell (default {DEFAULT_REPS})")
    parser.add_argument(
        "--claimers",
        type=counts,
        default=CLAIMER_COUNTS,
        help="comma-separated claimer counts (default 1,2,4,8)",
    )
    parser.add_argument(
        "--batch-sizes",
        type=counts,
        default=BATCH_SIZES,
        help="comma-separated claim limits (default 1,10)",
    )
    parser.add_argument(
        "--background-jobs",
        type=int,
        default=0,
        metavar="N",
        help="also load N higher-priority ready jobs on another queue that no claimer serves "
        "(default 0: the bench queue is alone in the table)",
    )
    parser.add_argument(
        "--multi-queue",
        action="store_true",
        help=f"claimers name two queues ({QUEUE!r} and the empty {IDLE_QUEUE!r}), which "
        "exercises the several-queues claim statement",
    )
    parser.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL", DEFAULT_DATABASE_URL),
        help="PostgreSQL URL (default: $DATABASE_URL, else %(default)s)",
    )
    args = parser.parse_args(argv)
    if args.jobs is None:
        args.jobs = QUICK_JOBS if args.quick else DEFAULT_JOBS
    if args.reps is None:
        args.reps = 1 if args.quick else DEFAULT_REPS
    if args.jobs < 1 or args.reps < 1 or args.background_jobs < 0:
        parser.error("--jobs and --reps must be at least 1, --background-jobs at least 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    prepare_database(args.database_url)
    from django_jobq import db

    with db.connect(application_name="jobq-bench") as monitor:
        facts = machine_facts(monitor, args.database_url)
        create_probe_table(monitor)
        return run_all(args, facts, monitor)


def run_all(args: argparse.Namespace, facts: MachineFacts, monitor: psycopg.Connection[Any]) -> int:
    """Run every cell, print progress to stderr and the table to stdout; the exit status."""
    queues = [QUEUE, IDLE_QUEUE] if args.multi_queue else [QUEUE]
    print_header(facts, args.jobs, args.reps, args.background_jobs, queues, args.database_url)
    warnings = durability_warnings(facts)
    if warnings:
        print("WARNING: durability is reduced on this server, the numbers overstate a")
        print("production server's: " + "; ".join(warnings))
        print()
    sys.stdout.flush()

    context = multiprocessing.get_context("spawn")
    cells: list[Cell] = []
    try:
        for batch_size in args.batch_sizes:
            for claimers in args.claimers:
                runs: list[RunResult] = []
                for rep in range(1, args.reps + 1):
                    run = run_once(
                        context,
                        args.database_url,
                        claimers,
                        batch_size,
                        args.jobs,
                        args.background_jobs,
                        queues,
                        monitor=monitor,
                    )
                    runs.append(run)
                    print(
                        f"  claimers={claimers} batch={batch_size} rep {rep}/{args.reps}: "
                        f"{run.jobs:,} jobs in {run.seconds:.2f} s = "
                        f"{run.jobs_per_second:,.0f} jobs/s; per claimer {run.per_claimer}; "
                        f"{run.claim_calls:,} claim calls; {describe(run.activity, run.seconds)}",
                        file=sys.stderr,
                        flush=True,
                    )
                cells.append(Cell(claimers, batch_size, runs))
    except BenchmarkError as exc:
        print(f"\nBENCHMARK FAILED: {exc}", file=sys.stderr)
        if cells:
            print_table(cells)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        if cells:
            print_table(cells)
        return 130
    finally:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE jobq_job")
    print_table(cells)
    return 0


if __name__ == "__main__":
    sys.exit(main())
