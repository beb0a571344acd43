"""``manage.py jobq_worker``: run a worker until SIGTERM/SIGINT (or, with --burst, until idle)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import tempfile
from argparse import ArgumentParser
from collections.abc import Callable
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError, connections
from django.db.migrations.executor import MigrationExecutor

from ... import scheduling, tracing
from ...conf import MAX_ASYNC_CONCURRENCY, QUEUE_NAME_RE, get_settings
from ...metrics.multiprocess import mark_process_dead, prepare_multiprocess
from ...metrics.server import MetricsServer, serve, serve_multiprocess
from ...worker.supervisor import Supervisor
from ...worker.worker import (
    MAX_BATCH_SIZE,
    MAX_CONCURRENCY,
    MAX_POLL_INTERVAL,
    MAX_WORKER_ID_LENGTH,
    SHUTDOWN_SLACK,
    Worker,
    worker_id_problem,
)
from ..arguments import bounded_int, seconds

logger = logging.getLogger("django_jobq.worker")

#: The most worker processes one supervisor runs.
MAX_PROCESSES = 256


def run_worker(options: dict[str, Any], *, supervised: bool = False) -> int:
    """Run one worker with the command's options until it is stopped; return the exit
    status (1 if the shutdown timeout left jobs running). The first SIGTERM/SIGINT stops it
    gracefully; a second one exits at once, unless ``supervised``: then the supervisor
    decides (see :mod:`django_jobq.worker.supervisor`) and later signals are ignored."""
    worker = Worker(
        queues=options["queues"],
        concurrency=options["concurrency"],
        batch_size=options["batch_size"],
        poll_interval=options["poll_interval"],
        worker_id=options["worker_id"],
        burst=options["burst"],
        shutdown_timeout=options["shutdown_timeout"],
        scheduler=options["scheduler"],
        listen=options["listen"],
        async_concurrency=options["async_concurrency"],
    )

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if worker.stopping and supervised:
            return  # the same stop, come again through the supervisor or the process group
        if worker.stopping:
            logger.warning("second %s: exiting now", signal.Signals(signum).name)
            sys.stderr.flush()
            os._exit(1)
        logger.info(
            "%s: finishing running jobs, then exiting (send again to exit now)",
            signal.Signals(signum).name,
        )
        worker.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    stats = worker.run()
    return 1 if stats.abandoned else 0


class Command(BaseCommand):
    help = (
        "Run a django-jobq worker. SIGTERM or Ctrl-C stops it gracefully: no new claims, "
        "prefetched jobs are released, running jobs finish (exit 0) or the shutdown timeout "
        "passes (exit 1). A second signal exits at once (exit 1). Jobs left running have "
        "their leases lapse, and other workers retry them."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "--queue",
            action="append",
            dest="queues",
            metavar="QUEUE",
            help="Claim from this queue (repeatable). Default: every queue.",
        )
        parser.add_argument(
            "--concurrency",
            type=bounded_int(1, MAX_CONCURRENCY),
            default=1,
            help="Handler threads, each with its own database connection (default 1).",
        )
        parser.add_argument(
            "--async-concurrency",
            type=bounded_int(1, MAX_ASYNC_CONCURRENCY),
            default=None,
            metavar="N",
            help="Async jobs (async def handlers) run side by side on the process's event "
            "loop, on top of the threads; only when the process registers async kinds "
            "(default JOBQ['ASYNC_CONCURRENCY'], 100).",
        )
        parser.add_argument(
            "--batch-size",
            type=bounded_int(1, MAX_BATCH_SIZE),
            default=None,
            help="Most jobs claimed at once and held ahead of a free thread or async slot "
            "(default: the concurrency, plus the async concurrency when it serves async "
            "kinds).",
        )
        parser.add_argument(
            "--poll-interval",
            type=seconds(MAX_POLL_INTERVAL),
            default=None,
            metavar="SECONDS",
            help=(
                "Seconds to wait at most after a claim found nothing; a new job's "
                "notification, a job or lease falling due, or a schedule tick wakes the "
                "worker sooner (default JOBQ['POLL_INTERVAL'], 1 s)."
            ),
        )
        parser.add_argument(
            "--shutdown-timeout",
            type=seconds(24 * 3600),
            default=30.0,
            metavar="SECONDS",
            help="After SIGTERM, how long running jobs may take to finish before the worker "
            "exits anyway, leaving their leases to lapse (default 30). Keep it below your "
            "process manager's kill timeout.",
        )
        parser.add_argument(
            "--worker-id",
            default=None,
            help=f"Default: host:pid. At most {MAX_WORKER_ID_LENGTH} characters, counting the "
            "-<slot> suffix each process gets with --processes; no control or invisible "
            "characters (newline, tab, NUL, ...).",
        )
        parser.add_argument(
            "--burst",
            action="store_true",
            help="Exit with status 0 once no job is due and no job of its queues is running "
            "under any worker's lease, live or lapsed: a recovery run waits for a crashed "
            "worker's lease to lapse, reclaims the job and runs it. Jobs due later (scheduled, "
            "or retries in backoff) do not keep it.",
        )
        parser.add_argument(
            "--processes",
            type=bounded_int(1, MAX_PROCESSES),
            default=1,
            help="Worker processes, each with --concurrency threads, under one supervisor that "
            "restarts a process that dies and forwards SIGTERM/SIGINT (default 1: no "
            "supervisor). On 2 cores, 2 processes beat 1 for short jobs.",
        )
        parser.add_argument(
            "--no-listen",
            action="store_false",
            dest="listen",
            help="Do not LISTEN for enqueue notifications; only poll (e.g. behind PgBouncer "
            "in transaction pooling mode, which cannot carry LISTEN, unless "
            "JOBQ['LISTEN_DATABASE'] names a direct connection).",
        )
        parser.add_argument(
            "--no-scheduler",
            action="store_false",
            dest="scheduler",
            help="Do not enqueue the jobs of schedule ticks (other workers' schedulers do).",
        )
        parser.add_argument(
            "--metrics-port",
            type=bounded_int(0, 65535),
            default=None,
            metavar="PORT",
            help="Serve this process's Prometheus metrics on http://ADDR:PORT/metrics "
            "(0: any free port, logged). Default: not served.",
        )
        parser.add_argument(
            "--metrics-addr",
            default="0.0.0.0",  # noqa: S104 - scraped from other hosts, as exporters are
            metavar="ADDR",
            help="Address the metrics server binds (default 0.0.0.0: every interface).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        for queue in options["queues"] or []:
            if not QUEUE_NAME_RE.match(queue):
                raise CommandError(
                    f"invalid queue name {queue!r}: expected {QUEUE_NAME_RE.pattern}"
                )
        _refuse_unmigrated_schema()
        processes = options["processes"]
        if options["worker_id"] is not None:
            self._check_worker_id(options["worker_id"], processes)
        self._configure_logging(options["verbosity"])
        port, addr = options["metrics_port"], options["metrics_addr"]
        if processes == 1:
            server = self._serve_metrics(port, addr, serve)
            try:
                status = run_worker(options)
            finally:
                if server is not None:
                    server.close()
        else:
            status = self._supervise(processes, options)
        if status:
            sys.exit(status)

    def _check_worker_id(self, worker_id: str, processes: int) -> None:
        """Refuse an id that could not name every process (each supervised one gets the
        suffix ``-<slot>``, counted in the length)."""
        suffix = f"-{processes - 1}" if processes > 1 else ""
        problem = worker_id_problem(worker_id, max_length=MAX_WORKER_ID_LENGTH - len(suffix))
        if problem is None:
            return
        if suffix:
            problem += f" (with --processes {processes}, the ids get the suffixes -0 to {suffix})"
        raise CommandError(f"--worker-id {problem}.")

    def _supervise(self, processes: int, options: dict[str, Any]) -> int:
        """Run ``processes`` workers under a supervisor; with ``--metrics-port`` it serves
        the sum of their metrics (prometheus-client's multiprocess mode, in a directory of
        its own for this run)."""
        if options["scheduler"]:
            scheduling.collect()  # an invalid schedule fails here, not in every child

        def run_slot(slot: int) -> int:
            given = options["worker_id"]
            worker_id = f"{given}-{slot}" if given else None
            try:
                return run_worker({**options, "worker_id": worker_id}, supervised=True)
            finally:
                # A forked child ends without atexit handlers, so the SDK would not flush.
                if tracing.ENABLED:
                    tracing.flush()

        port, addr = options["metrics_port"], options["metrics_addr"]
        with contextlib.ExitStack() as cleanup:
            on_exit = None
            if port is not None:
                directory = cleanup.enter_context(
                    tempfile.TemporaryDirectory(prefix="jobq-metrics-")
                )
                prepare_multiprocess(directory)  # before any child is forked
                server = self._serve_metrics(port, addr, serve_multiprocess)
                assert server is not None
                cleanup.callback(server.close)
                on_exit = mark_process_dead
            # A child exits by its shutdown timeout plus the slack; a second later it is killed.
            timeout = options["shutdown_timeout"]
            stop_timeout = None if timeout is None else timeout + SHUTDOWN_SLACK + 1
            supervisor = Supervisor(
                processes,
                run_slot,
                restart_finished=not options["burst"],
                on_exit=on_exit,
                stop_timeout=stop_timeout,
            )
            return supervisor.run()

    def _serve_metrics(
        self, port: int | None, addr: str, serve: Callable[[int, str], MetricsServer]
    ) -> MetricsServer | None:
        if port is None:
            return None
        try:
            server = serve(port, addr)
        except OSError as exc:
            raise CommandError(f"cannot serve metrics on {addr}:{port}: {exc}") from exc
        logger.info("serving metrics on http://%s:%s/metrics", addr, server.port)
        return server

    def _configure_logging(self, verbosity: int) -> None:
        """Make the worker's log lines visible, once each (docs/operations.md, "Logging").

        If the project's ``LOGGING`` configures ``django_jobq`` (or a logger below it) with
        a handler or a level, that configuration is used as it is. Otherwise the verbosity
        sets the ``django_jobq`` level (0: warnings and errors, among them every failed
        attempt and dead letter; 1, the default: also start/stop summaries; 2+: also one
        line per job) and the lines go to the root logger's handlers if the project has
        any, else to a stderr handler of the command's own (then they do not propagate).
        """
        if _configured_by_project("django_jobq"):
            return
        jobq_logger = logging.getLogger("django_jobq")
        jobq_logger.setLevel({0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG))
        if logging.getLogger().handlers:
            return  # the project's root handlers print them
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        jobq_logger.addHandler(handler)
        jobq_logger.propagate = False


def _refuse_unmigrated_schema() -> None:
    """Refuse to start a worker whose release has django_jobq migrations the queue database
    lacks (an upgrade deployed before ``migrate``): its statements name columns that do not
    exist yet, so every claim would fail. An unreachable database is not refused here: the
    worker waits for it and reconnects (docs/operations.md).

    Raises:
        CommandError: naming the unapplied migrations and the command that applies them.
    """
    alias = get_settings().DATABASE
    try:
        executor = MigrationExecutor(connections[alias])
        plan = executor.migration_plan(executor.loader.graph.leaf_nodes("django_jobq"))
    except DatabaseError:
        return
    unapplied = [
        migration.name
        for migration, backwards in plan
        if migration.app_label == "django_jobq" and not backwards
    ]
    if unapplied:
        raise CommandError(
            f"the queue database ({alias!r}) lacks django_jobq migrations of this release: "
            f"{', '.join(unapplied)}. Run 'manage.py migrate' (--database {alias}) before "
            "starting its workers (docs/deploying.md, 'Upgrading django-jobq')."
        )


def _configured_by_project(name: str) -> bool:
    """Whether logger ``name`` or one below it has a handler or a level of its own."""
    loggers = logging.Logger.manager.loggerDict
    for logger_name, found in loggers.items():
        below = logger_name == name or logger_name.startswith(f"{name}.")
        if below and isinstance(found, logging.Logger) and (found.handlers or found.level):
            return True
    return False
