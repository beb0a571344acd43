"""Benchmark harness: django-jobq side by side with procrastinate and django-tasks-db.

Not a test: it measures, on the same PostgreSQL server and the same host, with each
system's real workers (``manage.py jobq_worker``, ``procrastinate worker``,
``manage.py db_worker``), and checks on every run that each job ran exactly once.

Usage (from the repository root; any Python 3.11+ starts it)::

    python3 bench/run.py --quick                       # smoke run of everything (~5 min)
    python3 bench/run.py                               # full run, 3 repetitions (~40 min)
    python3 bench/run.py --scenarios pickup,burndown --systems jobq,procrastinate
    python3 bench/run.py --config jobq=1x8/64,2x4/32 --scenarios burndown
    python3 bench/run.py --scenarios backlog           # 1,000,000-job backlogs, own clusters
    python3 bench/run.py --scenarios backlog --seeds-case   # 7.2M backlog + 2,000 jobs/s

The first run creates ``bench/.venv`` (the peers, matplotlib and this checkout, editable;
never the project's own dependencies) from ``bench/requirements.txt`` and re-runs itself
there. Results: a Markdown report on stdout and in ``bench/results/<stamp>.md``, the raw
runs in ``.json``, a chart in ``.png``. See bench/README.md for the method.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import subprocess
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
VENV = BENCH_DIR / ".venv"
REQUIREMENTS = BENCH_DIR / "requirements.txt"
SCENARIOS = (
    "claims",
    "enqueue",
    "burndown",
    "sustained",
    "pickup",
    "pickup-write",
    "million",
    "tasks",
    "backlog",
)
#: Run unless --scenarios names others: every scenario but the backlog (long, and on
#: clusters of its own rather than --server-url).
DEFAULT_SCENARIOS = tuple(name for name in SCENARIOS if name != "backlog")
PEER_SYSTEMS = ("jobq", "procrastinate", "tasksdb")
#: bench/backlog.py's conditions (kept here too: --help answers before the venv exists).
BACKLOG_CONDITIONS = ("autovacuum", "no-autovacuum", "snapshot")
DEFAULT_SERVER = "postgres://postgres@127.0.0.1:5432"

#: Worker configurations (PROCESSESxCONCURRENCY[/BATCH], comma-separated: each is a row) for
#: burn-down and sustained, and for pickup latency (an idle-ish single process). Each was the
#: best of a small sweep on the reference machine (2 cores, busy with other work then):
#: procrastinate 1x8, 2x4, 2x8, 4x4, django-tasks-db 2x1, 4x1, 8x1; django-jobq re-swept on
#: the LISTEN/NOTIFY worker with batched acks (bench/README.md, "Choosing the defaults"):
#: 1x8/64, 1x16/128, 2x4/32, 2x8/64, 2x8/128, 2x16/128, 2x16/256 for burn-down, 1x4, 1x8/8,
#: 2x4/4 for pickup. django-tasks-db's db_worker runs one task per process: its slots are
#: processes.
DEFAULT_CONFIGS = {"jobq": "2x8/128,2x16/256", "procrastinate": "4x4", "tasksdb": "8x1"}
DEFAULT_PICKUP_CONFIGS = {"jobq": "1x4", "procrastinate": "1x4", "tasksdb": "4x1"}

#: Sizes: (full, --quick).
SIZES = {
    "reps": (3, 1),
    "jobs": (20_000, 5_000),
    "claim_jobs": (20_000, 2_000),
    "enqueue_jobs": (50_000, 20_000),
    "pickup_seconds": (30.0, 5.0),
    "sustained_seconds": (10.0, 3.0),
    "million_claims": (2_000, 500),
    "backlog_jobs": (1_000_000, 50_000),
    "seeds_backlog": (7_200_000, 100_000),
    "seeds_rate": (2_000.0, 500.0),
}


def ensure_venv(argv: Sequence[str]) -> None:
    """Re-run this script in bench/.venv, creating or updating it first (when
    requirements.txt or pyproject.toml changed since it was installed)."""
    if Path(sys.prefix).resolve() == VENV.resolve():
        return
    python = VENV / "bin" / "python"
    stamp = VENV / ".installed-sha256"
    digest = hashlib.sha256(
        REQUIREMENTS.read_bytes() + (REPO_DIR / "pyproject.toml").read_bytes()
    ).hexdigest()
    if not python.exists():
        print(f"creating the benchmark venv {VENV} ...", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    if not stamp.exists() or stamp.read_text().strip() != digest:
        print("installing bench/requirements.txt into it ...", file=sys.stderr, flush=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "--upgrade", "pip"], check=True
        )
        install = ["-r", str(REQUIREMENTS), "-e", str(REPO_DIR)]
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *install], check=True)
        stamp.write_text(digest)
    os.execv(str(python), [str(python), str(Path(__file__).resolve()), *argv])  # noqa: S606


def parse_args(argv: Sequence[str], *, resolve: bool = True) -> argparse.Namespace:
    """The options; with ``resolve`` (in the venv) the worker configs are parsed too."""

    def names(allowed: Sequence[str]) -> type:
        def parse(text: str) -> list[str]:
            values = [part.strip() for part in text.split(",") if part.strip()]
            unknown = sorted(set(values) - set(allowed))
            if unknown or not values:
                raise argparse.ArgumentTypeError(f"choose from {', '.join(allowed)}")
            return values

        return parse  # type: ignore[return-value]

    def ints(text: str) -> list[int]:
        return [int(part) for part in text.split(",")]

    def rates(text: str) -> list[float]:
        return [0.0 if part.strip() == "max" else float(part) for part in text.split(",")]

    parser = argparse.ArgumentParser(
        description="django-jobq benchmarks side by side with procrastinate and "
        "django-tasks-db (see bench/README.md)."
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: small sizes, 1 rep")
    parser.add_argument(
        "--scenarios",
        type=names(SCENARIOS),
        default=list(DEFAULT_SCENARIOS),
        help=f"comma-separated, default all but backlog: {','.join(SCENARIOS)}",
    )
    parser.add_argument(
        "--systems",
        type=names(PEER_SYSTEMS),
        default=list(PEER_SYSTEMS),
        help="systems of the side-by-side scenarios (default: all three)",
    )
    parser.add_argument("--reps", type=int, help="repetitions (default 3, --quick 1)")
    parser.add_argument("--jobs", type=int, help="burn-down jobs (default 20,000, quick 5,000)")
    parser.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="SYSTEM=PxC[/B],...",
        help="worker configs for burn-down and sustained, e.g. jobq=1x8/64,2x4/32 "
        f"(defaults: {', '.join(f'{k}={v}' for k, v in DEFAULT_CONFIGS.items())})",
    )
    parser.add_argument(
        "--pickup-config",
        action="append",
        default=[],
        metavar="SYSTEM=PxC[/B]",
        help="worker config for pickup latency "
        f"(defaults: {', '.join(f'{k}={v}' for k, v in DEFAULT_PICKUP_CONFIGS.items())})",
    )
    parser.add_argument("--pickup-rate", type=float, default=200.0, help="jobs/s (default 200)")
    parser.add_argument("--pickup-seconds", type=float, help="default 30, quick 5")
    parser.add_argument(
        "--trace-pickup",
        action="store_true",
        help="time each step of django-jobq's pickup (benchsite/pickup_trace.py) and report "
        "where the latency goes; a profile, its latencies are not benchmark figures",
    )
    parser.add_argument(
        "--queue-limits",
        metavar="JSON",
        help="django-jobq only: JOBQ['QUEUES'] limits of the bench queue for every worker, "
        'e.g. \'{"CONCURRENCY_LIMIT": 1000, "RATE_LIMIT": "10000/s"}\' (the cost of flow '
        "control: docs/flow-control.md)",
    )
    parser.add_argument(
        "--limited-queue",
        metavar="JSON",
        help="django-jobq only: every worker also serves an empty queue 'bench-limited' with "
        "these JOBQ['QUEUES'] limits, e.g. '{\"CONCURRENCY_LIMIT\": 5}' (what serving a "
        "limited queue costs the pickup of an unlimited one)",
    )
    parser.add_argument(
        "--sustained-rates",
        type=rates,
        help="offered jobs/s, 'max' for an unpaced producer (default 2000,max; quick 2000)",
    )
    parser.add_argument("--sustained-seconds", type=float, help="default 10, quick 3")
    parser.add_argument(
        "--sustained-batch", type=int, default=10, help="jobs per producer transaction (10)"
    )
    parser.add_argument("--enqueue-jobs", type=int, help="default 50,000, quick 20,000")
    parser.add_argument(
        "--enqueue-batch", type=int, default=5_000, help="jobs per transaction (5,000)"
    )
    parser.add_argument("--claimers", type=ints, default=[1, 2, 4, 8])
    parser.add_argument("--claim-batches", type=ints, default=[1, 10, 100])
    parser.add_argument("--claim-jobs", type=int, help="default 20,000, quick 2,000")
    parser.add_argument(
        "--ceiling",
        default="2x100",
        help="raw-SQL ceiling in burn-down: CLAIMERSxBATCH (default 2x100)",
    )
    parser.add_argument("--million-rows", type=int, default=1_000_000)
    parser.add_argument("--million-claims", type=int, help="claims per batch size (2,000)")
    parser.add_argument(
        "--server-url",
        default=DEFAULT_SERVER,
        help="PostgreSQL server, without a database (default %(default)s); the harness "
        "creates and empties its own databases jobq_bench_run, jobq_bench_procrastinate, "
        "jobq_bench_tasksdb and jobq_bench_tasks there",
    )
    backlog = parser.add_argument_group(
        "backlog", "the large-backlog scenario (--scenarios backlog; bench/README.md)"
    )
    backlog.add_argument(
        "--backlog-jobs", type=int, help="jobs in each backlog (default 1,000,000; quick 50,000)"
    )
    backlog.add_argument(
        "--backlog-empty-jobs",
        type=int,
        default=20_000,
        help="jobs of the drain that gives the empty-table claim latency (%(default)s)",
    )
    backlog.add_argument(
        "--backlog-conditions",
        type=names(BACKLOG_CONDITIONS),
        default=list(BACKLOG_CONDITIONS),
        help="comma-separated, default all: autovacuum (a), no-autovacuum (b), snapshot (c)",
    )
    backlog.add_argument(
        "--backlog-log-cost",
        choices=[*BACKLOG_CONDITIONS, "none"],
        default="autovacuum",
        help="the condition run once more without statement logging, to show what the "
        "logging costs (default %(default)s; none: skip)",
    )
    backlog.add_argument(
        "--backlog-config",
        default="2x16/256",
        help="worker PROCESSESxCONCURRENCY/BATCH (default %(default)s: jobq_worker "
        "--processes 2 --concurrency 16 --batch-size 256)",
    )
    backlog.add_argument(
        "--seeds-case",
        action="store_true",
        help="instead of the conditions: the seeds' case, a backlog plus jobs arriving, on "
        "condition (a) (~15-25 minutes at full size)",
    )
    backlog.add_argument(
        "--seeds-backlog", type=int, help="its backlog (default 7,200,000; quick 100,000)"
    )
    backlog.add_argument(
        "--seeds-rate", type=float, help="its arrivals, jobs/s (default 2,000; quick 500)"
    )
    backlog.add_argument(
        "--seeds-max-seconds",
        type=float,
        default=3_600.0,
        help="give up catching up after this long (default %(default)s)",
    )
    parser.add_argument("--results-dir", type=Path, default=BENCH_DIR / "results")
    args = parser.parse_args(argv)
    for name, (full, quick) in SIZES.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    if args.sustained_rates is None:
        args.sustained_rates = [2000.0] if args.quick else [2000.0, 0.0]
    try:
        claimers, batch = (int(part) for part in args.ceiling.split("x"))
    except ValueError:
        parser.error("--ceiling must be CLAIMERSxBATCH, e.g. 2x100")
    args.ceiling = (claimers, batch)
    if resolve:
        from systems import WorkerConfig

        try:
            args.backlog_config = WorkerConfig.parse(args.backlog_config)
        except ValueError as exc:
            parser.error(f"--backlog-config: {exc}")
        args.configs = config_map(parser, DEFAULT_CONFIGS, args.config)
        args.pickup_configs = config_map(parser, DEFAULT_PICKUP_CONFIGS, args.pickup_config)
    return args


def config_map(
    parser: argparse.ArgumentParser, defaults: dict[str, str], given: Sequence[str]
) -> dict[str, list[object]]:
    from systems import WorkerConfig

    texts = dict(defaults)
    for item in given:
        system, _, configs = item.partition("=")
        if system not in defaults or not configs:
            parser.error(f"expected SYSTEM=CONFIGS with SYSTEM in {', '.join(defaults)}")
        texts[system] = configs
    try:
        return {
            system: [WorkerConfig.parse(part) for part in text.split(",")]
            for system, text in texts.items()
        }
    except ValueError as exc:
        parser.error(str(exc))


def setup_lines(facts: Any, args: argparse.Namespace, load: Sequence[float]) -> list[str]:
    """The report's setup section; ``load`` is the host's load average at the start."""
    from importlib.metadata import version

    from systems import jobq_worker_has_processes_option

    settings = facts.server_settings
    processes = (
        "supported"
        if jobq_worker_has_processes_option()
        else "not supported (the harness starts N jobq_worker processes)"
    )
    packages = ("Django", "psycopg", "procrastinate", "django-tasks", "django-tasks-db")
    return [
        f"- machine: {facts.cpu_model}; {facts.logical_cpus} logical CPUs; "
        f"load average at the start {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} "
        "(shared host: other engineers' test suites may run)",
        f"- Python {facts.python}; "
        + ", ".join(f"{name} {version(name)}" for name in packages)
        + f", matplotlib {version('matplotlib')}",
        f"- django-jobq: {facts.code}; `jobq_worker --processes`: {processes}",
        f"- server: {facts.server_version}, on this host (workers, producers and server "
        "share the CPUs)",
        f"- durability (read from the server, left unchanged): fsync={settings['fsync']} "
        f"synchronous_commit={settings['synchronous_commit']} "
        f"full_page_writes={settings['full_page_writes']} "
        f"wal_sync_method={settings['wal_sync_method']} commit_delay={settings['commit_delay']} "
        f"shared_buffers={settings['shared_buffers']}",
        f"- repetitions: {args.reps}, A/B interleaved (the order of the systems rotates each "
        "round); jobs/s are medians, latencies are pooled percentiles",
        f"- sizes: burn-down {args.jobs:,} jobs; sustained {args.sustained_seconds:g} s per "
        f"offered rate, {args.sustained_batch} jobs per producer transaction; pickup "
        f"{args.pickup_rate:g} jobs/s for {args.pickup_seconds:g} s, one job per transaction; "
        f"enqueue {args.enqueue_jobs:,} jobs, {args.enqueue_batch:,} per transaction",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parse_args(argv, resolve=False)  # --help and bad options answer before any install
    ensure_venv(argv)
    args = parse_args(argv)
    sys.path.insert(1, str(REPO_DIR))  # tests/cluster.py: the backlog scenario's clusters

    import tempfile
    import time
    from datetime import UTC, datetime

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # runs the cleanup that stops the workers

    signal.signal(signal.SIGTERM, interrupt)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S") + ("-quick" if args.quick else "")
    work_dir = Path(tempfile.mkdtemp(prefix="jobq-bench-"))
    shared = [name for name in SCENARIOS if name in args.scenarios and name != "backlog"]
    status = 0
    if shared:
        status = run_shared(args, argv, shared, stamp, work_dir)
    if "backlog" in args.scenarios and status != 130:
        started = time.monotonic()
        status = max(status, run_backlog(args, argv, stamp, work_dir))
        print(f"backlog scenario: {(time.monotonic() - started) / 60:.1f} min", file=sys.stderr)
    if status == 0:
        import shutil

        shutil.rmtree(work_dir, ignore_errors=True)
    else:
        print(f"worker logs kept in {work_dir}", file=sys.stderr)
    return status


def run_shared(
    args: argparse.Namespace, argv: list[str], order: list[str], stamp: str, work_dir: Path
) -> int:
    """The scenarios on the --server-url server; their report. Returns the exit status."""
    import time

    import claims
    import report
    from measure import HarnessError
    from scenarios import Bench

    started = time.monotonic()
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    bench = Bench(args, work_dir)
    jobq = bench.system("jobq")
    with jobq.connect() as conn:
        claims.configure_django(jobq.url)
        facts = claims.machine_facts(conn, jobq.url)
    warnings = claims.durability_warnings(facts)
    if warnings:
        print("WARNING: durability is reduced: " + "; ".join(warnings), file=sys.stderr)
    status = 0
    try:
        for name in order:
            print(f"== {name}", file=sys.stderr, flush=True)
            {
                "claims": bench.claims_scaling,
                "enqueue": bench.enqueue,
                "burndown": bench.burndown,
                "sustained": bench.sustained,
                "pickup": bench.pickup,
                "pickup-write": bench.pickup_write,
                "million": bench.million_rows,
                "tasks": bench.tasks,
            }[name]()
    except (HarnessError, claims.BenchmarkError) as exc:
        print(f"\nBENCHMARK FAILED: {exc}", file=sys.stderr)
        status = 1
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        status = 130
    except Exception:  # a harness bug: still write the report of what ran
        traceback.print_exc()
        status = 1
    elapsed = time.monotonic() - started
    title = (
        f"django-jobq benchmarks, {stamp} ({'--quick' if args.quick else 'full'} run, "
        f"{elapsed / 60:.1f} min{', FAILED' if status else ''})"
    )
    text = report.markdown(bench, setup_lines(facts, args, load), title)
    print(text)
    chart = report.save(bench, text, args.results_dir, stamp, {"argv": argv, "elapsed_s": elapsed})
    print(f"report: {chart.with_suffix('.md')}\nchart: {chart}", file=sys.stderr)
    return status


def run_backlog(args: argparse.Namespace, argv: list[str], stamp: str, work_dir: Path) -> int:
    """The backlog scenario on clusters of its own; its report. Returns the exit status."""
    import backlog
    import backlog_report

    print("== backlog" + (" (the seeds' case)" if args.seeds_case else ""), file=sys.stderr)
    status = 0
    try:
        result = backlog.run(args, work_dir / "backlog", argv)
    except Exception:  # a harness bug outside a drain: nothing to report
        traceback.print_exc()
        return 1
    if result.failure:
        print(f"\nBACKLOG FAILED: {result.failure}", file=sys.stderr)
        status = 130 if result.failure == "interrupted" else 1
    stem = f"{stamp}-backlog" + ("-seeds" if args.seeds_case else "")
    text = backlog_report.markdown(result, stem)
    print(text)
    chart = backlog_report.save(result, text, args.results_dir, stem)
    print(f"report: {chart.with_suffix('.md')}\nchart: {chart}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
