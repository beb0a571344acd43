"""``manage.py jobq_chaos``: the chaos suite against this project's queue database.

Test-only: run it on a development or CI database. Exists only where the chaos app
(``django_jobq.contrib.chaos``) is installed. See docs/chaos.md.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from django_jobq.contrib.chaos.run import ChaosConfig, ChaosRefused, run
from django_jobq.contrib.chaos.verdict import Report
from django_jobq.management.tables import write_table

#: The numeric options, named after the :class:`ChaosConfig` fields they set.
_NUMBERS = {
    "jobs": "Jobs, half of each kind",
    "workers": "Worker processes kept running",
    "kills": "Workers killed at crash points",
    "seed": "Seed of the fault plan",
    "terminations": "Worker connections ended with pg_terminate_backend",
    "concurrency": "Handler threads per worker",
    "batch_size": "Jobs per claim",
    "visibility_timeout": "The chaos jobs' visibility timeout",
}


class Command(BaseCommand):
    help = (
        "Chaos test (never on a production database): run jobs under worker processes that "
        "are SIGKILLed at every crash point, with connections terminated and optionally a "
        "PostgreSQL restart; print a report and exit 1 if a job was lost or an effect "
        "duplicated beyond what the design allows."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        defaults = ChaosConfig()
        for name, meaning in _NUMBERS.items():
            default = getattr(defaults, name)
            parser.add_argument(
                f"--{name.replace('_', '-')}",
                type=type(default),
                default=default,
                metavar="SECONDS" if isinstance(default, float) else "N",
                help=f"{meaning} (default %(default)s).",
            )
        parser.add_argument(
            "--restart-command",
            default="",
            metavar="COMMAND",
            help="A command that restarts PostgreSQL, run once mid-run (split like a shell "
            "command line, run without a shell).",
        )
        parser.add_argument(
            "--keep", action="store_true", help="Keep the run's rows and logs even if it passes."
        )
        parser.add_argument("--json", action="store_true", help="Print the report as JSON.")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            config = ChaosConfig(
                **{name: options[name] for name in _NUMBERS},
                restart_command=tuple(shlex.split(options["restart_command"])),
                keep=options["keep"],
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        try:
            report = run(config, say=lambda line: self.stderr.write(line))
        except ChaosRefused as exc:
            raise CommandError(f"refused: {exc}") from None
        if options["json"]:
            self.stdout.write(json.dumps({**dataclasses.asdict(report), "ok": report.ok}, indent=2))
        else:
            self._write_report(report, config)
        if not report.ok:
            raise CommandError("chaos run failed: " + "; ".join(report.problems))

    def _write_report(self, report: Report, config: ChaosConfig) -> None:
        self.stdout.write(
            f"chaos run: seed {report.seed}, {report.jobs} jobs, {report.workers} workers "
            f"(concurrency {config.concurrency}, batch size {config.batch_size}), visibility "
            f"timeout {config.visibility_timeout:g} s\n"
        )
        write_table(
            self.stdout,
            ("fault", "times", "external effects left unacked"),
            [
                (cause, str(times), str(unacked))
                for cause, (times, unacked) in report.faults.items()
            ],
            right_aligned={1, 2},
        )
        self.stdout.write("")
        write_table(
            self.stdout,
            ("check", "result"),
            [
                ("jobs finished", f"{report.finished} of {report.jobs}"),
                ("lost", str(report.lost)),
                (
                    "still queued",
                    f"{report.still_queued} ({report.lapsed_leases} running with a lapsed lease)",
                ),
                (
                    "dead letters",
                    f"{report.dead_letters} ({report.dead_letters_explained} with every "
                    f"attempt ended by a fault)",
                ),
                (
                    "transactional duplicates",
                    f"{report.transactional_duplicates} ({report.business_rows} business rows, "
                    f"{report.dedup_keys} dedup keys, {report.transactional_jobs} jobs)",
                ),
                (
                    "external duplicates",
                    f"{report.external_duplicates} ({report.effects} effects for "
                    f"{report.external_jobs} jobs; bound {report.per_death_bound} per worker "
                    f"death: {report.duplicate_bound})",
                ),
                ("unexplained duplicates", str(report.unexplained_duplicates)),
                ("kills", f"{report.kills} of {report.kills_planned} planned"),
                ("reconnects", f"{report.reconnects} (main loops and listeners of live workers)"),
                ("wall time", f"{report.wall_seconds:.1f} s"),
                ("result", "PASS" if report.ok else "FAIL"),
            ],
        )
        for note in report.notes:
            self.stdout.write(f"note: {note}")
