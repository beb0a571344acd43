"""``manage.py jobq_deadletters``: how many dead letters, by queue, kind and reason."""

from __future__ import annotations

import json
from argparse import ArgumentParser
from collections.abc import Mapping, Sequence
from typing import Any

from django.core.management.base import BaseCommand
from django.db.models import Count, Max
from django.template.defaultfilters import pluralize
from django.utils import timezone
from django.utils.text import Truncator

from ...conf import get_settings
from ...models import DeadLetter

_HEADER = ("QUEUE", "KIND", "REASON", "COUNT", "LAST DIED")
_COUNT_COLUMN = 3  # right-aligned


class Command(BaseCommand):
    help = (
        "Summarise the dead letters: one line per queue, kind and reason with the count and "
        "the newest died_at. --json prints the same as a JSON list (reasons untruncated)."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--json", action="store_true", help="Print JSON instead of a table.")

    def handle(self, *args: Any, **options: Any) -> None:
        groups = list(
            DeadLetter.objects.using(get_settings().DATABASE)
            .values("queue", "kind", "reason")
            .annotate(count=Count("id"), last_died=Max("died_at"))
            .order_by("queue", "kind", "reason")
        )
        if options["json"]:
            rows = [{**group, "last_died": group["last_died"].isoformat()} for group in groups]
            self.stdout.write(json.dumps(rows, indent=2))
        elif not groups:
            self.stdout.write("No dead letters.")
        else:
            self._write_table(groups)

    def _write_table(self, groups: Sequence[Mapping[str, Any]]) -> None:
        table = [_HEADER] + [
            (
                group["queue"],
                group["kind"],
                Truncator(group["reason"]).chars(60),
                str(group["count"]),
                timezone.localtime(group["last_died"]).isoformat(timespec="seconds"),
            )
            for group in groups
        ]
        widths = [max(len(row[column]) for row in table) for column in range(len(_HEADER))]
        for row in table:
            cells = [
                cell.rjust(width) if column == _COUNT_COLUMN else cell.ljust(width)
                for column, (cell, width) in enumerate(zip(row, widths, strict=True))
            ]
            self.stdout.write("  ".join(cells).rstrip())
        total = sum(group["count"] for group in groups)
        self.stdout.write(
            f"{total} dead letter{pluralize(total)} in {len(groups)} group{pluralize(len(groups))}."
        )
