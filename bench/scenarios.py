"""The harness's scenarios (bench/run.py): each measures every system the same way.

A run with workers goes: empty the system's tables; start its real workers (subprocesses)
and wait until they are idle; start the meter (host CPU, the server's other databases,
commit latency); run the producer subprocess (:mod:`benchsite.produce`); wait until every
job's handler has recorded its start and the system reports no unfinished job; stop the
workers (SIGTERM); check that every job ran exactly once and the tables hold what they
should (:meth:`systems.System.leftovers`). A run that fails a check stops the benchmark.
"""

from __future__ import annotations

import json
import multiprocessing
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import claims
import million
from benchsite import pickup_trace
from measure import HarnessError, Records, WorkerGroup, read_commits, summary_ms, wait_for
from systems import REPO_DIR, SYSTEMS, System, WorkerConfig, tasks_backend_available

#: Seconds a run may take beyond its jobs at this many jobs/s before it is declared stuck.
SLOWEST_RATE = 50.0


#: A pickup run starts once the host's CPU was busy less than this share over one second
#: (its idle workers started), or after :data:`QUIET_WAIT_SECONDS`: the run before it (a
#: sustained run's workers and producer exiting, the server writing back what they
#: dirtied) would otherwise add its tail to the first seconds of a latency measurement.
QUIET_CPU_SHARE = 0.2
QUIET_WAIT_SECONDS = 60.0


def wait_for_quiet_host() -> None:
    """Wait until the host is quiet (see :data:`QUIET_CPU_SHARE`; time waiting for the disk
    counts as busy here: the server writing back what the run before dirtied slows the
    commits of the next), at most :data:`QUIET_WAIT_SECONDS`; say so on stderr when that
    took more than a second."""
    started = time.monotonic()
    while time.monotonic() - started < QUIET_WAIT_SECONDS:
        before = claims.cpu_jiffies()
        time.sleep(1.0)  # the window measured, not a wait for an event
        after = claims.cpu_jiffies()
        if before is None or after is None:
            return  # no /proc/stat: nothing to wait for
        busy, total = after[0] - before[0], after[1] - before[1]
        waiting = after[2] - before[2]
        if total and (busy + waiting) / total < QUIET_CPU_SHARE:
            break
    waited = time.monotonic() - started
    if waited > 1.5:
        print(f"  (waited {waited:.0f} s for a quiet host)", file=sys.stderr, flush=True)


@dataclass
class Run:
    """One measured run of one system (or of the raw-SQL ceiling)."""

    scenario: str
    system: str
    label: str
    config: str
    rep: int
    jobs: int
    seconds: float
    #: Jobs per second: what each scenario's docs say it counts.
    rate: float
    activity: dict[str, Any]
    #: Per-job latency in ns (pickup latency, or end-to-end lag in "sustained"); not saved.
    latencies_ns: list[int] = field(default_factory=list, repr=False)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.scenario, self.system, self.config, str(self.extra.get("offered", "")))

    def as_json(self) -> dict[str, Any]:
        data = {
            name: getattr(self, name)
            for name in ("scenario", "system", "label", "config", "rep", "jobs", "seconds")
        }
        data.update(rate=self.rate, activity=self.activity, **self.extra)
        if self.latencies_ns:
            data["latency_ms"] = summary_ms(self.latencies_ns)
        return data


@dataclass(frozen=True)
class Entry:
    """What one scenario runs for one system: a worker configuration."""

    system: System
    config: WorkerConfig


class Bench:
    """The state of one harness invocation: systems, options, results."""

    def __init__(self, args: Any, work_dir: Path) -> None:
        self.args = args
        self.work_dir = work_dir
        self.systems: dict[str, System] = {}
        self.runs: list[Run] = []
        self.skipped: dict[str, str] = {}
        self.claim_cells: list[claims.Cell] = []
        self.million: dict[str, Any] | None = None
        self.worker_settings: dict[str, str] = {}

    # -- systems ----------------------------------------------------------------------------

    def system(self, name: str) -> System:
        """The system ``name``, its database created and its schema installed on first use."""
        if name not in self.systems:
            system = SYSTEMS[name](self.args.server_url)
            system.also_serves_limited = bool(self.args.limited_queue)
            system.prepare()
            with system.connect() as conn:
                claims.create_probe_table(conn)
                conn.execute("CREATE TABLE IF NOT EXISTS jobq_bench_written (n bigint PRIMARY KEY)")
            self.systems[name] = system
        return self.systems[name]

    def entries(self, names: Sequence[str], configs: dict[str, list[WorkerConfig]]) -> list[Entry]:
        return [Entry(self.system(name), config) for name in names for config in configs[name]]

    def check_alone(self, system: System, conn: Any) -> None:
        try:
            system.check_alone(conn)
        except RuntimeError as exc:
            raise HarnessError(str(exc)) from None

    # -- one run with workers -------------------------------------------------------------

    def run_workers(
        self,
        scenario: str,
        entry: Entry,
        rep: int,
        *,
        mode: str,
        jobs: int,
        batch: int,
        rate: float = 0.0,
        handler: str = "noop",
    ) -> Run:
        system, config = entry.system, entry.config
        self.worker_settings[f"{system.label} {config}"] = system.describe(config)
        run_dir = self.work_dir / f"{scenario}-{system.name}-{config}-{mode}-{rate:g}-{rep}"
        shutil.rmtree(run_dir, ignore_errors=True)
        record_dir = run_dir / "records"
        record_dir.mkdir(parents=True)
        commits_path = run_dir / "commits.txt"
        with system.connect() as conn:
            self.check_alone(system, conn)
            system.reset(conn)
            conn.execute("TRUNCATE jobq_bench_written")
            env = system.env(record_dir)
            traced = self.args.trace_pickup and "pickup" in scenario
            if traced:
                env["JOBQ_BENCH_TRACE"] = "1"  # django-jobq's workers (benchsite.pickup_trace)
            if self.args.queue_limits:
                env["JOBQ_BENCH_QUEUE_LIMITS"] = self.args.queue_limits  # benchsite.settings
            if self.args.limited_queue:
                env["JOBQ_BENCH_LIMITED_QUEUE"] = self.args.limited_queue  # benchsite.settings
            group = WorkerGroup(
                system.worker_commands(config),
                env=env,
                log_dir=run_dir,
                cwd=REPO_DIR,
            )
            group.start()
            records = Records(record_dir)
            try:
                idle_after = group.wait_idle()
                if "pickup" in scenario:
                    wait_for_quiet_host()
                meter = claims.ActivityMeter(conn)
                meter.start()
                window_start = time.monotonic()
                producer = self.produce(system, mode, jobs, batch, rate, commits_path, handler)
                timeout = 60 + jobs / SLOWEST_RATE
                wait_for(
                    lambda: records.poll() >= jobs,
                    timeout=timeout,
                    interval=0.02,
                    what=f"{jobs} handler starts ({records.count} so far)",
                )
                done_ns = wait_for(
                    lambda: system.unfinished(conn) == 0,
                    timeout=60,
                    interval=0.005,
                    what="the last jobs to be marked finished",
                )
                activity = meter.stop()
                window = time.monotonic() - window_start
                group.check_alive()
            except BaseException:
                group.stop(timeout=10)
                raise
            statuses = group.stop()
            records.poll()
            problems = records.problems(jobs) + system.leftovers(conn, jobs)
            if handler == "write":
                ((written,),) = conn.execute("SELECT count(*) FROM jobq_bench_written")
                if written != jobs:
                    problems.append(f"{written} rows written by {jobs} write jobs")
            if any(status not in (0, -15) for status in statuses):
                problems.append(f"worker exit statuses {statuses}")
            if problems:
                raise HarnessError(
                    f"{scenario}, {system.label} {config}: the run broke its checks:\n  "
                    + "\n  ".join(problems)
                    + f"\n  (worker logs in {run_dir})"
                )
            system.reset(conn)
        commits = read_commits(commits_path)
        starts = records.starts
        first_commit, last_commit = min(commits.values()), max(commits.values())
        if "burndown" in scenario:  # from the first handler start to the last job finished
            seconds = (done_ns - min(starts.values())) / 1e9
            done = jobs
        elif mode == "paced":  # the steady state: handler starts while the producer offered
            seconds = (last_commit - first_commit) / 1e9
            done = sum(1 for ns in starts.values() if ns <= last_commit)
        else:  # an unpaced producer: from its first commit to the last job finished
            seconds = (done_ns - first_commit) / 1e9
            done = jobs
        seconds = max(seconds, 1e-6)  # a paced run of a single transaction has no window
        latencies = [starts[n] - commits[n] for n in range(jobs)]
        trace = pickup_trace.breakdown(record_dir, commits, starts) if traced else {}
        traced_any = any(trace.values())  # a peer's run in a traced scenario traces nothing
        run = Run(
            scenario=scenario,
            system=system.name,
            label=system.label,
            config=str(config),
            rep=rep,
            jobs=jobs,
            seconds=seconds,
            rate=done / seconds,
            activity=activity_dict(activity, window),
            latencies_ns=[] if "burndown" in scenario else latencies,
            extra={
                "idle_wait_s": round(idle_after, 2),
                "handler_processes": records.processes(),
                "producer_s": producer["seconds"],
                "producer_late_ms": producer["late_ms"],
                "offered_rate": rate,
                # From the producer's last commit until every job was finished.
                "tail_s": (done_ns - last_commit) / 1e9,
                **({"offered": f"{rate:g}" if rate else "max"} if scenario == "sustained" else {}),
                **({"breakdown_ms": breakdown_ms(trace)} if traced_any else {}),
            },
        )
        self.runs.append(run)
        return run

    def produce(
        self,
        system: System,
        mode: str,
        jobs: int,
        batch: int,
        rate: float,
        out: Path,
        handler: str = "noop",
    ) -> dict[str, Any]:
        command = producer_command(
            system, mode, jobs=jobs, batch=batch, rate=rate, out=out, handler=handler
        )
        timeout = 120 + jobs / SLOWEST_RATE
        try:
            result = subprocess.run(
                command,
                env=system.env(),
                cwd=REPO_DIR,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise HarnessError(f"the producer did not finish within {timeout:.0f} s") from None
        if result.returncode:
            raise HarnessError(f"producer failed:\n{result.stdout}\n{result.stderr[-3000:]}")
        summary: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
        return summary

    # -- scenarios ------------------------------------------------------------------------

    def interleaved(self, entries: Sequence[Any], measure: Callable[[Any, int], Run]) -> None:
        """Run every entry ``reps`` times, A/B interleaved: the order rotates each round."""
        for rep in range(1, self.args.reps + 1):
            shift = (rep - 1) % max(1, len(entries))
            for entry in [*entries[shift:], *entries[:shift]]:
                run = measure(entry, rep)
                progress(run, self.args.reps)

    def claims_scaling(self) -> None:
        """bench/claims.py's cells: claimers x batch sizes, a bare psycopg loop, no worker."""
        jobq = self.system("jobq")
        claims.configure_django(jobq.url)
        context = multiprocessing.get_context("spawn")
        with jobq.connect() as monitor:
            for batch in self.args.claim_batches:
                for claimers in self.args.claimers:
                    results = []
                    for rep in range(1, self.args.reps + 1):
                        result = claims.run_once(
                            context,
                            jobq.url,
                            claimers,
                            batch,
                            self.args.claim_jobs,
                            monitor=monitor,
                        )
                        results.append(result)
                        print(
                            f"  claims: {claimers} claimers, batch {batch}, rep {rep}: "
                            f"{result.jobs_per_second:,.0f} jobs/s; "
                            f"{claims.describe(result.activity, result.seconds)}",
                            file=sys.stderr,
                            flush=True,
                        )
                    self.claim_cells.append(claims.Cell(claimers, batch, results))
            with monitor.cursor() as cursor:
                cursor.execute("TRUNCATE jobq_job")
        close_django_connections()

    def ceiling_run(self, jobs: int, rep: int) -> Run:
        """The raw-SQL ceiling: claim + ack_many from bench/claims.py's claimers."""
        jobq = self.system("jobq")
        claims.configure_django(jobq.url)
        claimers, batch = self.args.ceiling
        with jobq.connect() as monitor:
            result = claims.run_once(
                multiprocessing.get_context("spawn"),
                jobq.url,
                claimers,
                batch,
                jobs,
                monitor=monitor,
            )
        close_django_connections()
        run = Run(
            scenario="burndown",
            system="ceiling",
            label="raw SQL ceiling (claims.py loop)",
            config=f"{claimers} claimers, batch {batch}",
            rep=rep,
            jobs=jobs,
            seconds=result.seconds,
            rate=result.jobs_per_second,
            activity=activity_dict(result.activity, result.seconds),
        )
        self.runs.append(run)
        return run

    def enqueue(self) -> None:
        """Enqueue rate: ``--enqueue-jobs`` jobs in transactions of ``--enqueue-batch``."""
        args = self.args

        def measure(system: System, rep: int) -> Run:
            out = self.work_dir / f"enqueue-{system.name}-{rep}.txt"
            with system.connect() as conn:
                self.check_alone(system, conn)
                system.reset(conn)
                meter = claims.ActivityMeter(conn)
                meter.start()
                started = time.monotonic()
                summary = self.produce(
                    system, "rate", args.enqueue_jobs, args.enqueue_batch, 0, out
                )
                activity = activity_dict(meter.stop(), time.monotonic() - started)
                stored = system.unfinished(conn)
                system.reset(conn)
            if stored != args.enqueue_jobs:
                raise HarnessError(f"enqueued {args.enqueue_jobs} jobs, {stored} stored")
            run = Run(
                scenario="enqueue",
                system=system.name,
                label=system.label,
                config=f"{args.enqueue_batch} per transaction",
                rep=rep,
                jobs=args.enqueue_jobs,
                seconds=summary["seconds"],
                rate=args.enqueue_jobs / summary["seconds"],
                activity=activity,
            )
            self.runs.append(run)
            return run

        self.interleaved([self.system(name) for name in args.systems], measure)

    def burndown(self) -> None:
        """Jobs queued first (workers idle), then drained: jobs / (done - first start)."""
        args = self.args
        entries: list[Any] = self.entries(args.systems, args.configs)
        entries.append("ceiling")

        def measure(entry: Any, rep: int) -> Run:
            if entry == "ceiling":
                return self.ceiling_run(args.jobs, rep)
            return self.run_workers(
                "burndown", entry, rep, mode="bulk", jobs=args.jobs, batch=5_000
            )

        self.interleaved(entries, measure)

    def sustained(self) -> None:
        """Enqueue and drain at once: a producer offering R jobs/s (or as fast as it can)."""
        args = self.args
        for rate in args.sustained_rates:
            jobs = int(rate * args.sustained_seconds) if rate else args.jobs

            def measure(entry: Entry, rep: int, rate: float = rate, jobs: int = jobs) -> Run:
                return self.run_workers(
                    "sustained",
                    entry,
                    rep,
                    mode="paced" if rate else "unpaced",
                    jobs=jobs,
                    batch=args.sustained_batch,
                    rate=rate,
                )

            self.interleaved(self.entries(args.systems, args.configs), measure)

    def pickup(self, handler: str = "noop") -> None:
        """Pickup latency at ``--pickup-rate`` jobs/s, one job per transaction, of the no-op
        job or (``handler="write"``, scenario "pickup-write") of one that writes a row."""
        args = self.args
        jobs = int(args.pickup_rate * args.pickup_seconds)
        scenario = "pickup" if handler == "noop" else f"pickup-{handler}"
        systems = [name for name in args.systems if handler == "noop" or name != "tasksdb"]

        def measure(entry: Entry, rep: int) -> Run:
            return self.run_workers(
                scenario,
                entry,
                rep,
                mode="paced",
                jobs=jobs,
                batch=1,
                rate=args.pickup_rate,
                handler=handler,
            )

        self.interleaved(self.entries(systems, args.pickup_configs), measure)

    def pickup_write(self) -> None:
        self.pickup("write")

    def million_rows(self) -> None:
        jobq = self.system("jobq")
        claims.configure_django(jobq.url)
        with jobq.connect() as conn:
            self.million = million.run(conn, self.args.million_rows, self.args.million_claims)
        print(f"  million: {json.dumps(self.million)}", file=sys.stderr, flush=True)

    def tasks(self) -> None:
        """Django Tasks side by side: django-jobq's backend vs django-tasks-db's, same @task."""
        if not tasks_backend_available():
            self.skipped["tasks"] = (
                "django_jobq.tasks_backend is not importable in this checkout: the tasks "
                "scenario (JobqBackend vs django-tasks-db's DatabaseBackend) was skipped"
            )
            print(f"SKIPPED tasks: {self.skipped['tasks']}", file=sys.stderr)
            return
        args = self.args
        # django-tasks-db runs beside it unless ``--systems`` leaves ``tasksdb`` out.
        names = ["tasks-jobq", "tasks-db"] if "tasksdb" in args.systems else ["tasks-jobq"]
        configs = {"tasks-jobq": args.configs["jobq"], "tasks-db": args.configs["tasksdb"]}
        entries = self.entries(names, configs)

        def burndown(entry: Entry, rep: int) -> Run:
            return self.run_workers(
                "tasks-burndown", entry, rep, mode="bulk", jobs=args.jobs, batch=5_000
            )

        self.interleaved(entries, burndown)
        pickup_configs = {
            "tasks-jobq": args.pickup_configs["jobq"],
            "tasks-db": args.pickup_configs["tasksdb"],
        }
        jobs = int(args.pickup_rate * args.pickup_seconds)

        def pickup(entry: Entry, rep: int) -> Run:
            return self.run_workers(
                "tasks-pickup",
                entry,
                rep,
                mode="paced",
                jobs=jobs,
                batch=1,
                rate=args.pickup_rate,
            )

        self.interleaved(self.entries(names, pickup_configs), pickup)


def producer_command(
    system: System,
    mode: str,
    *,
    jobs: int,
    batch: int,
    rate: float,
    out: Path,
    first: int = 0,
    handler: str = "noop",
) -> list[str]:
    """The command line of :mod:`benchsite.produce` for ``system`` (run it with
    ``system.env()`` in ``REPO_DIR``): ``jobs`` jobs numbered from ``first``, of the
    ``handler`` job (``noop`` or ``write``)."""
    return [
        sys.executable,
        "-m",
        "benchsite.produce",
        system.name,
        mode,
        "--jobs",
        str(jobs),
        "--first",
        str(first),
        "--batch",
        str(batch),
        "--rate",
        str(rate),
        "--out",
        str(out),
        "--handler",
        handler,
    ]


def breakdown_ms(segments: dict[str, list[int]]) -> dict[str, dict[str, float]]:
    """A traced run's pickup segments (:func:`benchsite.pickup_trace.breakdown`): the p50,
    p99 and mean of each, in milliseconds, and how many jobs were traced."""
    return {
        name: {**summary_ms(values), "mean": sum(values) / len(values) / 1e6, "jobs": len(values)}
        for name, values in segments.items()
        if values
    }


def close_django_connections() -> None:
    """Close the harness's own Django connection (bench/claims.py loads jobs through it), so
    that :meth:`System.check_alone` sees no session but the workers'."""
    from django.db import connections

    connections.close_all()


def activity_dict(activity: claims.Activity, seconds: float) -> dict[str, Any]:
    return {
        "cpu": activity.host_cpu_busy,
        "load_before": activity.load_before,
        "other_tx_per_s": activity.other_commits / seconds if seconds > 0 else 0.0,
        "commit_ms": activity.commit_ms,
    }


def progress(run: Run, reps: int) -> None:
    latency = ""
    if run.latencies_ns:
        ms = summary_ms(run.latencies_ns)
        latency = f"; latency p50 {ms['p50']:.1f} p99 {ms['p99']:.1f} max {ms['max']:.1f} ms"
    activity = run.activity
    cpu = "?" if activity["cpu"] is None else f"{activity['cpu']:.0%}"
    print(
        f"  {run.scenario}: {run.label} {run.config}"
        f"{' @' + run.extra['offered'] + '/s' if 'offered' in run.extra else ''}"
        f" rep {run.rep}/{reps}: {run.jobs:,} jobs in {run.seconds:.2f} s = "
        f"{run.rate:,.0f} jobs/s{latency}; host CPU {cpu}, load before "
        f"{activity['load_before']:.1f}, other dbs {activity['other_tx_per_s']:,.0f} tx/s, "
        f"commit {activity['commit_ms']:.2f} ms",
        file=sys.stderr,
        flush=True,
    )


def grouped(runs: Sequence[Run]) -> dict[tuple[str, str, str, str], list[Run]]:
    """Runs grouped by (scenario, system, config, offered rate), in first-seen order."""
    groups: dict[tuple[str, str, str, str], list[Run]] = {}
    for run in runs:
        groups.setdefault(run.key, []).append(run)
    return groups
