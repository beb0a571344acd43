"""The large-backlog scenario (``bench/run.py --scenarios backlog``): django-jobq draining a
backlog of a million jobs while vacuum can, or cannot, clean up behind its claims and acks.

Each condition gets a throwaway PostgreSQL cluster of its own (``tests/cluster.py``: the
machine's binaries, a free port, removed afterwards) with the server's default durability
(fsync and synchronous_commit on) and, besides, only the condition's ``autovacuum`` and the
statement logging of :data:`statement_log.LOG_SETTINGS`:

- ``autovacuum`` (a): autovacuum on (the server default), the jobs table with the
  migration's storage parameters;
- ``no-autovacuum`` (b): ``autovacuum = off``;
- ``snapshot`` (c): ``autovacuum = off`` and one REPEATABLE READ transaction, opened before
  the drain and held until it ends, that has read ``jobq_job`` (as a ``pg_dump`` does): it
  holds the xmin horizon back, so nothing could remove a dead row even if vacuum ran.

In each cluster: a drain of ``--backlog-empty-jobs`` (20,000) jobs first (its claim p99 is
the "empty-table value"), then the drain of the backlog. A drain: empty the tables; fill
``jobq_job`` with one ``INSERT ... SELECT generate_series`` (``million.FILL_READY``: kind
``bench.noop``, payload ``{"n": n}``); ``CHECKPOINT``; no VACUUM and no ANALYZE (with
autovacuum off nothing runs them; with it on, autovacuum does what it does); start the
workers with ``--burst`` and time them as whole processes, from start to exit; check that
every job ran exactly once (bench/benchsite/recorder.py) and no job or dead letter is
left; read the server's timing of every claim, probe and ack statement from its log.

The seeds' case (``--seeds-case``): on condition (a), a one-hour backlog (7,200,000 jobs)
plus 2,000 jobs/s arriving (bench/benchsite/produce.py, paced) from the moment the workers
start (long-running workers, not ``--burst``: the queue empties for a moment between
arrivals). It has drained when every backlog job has run and the workers keep up with the
arrivals (every job committed more than :data:`CAUGHT_UP_LAG` seconds ago has started);
then the producer stops, the workers finish what arrived and stop, and the run is checked.

bench/README.md ("The backlog scenario") has the method and what each number means;
bench/backlog_report.py writes the report.
"""

from __future__ import annotations

import bisect
import json
import math
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import claims
import million
import psycopg
import statement_log
from measure import HarnessError, Records, WorkerGroup, read_commits, wait_for
from scenarios import SLOWEST_RATE, activity_dict, producer_command
from systems import REPO_DIR, Jobq, WorkerConfig

from tests.cluster import Cluster, unavailable_reason

#: Seconds: the seeds' case has drained once every job committed longer ago than this has
#: started (the workers keep up with the arrivals).
CAUGHT_UP_LAG = 1.0
#: Jobs per producer transaction in the seeds' case (as the sustained scenario's default).
ARRIVAL_BATCH = 10
#: Seconds between progress lines during a drain.
PROGRESS_EVERY = 10.0
#: Server settings reported for each cluster.
REPORTED = (
    "server_version",
    "shared_buffers",
    "autovacuum",
    "fsync",
    "synchronous_commit",
    "full_page_writes",
    "wal_sync_method",
    "max_connections",
    "log_min_duration_statement",
)


@dataclass(frozen=True)
class Condition:
    """What differs between the clusters: autovacuum, and a snapshot held over the drain."""

    name: str
    label: str
    autovacuum: bool
    snapshot: bool


CONDITIONS = {
    condition.name: condition
    for condition in (
        Condition("autovacuum", "(a) autovacuum on, the migration's table settings", True, False),
        Condition("no-autovacuum", "(b) autovacuum off", False, False),
        Condition("snapshot", "(c) autovacuum off + a REPEATABLE READ snapshot held", False, True),
    )
}


@dataclass
class Drain:
    """One drain's measurements (see :func:`summarise`); times in seconds from the start of
    the workers, latencies in ms."""

    jobs: int
    fill_seconds: float
    #: From starting the workers to the exit of the last (--burst); the seeds' case: to the
    #: moment it caught up.
    seconds: float
    rate: float
    #: Jobs started in each second since the workers started.
    series: list[int]
    first_start: float
    last_start: float
    #: Jobs/s over each tenth of the jobs, by count, in handler-start order.
    tenth_rates: list[float]
    #: ``{group: {"overall": stats, "tenths": [stats] * 10, "names": {name: count}}}``.
    statements: dict[str, Any]
    #: ``[seconds, claim p99 ms, claims]`` per window of the drain.
    claim_p99_windows: list[list[float]]
    activity: dict[str, Any]
    #: ``jobq_job`` as pg_stat_user_tables and the size functions saw it before and after.
    table_before: dict[str, Any]
    table_after: dict[str, Any]
    worker_exit_seconds: list[float] = field(default_factory=list)
    snapshot: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        """The last tenth's rate over the first tenth's."""
        return self.tenth_rates[-1] / self.tenth_rates[0] if self.tenth_rates[0] else math.nan


@dataclass
class ClusterRun:
    """A condition's cluster: its settings and its two drains."""

    condition: str
    label: str
    logged: bool
    server: dict[str, str]
    empty: Drain | None = None
    backlog: Drain | None = None


@dataclass
class Result:
    """The whole scenario, for the report."""

    argv: list[str]
    config: str
    worker_command: str
    facts: dict[str, Any]
    #: The seeds' case (``--seeds-case``) rather than the three conditions.
    seeds_case: bool = False
    clusters: list[ClusterRun] = field(default_factory=list)
    elapsed_s: float = 0.0
    failure: str = ""

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


# -- statistics ---------------------------------------------------------------------------


def stats(values: Sequence[float]) -> dict[str, float]:
    """``count``, ``p50``, ``p99`` (nearest rank) and ``max`` of ``values``."""
    if not values:
        return {"count": 0, "p50": math.nan, "p99": math.nan, "max": math.nan}
    return {
        "count": len(values),
        "p50": claims.percentile(values, 0.50),
        "p99": claims.percentile(values, 0.99),
        "max": max(values),
    }


def tenth_bounds(starts: Sequence[int]) -> list[int]:
    """The indexes into the sorted handler starts where each tenth of the jobs begins, and
    the last index: 11 numbers."""
    count = len(starts)
    return [min(count * tenth // 10, count - 1) for tenth in range(11)]


def summarise(
    starts_ns: Sequence[int],
    started_ns: int,
    seconds: float,
    statements: Sequence[statement_log.Statement],
    clock_offset_ns: int,
) -> dict[str, Any]:
    """The drain's numbers from its handler starts (monotonic ns), its start and length
    and the statements the server logged (epoch ns; ``clock_offset_ns`` is epoch minus
    monotonic)."""
    starts = sorted(starts_ns)
    series = [0] * (max(0, math.ceil(seconds)) + 1)
    for ns in starts:
        series[min(max(0, (ns - started_ns) // 1_000_000_000), len(series) - 1)] += 1
    bounds = tenth_bounds(starts)
    tenth_rates = []
    for tenth in range(10):
        low, high = bounds[tenth], bounds[tenth + 1]
        span = (starts[high] - starts[low]) / 1e9
        tenth_rates.append((high - low) / span if span > 0 else math.nan)
    # A statement belongs to the tenth in whose span of handler starts it ended (those
    # before the first start to the first tenth, after the last to the last).
    edges = [starts[bounds[tenth]] for tenth in range(1, 10)]
    window = max(1.0, seconds / 50)
    grouped: dict[str, Any] = {}
    windows: dict[int, list[float]] = {}
    for group in statement_log.WATCHED:
        mine = [statement for statement in statements if statement.group == group]
        tenths: list[list[float]] = [[] for _ in range(10)]
        names: dict[str, int] = {}
        for statement in mine:
            at = statement.at_ns - clock_offset_ns
            tenths[bisect.bisect_right(edges, at)].append(statement.ms)
            names[statement.name] = names.get(statement.name, 0) + 1
            if group == "claim":
                windows.setdefault(int((at - started_ns) / 1e9 // window), []).append(statement.ms)
        grouped[group] = {
            "overall": stats([statement.ms for statement in mine]),
            "tenths": [stats(values) for values in tenths],
            "names": names,
        }
    return {
        "series": series,
        "first_start": (starts[0] - started_ns) / 1e9,
        "last_start": (starts[-1] - started_ns) / 1e9,
        "tenth_rates": tenth_rates,
        "statements": grouped,
        "claim_p99_windows": [
            [(index + 0.5) * window, claims.percentile(values, 0.99), len(values)]
            for index, values in sorted(windows.items())
        ],
    }


# -- the server ---------------------------------------------------------------------------


def server_settings(condition: Condition, logged: bool) -> dict[str, str]:
    """The settings a condition's cluster starts with: the server's defaults (durability
    included) but for these."""
    settings = {"autovacuum": "on" if condition.autovacuum else "off"}
    if logged:
        settings.update(statement_log.LOG_SETTINGS)
    return settings


def server_facts(conn: psycopg.Connection[Any]) -> dict[str, str]:
    return {name: claims.show_setting(conn, name) for name in REPORTED}


def table_facts(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    """``jobq_job``'s vacuum statistics and sizes, now."""
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT n_live_tup, n_dead_tup, autovacuum_count, autoanalyze_count, vacuum_count,"
        " analyze_count, pg_table_size('jobq_job'), pg_indexes_size('jobq_job')"
        " FROM pg_stat_user_tables WHERE relname = 'jobq_job'"
    ).fetchone()
    names = ("live", "dead", "autovacuums", "autoanalyzes", "vacuums", "analyzes")
    if row is None:
        return {}
    return {
        **dict(zip(names, row[:6], strict=True)),
        "table_mb": row[6] / 2**20,
        "indexes_mb": row[7] / 2**20,
    }


def hold_snapshot(url: str) -> tuple[psycopg.Connection[Any], dict[str, Any]]:
    """Open a REPEATABLE READ transaction that reads ``jobq_job`` (a ``pg_dump``'s way):
    its snapshot holds the xmin horizon back until it ends. Return it and what it saw."""
    holder = psycopg.connect(url, application_name="jobq-bench-snapshot")
    holder.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    row = holder.execute("SELECT count(*) FROM jobq_job").fetchone()
    xmin = holder.execute(
        "SELECT backend_xmin::text FROM pg_stat_activity WHERE pid = pg_backend_pid()"
    ).fetchone()
    if not xmin or xmin[0] is None:
        holder.close()
        raise HarnessError("the REPEATABLE READ transaction holds no snapshot (no backend_xmin)")
    return holder, {
        "pid": holder.info.backend_pid,
        "rows_seen": row[0] if row else 0,
        "xmin": xmin[0],
    }


def release_snapshot(
    holder: psycopg.Connection[Any], monitor: psycopg.Connection[Any], facts: dict[str, Any]
) -> None:
    """Check that the snapshot was still held (same xmin), then end it."""
    monitor.execute("SELECT pg_stat_clear_snapshot()")
    row = monitor.execute(
        "SELECT backend_xmin::text, extract(epoch FROM now() - xact_start)::float8"
        " FROM pg_stat_activity WHERE pid = %s",
        [facts["pid"]],
    ).fetchone()
    holder.rollback()
    holder.close()
    if not row or row[0] != facts["xmin"]:
        raise HarnessError(f"the snapshot was not held to the end of the drain: {row}")
    facts["held_s"] = row[1]


# -- one drain ------------------------------------------------------------------------------


class ArrivalRecords(Records):
    """Handler records that also count the backlog's jobs (numbers below ``backlog``) and
    the first arrival (number ``backlog`` and up) that has not started yet."""

    def __init__(self, directory: Path, backlog: int) -> None:
        super().__init__(directory)
        self.backlog = backlog
        self.backlog_seen = 0
        self.next_arrival = backlog

    def add(self, number: int, ns: int) -> None:
        new = number not in self.starts
        super().add(number, ns)
        if new and number < self.backlog:
            self.backlog_seen += 1
        while self.next_arrival in self.starts:
            self.next_arrival += 1


class CommitFollower:
    """Follows the producer's ``--out`` file as it grows: which arrivals committed when."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = ""
        #: ``(last job number of a transaction, its commit ns)``, in commit order, not yet
        #: older than the lag (see :meth:`committed_before`).
        self.recent: list[tuple[int, int]] = []
        self.through = -1

    def committed_before(self, ns: int) -> int:
        """The highest job number committed before ``ns`` (monotonic), -1 if none."""
        if self.path.exists():
            with open(self.path, encoding="ascii") as stream:
                stream.seek(self.offset)
                data = self.partial + stream.read()
                self.offset = stream.tell()
            complete, _, self.partial = data.rpartition("\n")
            for line in complete.splitlines():
                first, count, commit_ns = (int(part) for part in line.split())
                self.recent.append((first + count - 1, commit_ns))
        done = 0
        while done < len(self.recent) and self.recent[done][1] < ns:
            self.through = self.recent[done][0]
            done += 1
        del self.recent[:done]
        return self.through


@dataclass
class Backlog:
    """A cluster's jobq database and what a drain needs around it."""

    system: Jobq
    cluster: Cluster
    config: WorkerConfig
    work_dir: Path

    def fill(self, conn: psycopg.Connection[Any], jobs: int) -> float:
        """Empty the tables, insert ``jobs`` ready jobs in one statement, CHECKPOINT;
        return the seconds it took."""
        self.system.check_alone(conn)
        self.system.reset(conn)
        started = time.perf_counter()
        conn.execute(
            million.FILL_READY, {"queue": million.QUEUE, "kind": million.KIND, "rows": jobs}
        )
        conn.execute("CHECKPOINT")
        return time.perf_counter() - started

    def statements(self, offset: int, extra: dict[str, Any]) -> list[statement_log.Statement]:
        """The watched statements the server logged from byte ``offset`` of its log; how
        much log that was and how long reading it took go into ``extra``."""
        if self.cluster.settings.get("log_min_duration_statement") != "0":
            return []
        started = time.monotonic()
        found = statement_log.read(self.cluster.log, offset)
        extra["log_mb"] = (self.cluster.log.stat().st_size - offset) / 2**20
        extra["log_read_s"] = time.monotonic() - started
        if not any(statement.group == "claim" for statement in found):
            raise HarnessError(
                f"no claim statement recognised in {self.cluster.log} (did sql.claims.CLAIM_JOBS_* "
                "change shape, or the log format?)"
            )
        return found

    def run_dirs(self, name: str) -> tuple[Path, Path]:
        """A fresh ``<work dir>/<name>`` for a drain and its ``records`` directory."""
        run_dir = self.work_dir / name
        shutil.rmtree(run_dir, ignore_errors=True)
        record_dir = run_dir / "records"
        record_dir.mkdir(parents=True)
        return run_dir, record_dir

    def start_workers(
        self, run_dir: Path, record_dir: Path, meter: claims.ActivityMeter, *, burst: bool
    ) -> tuple[WorkerGroup, int, int, int]:
        """Start the activity meter and the workers (``--burst`` or not), their logs in
        ``run_dir``. Returns the worker group, the server log's size before them (bytes: the
        drain's statements follow), the wall clock minus the monotonic one and the start
        (both in ns)."""
        offset = self.cluster.log.stat().st_size
        group = WorkerGroup(
            worker_commands(self.system, self.config, burst=burst),
            env=self.system.env(record_dir),
            log_dir=run_dir,
            cwd=REPO_DIR,
        )
        clock_offset = time.time_ns() - time.monotonic_ns()
        meter.start()
        started = time.monotonic_ns()
        group.start()
        return group, offset, clock_offset, started

    def drain(self, name: str, jobs: int, *, snapshot: bool) -> Drain:
        """Fill ``jobs`` jobs and drain them with ``--burst`` workers (see the module
        docstring); the checks failing raise :class:`HarnessError`."""
        run_dir, record_dir = self.run_dirs(name)
        with self.system.connect() as conn:
            claims.create_probe_table(conn)
            fill_seconds = self.fill(conn, jobs)
            table_before = table_facts(conn)
            meter = claims.ActivityMeter(conn)
            holder, held = hold_snapshot(self.system.url) if snapshot else (None, None)
            records = Records(record_dir)
            group, offset, clock_offset, started = self.start_workers(
                run_dir, record_dir, meter, burst=True
            )
            try:
                exits = group.wait_exit(
                    60 + jobs / SLOWEST_RATE,
                    tick=progress_printer(name, records, jobs, started),
                    every=PROGRESS_EVERY,
                )
            except BaseException:
                group.stop(timeout=10)
                raise
            finally:
                if holder is not None and held is not None and not holder.closed:
                    release_snapshot(holder, conn, held)
            ended = max(ns for _, ns in exits)
            activity = activity_dict(meter.stop(), (ended - started) / 1e9)
            records.poll()
            problems = records.problems(jobs) + self.system.leftovers(conn, jobs)
            statuses = [status for status, _ in exits]
            if any(status != 0 for status in statuses):
                problems.append(f"worker exit statuses {statuses}")
            if problems:
                raise HarnessError(
                    f"backlog, {name}: the drain broke its checks:\n  "
                    + "\n  ".join(problems)
                    + f"\n  (worker logs in {run_dir})"
                )
            table_after = table_facts(conn)
        seconds = (ended - started) / 1e9
        extra: dict[str, Any] = {}
        statements = self.statements(offset, extra)
        drain = Drain(
            jobs=jobs,
            fill_seconds=fill_seconds,
            seconds=seconds,
            rate=jobs / seconds,
            activity=activity,
            table_before=table_before,
            table_after=table_after,
            worker_exit_seconds=[(ns - started) / 1e9 for _, ns in exits],
            snapshot=held,
            extra=extra,
            **summarise(list(records.starts.values()), started, seconds, statements, clock_offset),
        )
        shutil.rmtree(run_dir, ignore_errors=True)
        print(f"  {name}: {describe(drain)}", file=sys.stderr, flush=True)
        return drain

    def seeds_drain(self, jobs: int, rate: float, max_seconds: float) -> Drain:
        """The seeds' case: ``jobs`` waiting plus ``rate`` jobs/s arriving (see the module
        docstring); drained when the backlog has run and the workers keep up."""
        run_dir, record_dir = self.run_dirs("seeds")
        commits_path = run_dir / "commits.txt"
        with self.system.connect() as conn:
            claims.create_probe_table(conn)
            fill_seconds = self.fill(conn, jobs)
            table_before = table_facts(conn)
            meter = claims.ActivityMeter(conn)
            records = ArrivalRecords(record_dir, jobs)
            commits = CommitFollower(commits_path)
            group, offset, clock_offset, started = self.start_workers(
                run_dir, record_dir, meter, burst=False
            )
            command = producer_command(
                self.system,
                "paced",
                jobs=math.ceil(rate * max_seconds),
                batch=ARRIVAL_BATCH,
                rate=rate,
                out=commits_path,
                first=jobs,
            )
            with open(run_dir / "producer.log", "wb") as producer_log:
                producer = subprocess.Popen(
                    command,
                    env=self.system.env(),
                    cwd=REPO_DIR,
                    stdout=subprocess.PIPE,
                    stderr=producer_log,
                )
            tick = progress_printer("seeds", records, jobs, started)
            next_tick = time.monotonic() + PROGRESS_EVERY
            caught_up: int | None = None
            try:
                while caught_up is None:
                    now = time.monotonic_ns()
                    if (now - started) / 1e9 > max_seconds:
                        break
                    group.check_alive()
                    if producer.poll() not in (None, 0):
                        raise HarnessError(f"the producer failed (log: {run_dir})")
                    records.poll()
                    due = commits.committed_before(now - int(CAUGHT_UP_LAG * 1e9))
                    if records.backlog_seen == jobs and records.next_arrival > due:
                        caught_up = now
                    if time.monotonic() >= next_tick:
                        tick()
                        next_tick = time.monotonic() + PROGRESS_EVERY
                    time.sleep(0.2)
                producer.send_signal(signal.SIGTERM)
                output, _ = producer.communicate(timeout=60)
                if producer.returncode != 0:
                    raise HarnessError(f"the producer failed (log: {run_dir})")
                produced: dict[str, Any] = json.loads(output.decode().strip().splitlines()[-1])
                total = jobs + produced["jobs"]
                ended = caught_up or time.monotonic_ns()
                # What arrived while it caught up, and after, still has to run.
                wait_for(
                    lambda: records.poll() >= total,
                    timeout=60 + total / SLOWEST_RATE,
                    interval=0.1,
                    what=f"{total} handler starts ({records.count} so far)",
                )
                wait_for(
                    lambda: self.system.unfinished(conn) == 0,
                    timeout=60,
                    interval=0.05,
                    what="the last jobs to be acked",
                )
                activity = activity_dict(meter.stop(), (ended - started) / 1e9)
            finally:
                if producer.poll() is None:
                    producer.kill()
                statuses = group.stop()
            records.poll()
            problems = records.problems(total) + self.system.leftovers(conn, total)
            if any(status not in (0, -15) for status in statuses):
                problems.append(f"worker exit statuses {statuses}")
            if problems:
                raise HarnessError(
                    "backlog, seeds' case: the run broke its checks:\n  "
                    + "\n  ".join(problems)
                    + f"\n  (worker logs in {run_dir})"
                )
            table_after = table_facts(conn)
        arrivals = read_commits(commits_path)
        seconds = (ended - started) / 1e9
        backlog_done = max(ns for number, ns in records.starts.items() if number < jobs)
        arrival_series = [0] * (
            math.ceil(max(seconds, (max(arrivals.values(), default=started) - started) / 1e9)) + 1
        )
        for ns in arrivals.values():
            arrival_series[
                min(max(0, (ns - started) // 1_000_000_000), len(arrival_series) - 1)
            ] += 1
        drained = [ns for ns in records.starts.values() if ns <= ended]
        extra = {
            "backlog": jobs,
            "offered_rate": rate,
            "arrived": produced["jobs"],
            "arrived_while_draining": sum(1 for ns in arrivals.values() if ns <= ended),
            "producer_rate": produced["jobs"] / produced["seconds"],
            "producer_late_ms": produced["late_ms"],
            "caught_up": caught_up is not None,
            "max_seconds": max_seconds,
            "backlog_done_s": (backlog_done - started) / 1e9,
            "arrival_series": arrival_series,
            "total_jobs": total,
        }
        statements = self.statements(offset, extra)
        drain = Drain(
            jobs=len(drained),
            fill_seconds=fill_seconds,
            seconds=seconds,
            rate=len(drained) / seconds,
            activity=activity,
            table_before=table_before,
            table_after=table_after,
            extra=extra,
            **summarise(drained, started, seconds, statements, clock_offset),
        )
        shutil.rmtree(run_dir, ignore_errors=True)
        print(f"  seeds: {describe(drain)}", file=sys.stderr, flush=True)
        return drain


def worker_commands(system: Jobq, config: WorkerConfig, *, burst: bool) -> list[list[str]]:
    """The worker command lines of ``config`` (systems.Jobq's), with ``--burst`` or not."""
    return [
        [*command, *(["--burst"] if burst else [])] for command in system.worker_commands(config)
    ]


def progress_printer(name: str, records: Records, jobs: int, started: int) -> Callable[[], None]:
    """A tick that prints how far a drain has got and its rate since the last tick."""
    last = [0, started]

    def tick() -> None:
        now = time.monotonic_ns()
        count = records.poll()
        rate = (count - last[0]) / max((now - last[1]) / 1e9, 1e-9)
        last[:] = [count, now]
        print(
            f"    {name}: {count:,} of {jobs:,} jobs after {(now - started) / 1e9:.0f} s, "
            f"{rate:,.0f} jobs/s lately",
            file=sys.stderr,
            flush=True,
        )

    return tick


def describe(drain: Drain) -> str:
    claim = drain.statements["claim"]["overall"]
    return (
        f"{drain.jobs:,} jobs in {drain.seconds:.1f} s = {drain.rate:,.0f} jobs/s; first/last "
        f"tenth {drain.tenth_rates[0]:,.0f}/{drain.tenth_rates[-1]:,.0f} jobs/s "
        f"(x{drain.ratio:.2f}); {claim['count']} claims p50 {claim['p50']:.2f} p99 "
        f"{claim['p99']:.2f} ms; host CPU {drain.activity['cpu'] or 0:.0%}, load before "
        f"{drain.activity['load_before']:.1f}"
        + (
            f"; {drain.extra['log_mb']:,.0f} MB of server log read in "
            f"{drain.extra['log_read_s']:.1f} s"
            if "log_mb" in drain.extra
            else ""
        )
    )


# -- the scenario -------------------------------------------------------------------------


def start_cluster(condition: Condition, logged: bool) -> Cluster:
    reason = unavailable_reason()
    if reason is not None:
        raise HarnessError(f"the backlog scenario needs a cluster of its own: {reason}")
    cluster = Cluster(server_settings(condition, logged))
    cluster.start()
    return cluster


def in_cluster(
    condition: Condition,
    logged: bool,
    args: Any,
    work_dir: Path,
    result: Result,
    measure: Callable[[Backlog, ClusterRun], None],
) -> None:
    """Start ``condition``'s cluster, prepare its jobq database, run ``measure`` there
    (it fills in the :class:`ClusterRun` appended to ``result``), remove the cluster."""
    cluster = start_cluster(condition, logged)
    try:
        system = Jobq(f"postgres://postgres@127.0.0.1:{cluster.port}")
        system.prepare()
        with system.connect() as conn:
            server = server_facts(conn)
            if not result.facts:
                result.facts = asdict(claims.machine_facts(conn, system.url))
        run = ClusterRun(condition.name, condition.label, logged, server)
        result.clusters.append(run)
        label = f"{condition.name}{'' if logged else ', statements not logged'}"
        print(
            f"  cluster {label}: {server['server_version']}, port {cluster.port}, "
            f"autovacuum={server['autovacuum']}",
            file=sys.stderr,
            flush=True,
        )
        measure(Backlog(system, cluster, args.backlog_config, work_dir / label), run)
    finally:
        cluster.remove()


def run(args: Any, work_dir: Path, argv: list[str]) -> Result:
    """The backlog scenario as ``args`` ask: the conditions, or the seeds' case. A failed
    check stops it; what ran before is in the result (``failure`` says what happened)."""
    config: WorkerConfig = args.backlog_config
    commands = worker_commands(Jobq("postgres://127.0.0.1"), config, burst=not args.seeds_case)
    result = Result(
        argv=argv,
        config=str(config),
        # As run (sys.executable testproject/manage.py ...), the interpreter left out.
        worker_command=" ".join(["manage.py", *commands[0][2:]])
        + (f" (x{len(commands)} processes)" if len(commands) > 1 else ""),
        facts={},
        seeds_case=args.seeds_case,
    )
    started = time.monotonic()

    def conditions(run: ClusterRun, backlog: Backlog, condition: Condition) -> None:
        run.empty = backlog.drain(
            f"{condition.name} empty table", args.backlog_empty_jobs, snapshot=False
        )
        run.backlog = backlog.drain(
            f"{condition.name} backlog", args.backlog_jobs, snapshot=condition.snapshot
        )

    try:
        if args.seeds_case:
            condition = CONDITIONS["autovacuum"]

            def seeds(backlog: Backlog, run: ClusterRun) -> None:
                run.empty = backlog.drain(
                    "seeds empty table", args.backlog_empty_jobs, snapshot=False
                )
                run.backlog = backlog.seeds_drain(
                    args.seeds_backlog, args.seeds_rate, args.seeds_max_seconds
                )

            in_cluster(condition, True, args, work_dir, result, seeds)
        else:
            runs = [(CONDITIONS[name], True) for name in args.backlog_conditions]
            if args.backlog_log_cost != "none":
                runs.append((CONDITIONS[args.backlog_log_cost], False))
            for condition, logged in runs:
                in_cluster(
                    condition,
                    logged,
                    args,
                    work_dir,
                    result,
                    lambda backlog, run, condition=condition: conditions(run, backlog, condition),
                )
    except HarnessError as exc:
        result.failure = str(exc)
    except KeyboardInterrupt:
        result.failure = "interrupted"
    result.elapsed_s = time.monotonic() - started
    return result
