"""``manage.py jobq_redrive``: turn the dead letters matching filters back into fresh jobs."""

from __future__ import annotations

import re
from argparse import ArgumentParser, ArgumentTypeError
from datetime import datetime, timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.template.defaultfilters import pluralize
from django.utils import timezone

from ...conf import get_settings
from ...models import DeadLetter
from ...operations import LEFT_IN_PLACE_BECAUSE, redrive

_DURATION_RE = re.compile(r"^(\d+)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_since(text: str) -> datetime:
    """``30m``, ``2h``, ``7d`` (that long ago) or an ISO 8601 date/time (naive: local time)."""
    if match := _DURATION_RE.match(text):
        try:
            return timezone.now() - timedelta(**{_UNITS[match[2]]: int(match[1])})
        except OverflowError:
            raise ArgumentTypeError(f"{text!r} reaches back before year 1") from None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ArgumentTypeError(
            f"{text!r} is neither a duration (45s, 30m, 2h, 7d) nor an ISO date/time"
        ) from None
    return moment if timezone.is_aware(moment) else timezone.make_aware(moment)


class Command(BaseCommand):
    help = (
        "Redrive dead letters: enqueue each again as a fresh job (attempts 0, due now) and "
        "delete it, one statement per 10,000. Filters combine with AND; without any, --all "
        "is required. Dead letters whose idempotency key a live job of their kind holds are "
        "left in place."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--kind", action="append", help="This kind (repeatable).")
        parser.add_argument("--queue", action="append", help="This queue (repeatable).")
        parser.add_argument(
            "--reason", help='Reason starts with this, e.g. "failed" or "max attempts".'
        )
        parser.add_argument(
            "--group",
            metavar="FINGERPRINT",
            help="This cause: a fingerprint exactly as jobq_deadletters --groups prints it.",
        )
        parser.add_argument(
            "--since",
            type=parse_since,
            help="Died at or after: an ISO date/time, or a duration ago (30m, 2h, 7d).",
        )
        parser.add_argument(
            "--id", action="append", type=int, dest="ids", help="This dead letter (repeatable)."
        )
        parser.add_argument(
            "--all", action="store_true", help="Redrive every dead letter (no filter)."
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Print how many match; change nothing."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        dead_letters = DeadLetter.objects.using(get_settings().DATABASE)
        filters: dict[str, Any] = {
            "kind__in": options["kind"],
            "queue__in": options["queue"],
            "reason__startswith": options["reason"],
            "fingerprint": options["group"],
            "died_at__gte": options["since"],
            "id__in": options["ids"],
        }
        filters = {lookup: value for lookup, value in filters.items() if value is not None}
        if filters and options["all"]:
            raise CommandError("--all redrives every dead letter: drop it or drop the filters.")
        if not filters and not options["all"]:
            raise CommandError(
                "No filter given: pass --kind, --queue, --reason, --group, --since or --id, "
                "or --all to redrive every dead letter."
            )
        if (
            options["group"] is not None
            and not dead_letters.filter(fingerprint=options["group"]).exists()
        ):
            raise CommandError(
                f"No dead letter has the fingerprint {options['group']!r} (redriven or deleted "
                "already, or mistyped): jobq_deadletters --groups lists them."
            )
        matching = dead_letters.filter(**filters)
        count = matching.count()
        if options["dry_run"]:
            self.stdout.write(
                f"{count} dead letter{pluralize(count)} would be redriven "
                "(dry run: nothing changed)."
            )
            return
        created = redrive(matching)
        self.stdout.write(f"{created} dead letter{pluralize(created)} redriven as new jobs.")
        if created < count:
            left = count - created
            self.stdout.write(f"{left} left in place: {LEFT_IN_PLACE_BECAUSE}.")
