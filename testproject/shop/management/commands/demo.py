"""``manage.py demo``: the shop under load, with real workers, a flaky partner and a report.

Steps: delete what earlier demo runs left (and nothing else, see ``shop/demo/reset.py``);
start a flaky webhook receiver and N ``jobq_worker`` processes on the shop's queues; sign
users up and place orders through the real views while showing the shop's jobs live; once
none is left, stop the workers with SIGTERM and check every effect happened exactly once.
Ctrl-C stops the workers and exits with status 130.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import tempfile
import time
from argparse import ArgumentParser
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ...demo.progress import ProgressDisplay, QueueSnapshot
from ...demo.report import Report, build_report
from ...demo.reset import demo_queues, reset
from ...demo.workers import MANAGE_PY, WorkerPool, database_url
from ...demo.workload import Workload, WorkloadTally
from ...webhook_stub import WebhookStub

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
        "First deletes what earlier runs left: the demo-user-* users with their orders, and "
        "the shop's jobs and dead letters; other data in the database is left alone."
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
        parser.add_argument(
            "--throwaway-database",
            action="store_true",
            help="The database is deleted when the demo ends (scripts/demo's temporary "
            "PostgreSQL): say so instead of explaining how to open the admin on it.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        log_dir = Path(tempfile.mkdtemp(prefix="jobq-demo-"))
        try:
            report = self._demo(options, log_dir)
        except KeyboardInterrupt:
            newline = "\n" if self.stdout.isatty() else ""
            self.stderr.write(f"{newline}Interrupted: workers stopped; their logs: {log_dir}")
            sys.exit(130)
        except Exception:
            self.stderr.write(f"The workers' logs are kept in {log_dir}")
            raise
        self.stdout.write("")
        self.stdout.write(self.style.MIGRATE_HEADING("Summary"))
        for line in report.lines:
            self.stdout.write(line)
        self.stdout.write("")
        self._admin_steps(throwaway=options["throwaway_database"])
        if report.problems:
            for problem in report.problems:
                self.stderr.write(f"PROBLEM: {problem}")
            self.stderr.write(f"The workers' logs are kept in {log_dir}")
            raise CommandError(f"the demo found {len(report.problems)} problem(s), listed above")
        shutil.rmtree(log_dir)
        self.stdout.write(self.style.SUCCESS("All checks passed."))

    def _demo(self, options: dict[str, Any], log_dir: Path) -> Report:
        deleted = reset()
        self.stdout.write(
            "Starting clean: deleted what earlier demo runs left: "
            + ", ".join(f"{count} {what}" for what, count in deleted.items())
        )
        with WebhookStub(
            failure_rate=options["webhook_failure_rate"], seed=options["seed"]
        ) as stub:
            self.stdout.write(
                f"Webhook receiver (fails {options['webhook_failure_rate']:.0%} with 503): "
                f"{stub.url}"
            )
            queues = demo_queues()
            pool = WorkerPool(
                count=options["workers"],
                concurrency=options["concurrency"],
                queues=queues,
                env={
                    "SHOP_WEBHOOK_URL": stub.url,
                    # Keep each handler thread's connection between jobs, as in production.
                    "CONN_MAX_AGE": os.environ.get("CONN_MAX_AGE", "60"),
                },
                log_dir=log_dir,
            )
            self.stdout.write(
                f"Started {options['workers']} jobq_worker processes with "
                f"{options['concurrency']} threads each on queue(s) {', '.join(queues)}; "
                f"their logs: {log_dir}"
            )
            try:
                tally, elapsed = self._run(pool, options)
                exited_early = [worker.worker_id for worker in pool.exited()]
                self.stdout.write("Stopping the workers with SIGTERM...")
                results = pool.stop(timeout=STOP_TIMEOUT)
            except BaseException:
                pool.stop(timeout=10)
                raise
            webhook = stub.stats()
        return build_report(
            tally=tally,
            elapsed=elapsed,
            snapshot=QueueSnapshot.take(),
            webhook=webhook,
            workers=results,
            exited_early=exited_early,
        )

    def _run(self, pool: WorkerPool, options: dict[str, Any]) -> tuple[WorkloadTally, float]:
        """Drive the workload, then wait for the shop's jobs to be done; return what was
        done and the seconds from the first request to the last job."""
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

    def _admin_steps(self, *, throwaway: bool) -> None:
        """Say how to look at the dead letters in the admin, if the database outlives us."""
        if throwaway:
            self.stdout.write(
                "The dead letters cannot be inspected after the demo: its database was a "
                "throwaway PostgreSQL cluster, deleted as scripts/demo exits. For one that "
                "stays, run PostgreSQL on 127.0.0.1:5432 (user postgres, no password) or set "
                "DATABASE_URL, then run scripts/demo again."
            )
            return
        root = MANAGE_PY.parents[1]
        python = Path(sys.executable)
        if python.is_relative_to(root):
            python = python.relative_to(root)
        url = database_url(hide_password=True)
        manage = f"DATABASE_URL={shlex.quote(url)} {shlex.quote(str(python))} testproject/manage.py"
        self.stdout.write(
            "Inspect the dead letters in the admin: in a shell, run\n"
            f"  cd {shlex.quote(str(root))}\n"
            f"  {manage} createsuperuser\n"
            f"  {manage} runserver\n"
            "and open http://127.0.0.1:8000/admin/django_jobq/deadletter/"
            + (" (**** stands for the database password)" if "****@" in url else "")
        )
