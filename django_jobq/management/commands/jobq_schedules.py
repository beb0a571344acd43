"""``manage.py jobq_schedules``: every schedule with its next tick and its last enqueued tick."""

from __future__ import annotations

import json
from argparse import ArgumentParser
from datetime import UTC, datetime, tzinfo
from typing import Any

from django.core.management.base import BaseCommand
from django.utils import timezone

from ...conf import get_settings
from ...models import Schedule
from ...scheduling import collect
from ..tables import write_table

_HEADER = ("NAME", "KIND", "CRON", "TIMEZONE", "NEXT (LOCAL)", "NEXT (UTC)", "LAST TICK (UTC)")


def _iso(moment: datetime | None, zone: tzinfo = UTC) -> str | None:
    return None if moment is None else moment.astimezone(zone).isoformat(timespec="seconds")


class Command(BaseCommand):
    help = (
        "List the schedules (@job(schedule=...) and JOBQ['SCHEDULES']): cron, timezone, the "
        "next tick in that timezone and in UTC, and the last tick enqueued. Rows of schedules "
        "no longer declared are listed as such: schedulers ignore them. --json prints the "
        "same as a JSON list."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--json", action="store_true", help="Print JSON instead of a table.")

    def handle(self, *args: Any, **options: Any) -> None:
        rows = {row.name: row for row in Schedule.objects.using(get_settings().DATABASE)}
        now = timezone.now()
        listed: list[dict[str, Any]] = []
        for scheduled in collect():
            row = rows.pop(scheduled.name, None)
            last_tick = row.last_tick if row is not None else None
            timetable = scheduled.timetable
            next_tick = timetable.next_after(max(now, last_tick or now))
            listed.append(
                {
                    "name": scheduled.name,
                    "kind": scheduled.kind,
                    "cron": timetable.cron,
                    "timezone": timetable.timezone,
                    "declared": True,
                    "next": _iso(next_tick, timetable.zone),
                    "next_utc": _iso(next_tick),
                    "last_tick": _iso(last_tick),
                }
            )
        for row in sorted(rows.values(), key=lambda row: row.name):
            listed.append(
                {
                    "name": row.name,
                    "kind": row.kind,
                    "cron": row.cron,
                    "timezone": row.timezone,
                    "declared": False,
                    "next": None,
                    "next_utc": None,
                    "last_tick": _iso(row.last_tick),
                }
            )
        if options["json"]:
            self.stdout.write(json.dumps(listed, indent=2))
        elif not listed:
            self.stdout.write("No schedules.")
        else:
            write_table(
                self.stdout,
                _HEADER,
                [
                    (
                        item["name"],
                        item["kind"],
                        item["cron"],
                        item["timezone"],
                        item["next"] or "not declared",
                        item["next_utc"] or "-",
                        item["last_tick"] or "never",
                    )
                    for item in listed
                ],
            )
