"""``manage.py jobq_worker``: run a worker until SIGTERM/SIGINT (or, with --burst, until idle)."""

from __future__ import annotations

import logging
import os
import signal
import sys
from argparse import ArgumentParser
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ...conf import QUEUE_NAME_RE
from ...worker import Worker

logger = logging.getLogger("django_jobq.worker")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise ValueError(text)
    return value


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
            type=_positive_int,
            default=1,
            help="Handler threads, each with its own database connection (default 1).",
        )
        parser.add_argument(
            "--batch-size",
            type=_positive_int,
            default=None,
            help="Most jobs claimed at once and held ahead of a free thread "
            "(default: the concurrency).",
        )
        parser.add_argument(
            "--poll-interval",
            type=_positive_float,
            default=None,
            metavar="SECONDS",
            help="Sleep after finding no job (default JOBQ['POLL_INTERVAL'], 1 s).",
        )
        parser.add_argument(
            "--shutdown-timeout",
            type=_positive_float,
            default=30.0,
            metavar="SECONDS",
            help="After SIGTERM, how long running jobs may take to finish before the worker "
            "exits anyway, leaving their leases to lapse (default 30). Keep it below your "
            "process manager's kill timeout.",
        )
        parser.add_argument("--worker-id", default=None, help="Default: host:pid.")
        parser.add_argument(
            "--burst",
            action="store_true",
            help="Exit with status 0 once no job is due and none is running.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        for queue in options["queues"] or []:
            if not QUEUE_NAME_RE.match(queue):
                raise CommandError(
                    f"invalid queue name {queue!r}: expected {QUEUE_NAME_RE.pattern}"
                )
        self._configure_logging(options["verbosity"])
        worker = Worker(
            queues=options["queues"],
            concurrency=options["concurrency"],
            batch_size=options["batch_size"],
            poll_interval=options["poll_interval"],
            worker_id=options["worker_id"],
            burst=options["burst"],
            shutdown_timeout=options["shutdown_timeout"],
        )

        def on_signal(signum: int, frame: FrameType | None) -> None:
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
        if stats.abandoned:
            sys.exit(1)

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
