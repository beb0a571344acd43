"""``manage.py jobq_worker``: run a worker until SIGTERM/SIGINT (or, with --burst, until idle)."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import sys
import tempfile
from argparse import ArgumentParser, ArgumentTypeError
from collections.abc import Callable
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ... import metrics, schedules
from ...conf import QUEUE_NAME_RE
from ...worker.supervisor import Supervisor
from ...worker.worker import (
    MAX_BATCH_SIZE,
    MAX_CONCURRENCY,
    MAX_POLL_INTERVAL,
    MAX_WORKER_ID_LENGTH,
    SHUTDOWN_SLACK,
    Worker,
)

logger = logging.getLogger("django_jobq.worker")

#: The most worker processes one supervisor runs.
MAX_PROCESSES = 256


def _bounded_int(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if not low <= value <= high:
            raise ArgumentTypeError(f"expected a whole number from {low} to {high}, not {text!r}")
        return value

    return parse


def _seconds(high: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not 0 < value <= high:  # also refuses NaN and infinity
            raise ArgumentTypeError(f"expected seconds, more than 0 and at most {high:g}")
        return value

    return parse


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
            type=_bounded_int(1, MAX_CONCURRENCY),
            default=1,
            help="Handler threads, each with its own database connection (default 1).",
        )
        parser.add_argument(
            "--batch-size",
            type=_bounded_int(1, MAX_BATCH_SIZE),
            default=None,
            help="Most jobs claimed at once and held ahead of a free thread "
            "(default: the concurrency).",
        )
        parser.add_argument(
            "--poll-interval",
            type=_seconds(MAX_POLL_INTERVAL),
            default=None,
            metavar="SECONDS",
            help="Sleep after finding no job (default JOBQ['POLL_INTERVAL'], 1 s).",
        )
        parser.add_argument(
            "--shutdown-timeout",
            type=_seconds(24 * 3600),
            default=30.0,
            metavar="SECONDS",
            help="After SIGTERM, how long running jobs may take to finish before the worker "
            "exits anyway, leaving their leases to lapse (default 30). Keep it below your "
            "process manager's kill timeout.",
        )
        parser.add_argument(
            "--worker-id",
            default=None,
            help=f"Default: host:pid. At most {MAX_WORKER_ID_LENGTH} characters.",
        )
        parser.add_argument(
            "--burst",
            action="store_true",
            help="Exit with status 0 once no job is due and none is running.",
        )
        parser.add_argument(
            "--processes",
            type=_bounded_int(1, MAX_PROCESSES),
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
            "in transaction pooling mode, which cannot carry LISTEN).",
        )
        parser.add_argument(
            "--no-scheduler",
            action="store_false",
            dest="scheduler",
            help="Do not enqueue the jobs of schedule ticks (other workers' schedulers do).",
        )
        parser.add_argument(
            "--metrics-port",
            type=_bounded_int(0, 65535),
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
        worker_id = options["worker_id"]
        if worker_id is not None and not 0 < len(worker_id) <= MAX_WORKER_ID_LENGTH:
            raise CommandError(f"--worker-id must be 1 to {MAX_WORKER_ID_LENGTH} characters.")
        self._configure_logging(options["verbosity"])
        processes = options["processes"]
        port, addr = options["metrics_port"], options["metrics_addr"]
        if processes == 1:
            server = self._serve_metrics(port, addr, metrics.serve)
            try:
                status = run_worker(options)
            finally:
                if server is not None:
                    server.close()
        else:
            status = self._supervise(processes, options)
        if status:
            sys.exit(status)

    def _supervise(self, processes: int, options: dict[str, Any]) -> int:
        """Run ``processes`` workers under a supervisor; with ``--metrics-port`` it serves
        the sum of their metrics (prometheus-client's multiprocess mode, in a directory of
        its own for this run)."""
        if options["scheduler"]:
            schedules.collect()  # an invalid schedule fails here, not in every child

        def run_slot(slot: int) -> int:
            given = options["worker_id"]
            worker_id = f"{given}-{slot}" if given else None
            return run_worker({**options, "worker_id": worker_id}, supervised=True)

        port, addr = options["metrics_port"], options["metrics_addr"]
        with contextlib.ExitStack() as cleanup:
            on_exit = None
            if port is not None:
                directory = cleanup.enter_context(
                    tempfile.TemporaryDirectory(prefix="jobq-metrics-")
                )
                metrics.prepare_multiprocess(directory)  # before any child is forked
                server = self._serve_metrics(port, addr, metrics.serve_multiprocess)
                assert server is not None
                cleanup.callback(server.close)
                on_exit = metrics.mark_process_dead
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
        self, port: int | None, addr: str, serve: Callable[[int, str], metrics.MetricsServer]
    ) -> metrics.MetricsServer | None:
        if port is None:
            return None
        try:
            server = serve(port, addr)
        except OSError as exc:
            raise CommandError(f"cannot serve metrics on {addr}:{port}: {exc}") from exc
        logger.info("serving metrics on http://%s:%s/metrics", addr, server.port)
        return server

    def _configure_logging(self, verbosity: int) -> None:
        """Log to stderr unless the project's LOGGING already handles django_jobq.

        Verbosity 0: warnings; 1 (default): start/stop summaries; 2+: one line per job.
        """
        jobq_logger = logging.getLogger("django_jobq")
        if jobq_logger.handlers:
            return
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        jobq_logger.addHandler(handler)
        jobq_logger.setLevel({0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG))
