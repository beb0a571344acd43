"""``manage.py jobq_deadletters``: the dead letters, summarised by queue, kind and reason,
grouped by cause with ``--groups`` (:mod:`django_jobq.causes`), or listed one per line with
``--list``; ``--group`` narrows any of them to one cause."""

from __future__ import annotations

import json
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand
from django.db.models import Count, Max
from django.template.defaultfilters import pluralize
from django.utils import timezone
from django.utils.text import Truncator

from ... import causes, text
from ...conf import get_settings
from ...models import DeadLetter
from ..arguments import bounded_int
from ..tables import write_table

_SUMMARY_HEADER = ("QUEUE", "KIND", "REASON", "COUNT", "LAST DIED")
_LIST_HEADER = ("ID", "JOB", "QUEUE", "KIND", "REASON", "DIED", "ERROR")
_GROUPS_HEADER = ("COUNT", "FIRST DIED", "LAST DIED", "KINDS", "FINGERPRINT")


def _when(moment: Any) -> str:
    return str(timezone.localtime(moment).isoformat(timespec="seconds"))


class Command(BaseCommand):
    help = (
        "Summarise the dead letters: one line per queue, kind and reason with the count and "
        "the newest died_at. --groups prints their causes instead (the biggest first), "
        "--list the newest dead letters one per line; --group FINGERPRINT narrows any of "
        "them to one cause. --json prints JSON (reasons, errors and fingerprints whole)."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--json", action="store_true", help="Print JSON instead of a table.")
        shown = parser.add_mutually_exclusive_group()
        shown.add_argument(
            "--list", action="store_true", help="One line per dead letter, newest first."
        )
        shown.add_argument(
            "--groups",
            action="store_true",
            help="One line per cause (error fingerprint), the most dead letters first.",
        )
        parser.add_argument(
            "--group",
            metavar="FINGERPRINT",
            help="Only the dead letters of this cause (a fingerprint as --groups prints it).",
        )
        parser.add_argument("--kind", help="With --list: only this kind.")
        parser.add_argument(
            "--limit",
            type=bounded_int(1),
            default=50,
            metavar="N",
            help="With --list or --groups: at most this many, at least 1 (default 50).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        dead_letters = DeadLetter.objects.using(get_settings().DATABASE)
        if options["group"] is not None:
            dead_letters = dead_letters.filter(fingerprint=options["group"])
        if options["list"]:
            self._list(dead_letters, options)
            return
        if options["groups"]:
            self._groups(options)
            return
        groups = list(
            dead_letters.values("queue", "kind", "reason")
            .annotate(count=Count("id"), last_died=Max("died_at"))
            .order_by("queue", "kind", "reason")
        )
        if options["json"]:
            rows = [{**group, "last_died": group["last_died"].isoformat()} for group in groups]
            self.stdout.write(json.dumps(rows, indent=2))
        elif not groups:
            self.stdout.write("No dead letters.")
        else:
            write_table(
                self.stdout,
                _SUMMARY_HEADER,
                [
                    (
                        group["queue"],
                        group["kind"],
                        Truncator(text.first_line(group["reason"])).chars(60),
                        str(group["count"]),
                        _when(group["last_died"]),
                    )
                    for group in groups
                ],
                right_aligned={3},
            )
            total = sum(group["count"] for group in groups)
            groups_count = len(groups)
            self.stdout.write(
                f"{total} dead letter{pluralize(total)} in "
                f"{groups_count} group{pluralize(groups_count)}."
            )

    def _list(self, dead_letters: Any, options: dict[str, Any]) -> None:
        if options["kind"]:
            dead_letters = dead_letters.filter(kind=options["kind"])
        fields = ("id", "job_id", "queue", "kind", "reason", "died_at", "last_error")
        rows = list(dead_letters.order_by("-died_at", "-id").values(*fields)[: options["limit"]])
        if options["json"]:
            self.stdout.write(
                json.dumps(
                    [{**row, "died_at": row["died_at"].isoformat()} for row in rows], indent=2
                )
            )
        elif not rows:
            self.stdout.write("No dead letters.")
        else:
            write_table(
                self.stdout,
                _LIST_HEADER,
                [
                    (
                        str(row["id"]),
                        str(row["job_id"]),
                        row["queue"],
                        row["kind"],
                        Truncator(text.first_line(row["reason"])).chars(40),
                        _when(row["died_at"]),
                        Truncator(row["last_error"].strip().partition("\n")[0]).chars(60),
                    )
                    for row in rows
                ],
                right_aligned={0, 1},
            )

    def _groups(self, options: dict[str, Any]) -> None:
        if options["group"] is not None:
            cause = causes.get(options["group"])
            found = [cause] if cause else []
            total_causes = len(found)
        else:
            page = causes.page(limit=options["limit"])
            found, total_causes = page.causes, page.cause_count
        if options["json"]:
            self.stdout.write(json.dumps([_cause_json(cause) for cause in found], indent=2))
            return
        if not found:
            self.stdout.write("No dead letters.")
            return
        write_table(
            self.stdout,
            _GROUPS_HEADER,
            [
                (
                    str(cause.dead_letters),
                    _when(cause.first_died),
                    _when(cause.last_died),
                    Truncator(", ".join(cause.kinds) + (", …" if cause.more_kinds else "")).chars(
                        60
                    ),
                    cause.fingerprint,
                )
                for cause in found
            ],
            right_aligned={0},
        )
        if len(found) < total_causes:
            self.stdout.write(
                f"The {len(found)} biggest of {total_causes} groups (--limit for more)."
            )


def _cause_json(cause: causes.Cause) -> dict[str, Any]:
    return {
        "fingerprint": cause.fingerprint,
        "count": cause.dead_letters,
        "first_died": cause.first_died.isoformat(),
        "last_died": cause.last_died.isoformat(),
        "kinds": cause.kinds,
        "more_kinds": cause.more_kinds,
        "example_id": cause.example_id,
    }
