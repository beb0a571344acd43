"""``manage.py demo``: the shop under load, with real workers, a flaky partner and a report.

Steps: start clean; start a flaky webhook receiver and N ``jobq_worker`` processes; sign
users up and place orders through the real views while showing the queue live; once the
queue is empty, stop the workers with SIGTERM and check every effect happened exactly once.
"""

from __future__ import annotations

import os
import tempfile
import time
from argparse import ArgumentParser
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ...demo.progress import ProgressDisplay, QueueSnapshot
from ...demo.report import build_report
from ...demo.reset import reset
from ...demo.workers import WorkerPool, WorkerResult
from ...demo.workload import Workload, WorkloadTally
from ...webhook_stub import WebhookStats, WebhookStub

#: Seconds the workers get to finish their running jobs after SIGTERM.
STOP_TIMEOUT = 30.0


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(text)
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


def _rate(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise ValueError(text)
    return value


class Command(BaseCommand):
    help = (
        "Run the shop demo: real views enqueue jobs, real jobq_worker processes run them "
        "against a flaky webhook receiver, and a summary checks every effect happened once. "
        "Deletes all shop orders, the demo's users and every job and dead letter first."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--users", type=_non_negative_int, default=300, help="Signups.")
        parser.add_argument("--orders", type=_non_negative_int, default=1200, help="Orders.")
        parser.add_argument(
            "--workers", type=_positive_int, default=2, help="Worker processes (default 2)."
        )
        parser.add_argument(
            "--concurrency", type=_positive_int, default=4, help="Threads per worker (default 4)."
        )
        parser.add_argument("--seed", type=int, default=1, help="Random seed (default 1).")
        parser.add_argument(
            "--webhook-failure-rate",
            type=_rate,
            default=0.1,
            metavar="RATE",
            help="Share of webhook POSTs the partner stub answers with 503 (default 0.1).",
        )
        parser.add_argument(
            "--timeout",
            type=float,
            default=120.0,
            metavar="SECONDS",
            help="How long to wait for the queue to empty after the last request (default 120).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        deleted = reset()
        self.stdout.write(
            "Starting clean: deleted "
            + ", ".join(f"{count} {what}" for what, count in deleted.items())
            + " (the demo owns this database's queue)."
        )
        log_dir = Path(tempfile.mkdtemp(prefix="jobq-demo-"))
        with WebhookStub(
            failure_rate=options["webhook_failure_rate"], seed=options["seed"]
        ) as stub:
            self.stdout.write(
                f"Webhook receiver (fails {options['webhook_failure_rate']:.0%} with 503): "
                f"{stub.url}"
            )
            pool = WorkerPool(
                count=options["workers"],
                concurrency=options["concurrency"],
                env={
                    "SHOP_WEBHOOK_URL": stub.url,
                    # Keep each handler thread's connection between jobs, as in production.
                    "CONN_MAX_AGE": os.environ.get("CONN_MAX_AGE", "60"),
                },
                log_dir=log_dir,
            )
            self.stdout.write(
                f"Started {options['workers']} jobq_worker processes with "
                f"{options['concurrency']} threads each; their logs: {log_dir}"
            )
            try:
                tally, elapsed = self._run(pool, options)
                exited_early = [worker.worker_id for worker in pool.exited()]
                self.stdout.write("Queue empty: stopping the workers with SIGTERM...")
                results = pool.stop(timeout=STOP_TIMEOUT)
            except BaseException:
                pool.stop(timeout=10)
                raise
            webhook = stub.stats()
        self._report(tally, elapsed, webhook, results, exited_early, log_dir)

    def _run(self, pool: WorkerPool, options: dict[str, Any]) -> tuple[WorkloadTally, float]:
        """Drive the workload, then wait for the queue to empty; return what was done and
        the seconds from the first request to the empty queue."""
        workload = Workload(users=options["users"], orders=options["orders"], seed=options["seed"])
        progress = ProgressDisplay(self.stdout, workload.total_requests)
        tally = workload.tally
        self.stdout.write(
            f"Sending {options['users']} signups, then {options['orders']} orders, "
            f"through the views (django.test.Client, full middleware stack):"
        )
        started = time.monotonic()
        workload.run(lambda: progress.update(tally.requests, tally.total_enqueued))
        deadline = time.monotonic() + options["timeout"]
        while True:
            snapshot = QueueSnapshot.take()
            if snapshot.live == 0 or len(pool.exited()) == len(pool.workers):
                break
            if time.monotonic() > deadline:
                progress.finish()
                self.stderr.write(f"The queue did not empty within {options['timeout']:g} s.")
                break
            progress.update(tally.requests, tally.total_enqueued)
            time.sleep(0.05)
        elapsed = time.monotonic() - started
        progress.update(tally.requests, tally.total_enqueued, force=True)
        progress.finish()
        return tally, elapsed

    def _report(
        self,
        tally: WorkloadTally,
        elapsed: float,
        webhook: WebhookStats,
        results: list[WorkerResult],
        exited_early: list[str],
        log_dir: Path,
    ) -> None:
        report = build_report(
            tally=tally,
            elapsed=elapsed,
            snapshot=QueueSnapshot.take(),
            webhook=webhook,
            workers=results,
            exited_early=exited_early,
            log_dir=log_dir,
        )
        self.stdout.write("")
        self.stdout.write(self.style.MIGRATE_HEADING("Summary"))
        for line in report.lines:
            self.stdout.write(line)
        self.stdout.write("")
        self.stdout.write(
            "See the dead letters (and redrive them) in the admin:\n"
            "  python testproject/manage.py createsuperuser\n"
            "  python testproject/manage.py runserver\n"
            "  open http://127.0.0.1:8000/admin/django_jobq/deadletter/"
        )
        if report.problems:
            for problem in report.problems:
                self.stderr.write(f"PROBLEM: {problem}")
            raise CommandError(f"the demo found {len(report.problems)} problem(s), listed above")
        self.stdout.write(self.style.SUCCESS("All checks passed."))
