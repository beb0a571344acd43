"""``manage.py jobq_doctor``: the queue database's MVCC health, for people (findings, then
tables) and scripts (``--json``); with ``--check``, an exit status for cron-style alerting.
What it reads and how it judges: :mod:`django_jobq.mvcc`; what each finding means and what
to do: docs/operations.md, "MVCC health"."""

from __future__ import annotations

import json
from argparse import ArgumentParser
from datetime import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, OutputWrapper
from django.template.defaultfilters import pluralize

from ... import mvcc
from ...conf import get_settings
from ...stats import format_seconds
from ..arguments import at_least_zero, bounded_int, seconds
from ..tables import write_table
from .jobq_stats import CHECK_FAILED

_HOLDER_HEADER = (
    "HOLDER",
    "PID",
    "NAME",
    "APPLICATION",
    "CLIENT",
    "USER",
    "DATABASE",
    "STATE",
    "WAIT EVENT",
    "OPEN FOR",
    "XMIN AGE",
    "QUERY",
)
_TABLE_HEADER = (
    "TABLE",
    "LIVE ROWS",
    "DEAD ROWS",
    "DEAD/LIVE",
    "AUTOVACUUM",
    "LAST VACUUM",
    "LAST ANALYZE",
    "SIZE",
)
_INDEX_HEADER = ("INDEX", "TABLE", "SIZE", "BYTES/LIVE ROW")
#: The report lists the indexes of at least this many bytes (``--json`` lists them all).
INDEX_LISTED_FROM = 1024 * 1024


def _when(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def as_json(
    health: mvcc.Health, thresholds: mvcc.Thresholds, found: list[mvcc.Finding]
) -> dict[str, Any]:
    """The ``--json`` document (see docs/reference.md, ``jobq_doctor``)."""
    return {
        "taken_at": health.taken_at.isoformat(),
        "role": health.role,
        "sees_all_sessions": health.sees_all_sessions,
        "server": {"autovacuum": health.autovacuum, "track_counts": health.track_counts},
        "horizon_holders": [
            {
                "holder": holder.holder,
                "pid": holder.pid,
                "name": holder.name,
                "application_name": holder.application_name,
                "client_addr": holder.client_addr,
                "user": holder.user_name,
                "database": holder.database,
                "state": holder.state,
                "wait_event": holder.wait_event,
                "query": holder.query,
                "transaction_age": holder.transaction_age,
                "xmin_age": holder.xmin_age,
                "catalog_xmin_age": holder.catalog_xmin_age,
                "hidden": holder.hidden,
            }
            for holder in health.holders
        ],
        "tables": [
            {
                "table": table.table,
                "live_rows": table.live_rows,
                "dead_rows": table.dead_rows,
                "dead_ratio": table.dead_ratio,
                "autovacuum_enabled": table.autovacuum_enabled,
                "autovacuum": table.autovacuum,
                "last_vacuum": _when(table.last_vacuum),
                "last_autovacuum": _when(table.last_autovacuum),
                "last_analyze": _when(table.last_analyze),
                "last_autoanalyze": _when(table.last_autoanalyze),
                "table_bytes": table.table_bytes,
            }
            for table in health.tables
        ],
        "indexes": [
            {
                "index": index.index,
                "table": index.table,
                "index_bytes": index.index_bytes,
                "bytes_per_live_row": index.bytes_per_live_row,
            }
            for index in health.indexes
        ],
        "thresholds": {
            "max_horizon_age": thresholds.horizon_age,
            "max_horizon_transactions": thresholds.horizon_transactions,
            "max_dead_rows": thresholds.dead_rows,
            "max_dead_ratio": thresholds.dead_ratio,
            "min_index_bytes": thresholds.index_bytes,
            "max_index_bytes_per_row": thresholds.index_bytes_per_row,
        },
        "findings": [
            {
                "code": finding.code,
                "severity": finding.severity,
                "subject": finding.subject,
                "text": finding.text,
            }
            for finding in found
        ],
    }


def _cell(value: object) -> str:
    return "-" if value is None or value == "" else str(value)


def _xmin_age(holder: mvcc.Holder) -> str:
    if holder.xmin_age is None and holder.catalog_xmin_age is not None:
        return f"catalog {holder.catalog_xmin_age}"
    return _cell(holder.xmin_age)


def _ago(health: mvcc.Health, moment: datetime | None, automatic: bool) -> str:
    if moment is None:
        return "never"
    ago = max((health.taken_at - moment).total_seconds(), 0.0)
    return f"{format_seconds(ago)} ago" + (" (auto)" if automatic else "")


def _latest(health: mvcc.Health, manual: datetime | None, automatic: datetime | None) -> str:
    if automatic is not None and (manual is None or automatic > manual):
        return _ago(health, automatic, True)
    return _ago(health, manual, False)


def _autovacuum(health: mvcc.Health, table: mvcc.TableHealth) -> str:
    if table.autovacuum:
        return "on"
    if not health.track_counts:
        return "off (track_counts)"
    return "off (server)" if not health.autovacuum else "off (table)"


def write_report(out: OutputWrapper, health: mvcc.Health, found: list[mvcc.Finding]) -> None:
    """The human-readable report: findings, the server, the horizon holders, the tables,
    the indexes of at least :data:`INDEX_LISTED_FROM` bytes."""
    problems = sum(finding.problem for finding in found)
    if found:
        warnings = len(found) - problems
        out.write(
            f"Findings ({problems} over a threshold, {warnings} warning{pluralize(warnings)}):"
        )
        for finding in found:
            out.write(f"{finding.severity.upper():8} {finding.text}")
    else:
        out.write("No findings: the xmin horizon, dead rows and indexes are within thresholds.")
    out.write("")
    sees = (
        "sees every session's details"
        if health.sees_all_sessions
        else "sees other roles' sessions without their details (no pg_read_all_stats)"
    )
    out.write(
        f"Server: autovacuum {'on' if health.autovacuum else 'off'}, track_counts "
        f"{'on' if health.track_counts else 'off'}; role {health.role} {sees}."
    )
    out.write("")
    if health.holders:
        out.write("Who holds the xmin horizon back, the oldest xmin first:")
        write_table(
            out,
            _HOLDER_HEADER,
            [
                (
                    holder.holder,
                    _cell(holder.pid),
                    _cell(holder.name),
                    _cell(holder.application_name),
                    _cell(holder.client_addr),
                    _cell(holder.user_name),
                    _cell(holder.database),
                    "(hidden)" if holder.hidden else _cell(holder.state),
                    _cell(holder.wait_event),
                    format_seconds(holder.transaction_age),
                    _xmin_age(holder),
                    _cell(holder.query),
                )
                for holder in health.holders
            ],
            right_aligned={1, 9, 10},
        )
    else:
        out.write(
            "Nothing holds the xmin horizon back: no other session has a snapshot or "
            "transaction id, and no prepared transaction, replication slot or standby does."
        )
    out.write("")
    write_table(
        out,
        _TABLE_HEADER,
        [
            (
                table.table,
                str(table.live_rows),
                str(table.dead_rows),
                "-" if table.dead_ratio is None else f"{table.dead_ratio:.2f}",
                _autovacuum(health, table),
                _latest(health, table.last_vacuum, table.last_autovacuum),
                _latest(health, table.last_analyze, table.last_autoanalyze),
                mvcc.format_bytes(table.table_bytes),
            )
            for table in health.tables
        ],
        right_aligned={1, 2, 3, 7},
    )
    out.write("")
    listed = [index for index in health.indexes if index.index_bytes >= INDEX_LISTED_FROM]
    if listed:
        write_table(
            out,
            _INDEX_HEADER,
            [
                (
                    index.index,
                    index.table,
                    mvcc.format_bytes(index.index_bytes),
                    "-" if index.bytes_per_live_row is None else f"{index.bytes_per_live_row:.0f}",
                )
                for index in listed
            ],
            right_aligned={2, 3},
        )
    smaller = len(health.indexes) - len(listed)
    if smaller:
        out.write(
            f"{smaller} index{'es' if smaller != 1 else ''} under "
            f"{mvcc.format_bytes(INDEX_LISTED_FROM)} not listed (--json lists every index)."
        )


class Command(BaseCommand):
    help = (
        "Diagnose the queue database's MVCC health: who holds the xmin horizon back "
        "(sessions, prepared transactions, replication slots, standbys), the jobq tables' "
        "dead rows, last vacuums and autovacuum settings, and their index sizes against "
        "live rows. Each finding says what it means and what to do. --json prints the same "
        f"as JSON. --check exits with status {CHECK_FAILED} when a finding is over its "
        "threshold."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        defaults = mvcc.Thresholds()
        parser.add_argument("--json", action="store_true", help="Print JSON instead of tables.")
        parser.add_argument(
            "--check",
            action="store_true",
            help=f"Exit {CHECK_FAILED} (after printing) if a finding is over its threshold.",
        )
        parser.add_argument(
            "--max-horizon-age",
            type=seconds(zero=True),
            metavar="SECONDS",
            help="Seconds a transaction (a session's, a prepared one) may hold the xmin "
            "horizon back, finite and at least 0 (default JOBQ['ALERT_HORIZON_AGE'], 600).",
        )
        parser.add_argument(
            "--max-horizon-transactions",
            type=bounded_int(0),
            default=defaults.horizon_transactions,
            metavar="N",
            help="Transactions anything (also a replication slot or a standby, whose age in "
            "seconds is unknown) may hold the xmin horizon back by, at least 0 (default "
            f"{defaults.horizon_transactions}).",
        )
        parser.add_argument(
            "--max-dead-rows",
            type=bounded_int(0),
            default=defaults.dead_rows,
            metavar="N",
            help="Dead row versions a jobq table may hold, at least 0 (default "
            f"{defaults.dead_rows}); a finding needs --max-dead-ratio exceeded too.",
        )
        parser.add_argument(
            "--max-dead-ratio",
            type=at_least_zero("a ratio"),
            default=defaults.dead_ratio,
            metavar="RATIO",
            help="Dead row versions per live row a jobq table may hold, at least 0 (default "
            f"{defaults.dead_ratio:g}); a finding needs --max-dead-rows exceeded too.",
        )
        parser.add_argument(
            "--min-index-bytes",
            type=bounded_int(0),
            default=defaults.index_bytes,
            metavar="BYTES",
            help="Indexes smaller than this many bytes are never called bloated (default "
            f"{defaults.index_bytes}, 16 MiB).",
        )
        parser.add_argument(
            "--max-index-bytes-per-row",
            type=at_least_zero("bytes"),
            default=defaults.index_bytes_per_row,
            metavar="BYTES",
            help="Bytes of index per live row of its table above which an index is called "
            f"bloated, at least 0 (default {defaults.index_bytes_per_row:g}).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        max_age = options["max_horizon_age"]
        thresholds = mvcc.Thresholds(
            horizon_age=get_settings().ALERT_HORIZON_AGE if max_age is None else max_age,
            horizon_transactions=options["max_horizon_transactions"],
            dead_rows=options["max_dead_rows"],
            dead_ratio=options["max_dead_ratio"],
            index_bytes=options["min_index_bytes"],
            index_bytes_per_row=options["max_index_bytes_per_row"],
        )
        health = mvcc.read()
        found = mvcc.findings(health, thresholds)
        if options["json"]:
            self.stdout.write(json.dumps(as_json(health, thresholds, found), indent=2))
        else:
            write_report(self.stdout, health, found)
        problems = [finding.subject for finding in found if finding.problem]
        if options["check"] and problems:
            raise CommandError(
                f"{len(problems)} finding(s) over their thresholds: {', '.join(problems)}",
                returncode=CHECK_FAILED,
            )
