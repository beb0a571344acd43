"""``manage.py jobq_queues``: list the queues' pauses and limits, pause and resume queues,
change the limits of queues and kinds at run time (:mod:`django_jobq.flow_control`).

::

    manage.py jobq_queues                                   # the table (also: list, --json)
    manage.py jobq_queues pause emails [--until 2026-12-03T18:00+01:00 | --for 1800]
    manage.py jobq_queues resume emails
    manage.py jobq_queues limit emails --concurrency 3 --rate 100/s   # "none": no override
    manage.py jobq_queues limit-kind shop.jobs.charge --rate 600/m
"""

from __future__ import annotations

import difflib
import json
from argparse import SUPPRESS, ArgumentParser, ArgumentTypeError
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, OutputWrapper
from django.utils import timezone

from ... import flow_control, registry, stats
from ...conf import MAX_CONCURRENCY_LIMIT, MAX_DURATION
from ...exceptions import UnknownQueue
from ..arguments import bounded_int, seconds
from ..tables import write_table

#: The most ready (and running) jobs per queue the list counts; above it says "more than".
COUNT_CAP = 10_000

_QUEUE_HEADER = ("QUEUE", "PAUSED", "CONCURRENCY LIMIT", "RATE LIMIT", "READY", "RUNNING")
_KIND_HEADER = ("KIND", "CONCURRENCY LIMIT", "RATE LIMIT")


def _or_none(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """``parse``, or ``None`` for the word ``none`` (remove the operators' override)."""

    def parse_or_none(text: str) -> Any:
        return None if text.lower() == "none" else parse(text)

    return parse_or_none


def _rate(text: str) -> str | None:
    try:
        return flow_control.check_rate_limit(text)
    except ValueError as exc:
        raise ArgumentTypeError(str(exc).removeprefix("rate_limit: ")) from None


def _moment(text: str) -> datetime:
    """An ISO 8601 date and time; without an offset, in the current time zone."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ArgumentTypeError(
            f"expected an ISO 8601 date and time such as 2026-12-03T18:00+01:00, not {text!r}"
        ) from None
    return moment if timezone.is_aware(moment) else timezone.make_aware(moment)


def limit_text(value: object, source: flow_control.LimitSource) -> str:
    """A limit and where it comes from: ``3 (setting)``, ``100/s (operator)``, ``-``."""
    return "-" if value is None else f"{value} ({source})"


def _counted(count: int) -> str:
    return f"more than {COUNT_CAP}" if count > COUNT_CAP else str(count)


def _limit_options(parser: ArgumentParser) -> None:
    parser.add_argument(
        "--concurrency",
        type=_or_none(bounded_int(1, MAX_CONCURRENCY_LIMIT)),
        default=flow_control.UNCHANGED,
        metavar="N|none",
        help="The most jobs running at once across the fleet; none: no override (the "
        "code's limit applies). Omitted: unchanged.",
    )
    parser.add_argument(
        "--rate",
        type=_or_none(_rate),
        default=flow_control.UNCHANGED,
        metavar="COUNT/WINDOW|none",
        help="The most jobs started per window across the fleet: 100/s, 600/m, 5/10s "
        "(count 1 to 1000000; window s, m, h or d, optionally with a whole number before "
        "it); none: no override. Omitted: unchanged.",
    )


class Command(BaseCommand):
    help = (
        "Flow control: list every known queue with its pause, limits (and where each comes "
        "from: setting or operator) and jobs; pause or resume a queue; change the limits of "
        "a queue or a kind at run time. Workers apply a change from their next claim."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        actions = parser.add_subparsers(dest="action", metavar="ACTION")
        listing = actions.add_parser("list", help="The table (the default action).")
        # SUPPRESS: no default of its own, which would override the top-level --json.
        listing.add_argument("--json", action="store_true", default=SUPPRESS, help="Print JSON.")
        parser.add_argument("--json", action="store_true", help="With no ACTION: print JSON.")

        pause = actions.add_parser(
            "pause",
            help="Pause a queue: no worker claims its jobs from the next claim on; running "
            "jobs finish; enqueue still works.",
        )
        pause.add_argument("queue")
        end = pause.add_mutually_exclusive_group()
        end.add_argument(
            "--until",
            type=_moment,
            metavar="ISO8601",
            help="Resume by itself at this time (without an offset: the current time zone).",
        )
        end.add_argument(
            "--for",
            dest="for_seconds",
            type=seconds(MAX_DURATION),
            metavar="SECONDS",
            help="Resume by itself this many seconds from now (on the database clock).",
        )
        pause.add_argument(
            "--allow-unknown",
            action="store_true",
            help="Pause a queue that nothing names yet (else refused as a likely typo).",
        )

        resume = actions.add_parser("resume", help="Resume a paused queue.")
        resume.add_argument("queue")

        limit = actions.add_parser("limit", help="Change a queue's limits at run time.")
        limit.add_argument("queue")
        _limit_options(limit)
        limit.add_argument(
            "--allow-unknown",
            action="store_true",
            help="Limit a queue that nothing names yet (else refused as a likely typo).",
        )

        limit_kind = actions.add_parser("limit-kind", help="Change a kind's limits at run time.")
        limit_kind.add_argument("kind")
        _limit_options(limit_kind)

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"] or "list"
        try:
            if action == "list":
                self._list(json_output=options["json"])
            elif action == "pause":
                self._pause(options)
            elif action == "resume":
                self._resume(options["queue"])
            elif action == "limit":
                self._limit(options)
            else:
                self._limit_kind(options)
        except (UnknownQueue, ValueError, TypeError) as exc:
            raise CommandError(str(exc)) from None

    def _list(self, *, json_output: bool) -> None:
        controls = flow_control.queue_states()
        depths = {state.queue: state for state in stats.queue_states(count_cap=COUNT_CAP)}
        kinds = flow_control.kind_limits()
        if json_output:
            self.stdout.write(json.dumps(as_json(controls, depths, kinds), indent=2))
            return
        write_tables(self.stdout, controls, depths, kinds)

    def _pause(self, options: dict[str, Any]) -> None:
        until = options["until"] if options["until"] is not None else options["for_seconds"]
        pause = flow_control.pause_queue(
            options["queue"], until=until, allow_unknown=options["allow_unknown"]
        )
        end = (
            "until resumed"
            if pause.paused_until is None
            else f"until {stats.local_time(pause.paused_until)}"
        )
        self.stdout.write(
            f"Queue {pause.queue} paused (since {stats.local_time(pause.paused_at)}), {end}. "
            "Running jobs finish; workers claim none of its jobs from their next claim."
        )

    def _resume(self, queue: str) -> None:
        if flow_control.resume_queue(queue):
            self.stdout.write(f"Queue {queue} resumed: workers claim its jobs again.")
            return
        known = flow_control.known_queues()
        if queue in known:
            self.stdout.write(f"Queue {queue} was not paused: nothing changed.")
            return
        close = difflib.get_close_matches(queue, known, n=1)
        near = f"; did you mean {close[0]!r}?" if close else "."
        raise CommandError(f"No queue {queue!r} is known, and none is paused{near}")

    def _limit(self, options: dict[str, Any]) -> None:
        queue = options["queue"]
        self._require_a_limit(options)
        flow_control.set_queue_limits(
            queue,
            concurrency_limit=options["concurrency"],
            rate_limit=options["rate"],
            allow_unknown=options["allow_unknown"],
        )
        control = flow_control.queue_state(queue)
        assert control is not None  # it has a row now
        self.stdout.write(
            f"Queue {queue}: concurrency limit "
            f"{limit_text(control.concurrency_limit, control.concurrency_limit_source)}, "
            f"rate limit {limit_text(control.rate_limit, control.rate_limit_source)}."
        )

    def _limit_kind(self, options: dict[str, Any]) -> None:
        kind = options["kind"]
        self._require_a_limit(options)
        woken = flow_control.set_kind_limits(
            kind, concurrency_limit=options["concurrency"], rate_limit=options["rate"]
        )
        control = next((c for c in flow_control.kind_limits() if c.kind == kind), None)
        if control is not None:
            self.stdout.write(
                f"Kind {kind}: concurrency limit "
                f"{limit_text(control.concurrency_limit, control.concurrency_limit_source)}, "
                f"rate limit {limit_text(control.rate_limit, control.rate_limit_source)}."
            )
        else:
            self.stdout.write(f"Kind {kind}: no limits.")
        if woken:
            self.stdout.write(f"Workers of {', '.join(woken)} woken.")
        if registry.get(kind) is None:
            self.stderr.write(
                f"warning: no @job in this process registers the kind {kind!r}: the limit "
                "applies to jobs stored under exactly this name (check its spelling)."
            )

    @staticmethod
    def _require_a_limit(options: dict[str, Any]) -> None:
        if options["concurrency"] is flow_control.UNCHANGED and (
            options["rate"] is flow_control.UNCHANGED
        ):
            raise CommandError("Nothing to change: pass --concurrency and/or --rate.")


def as_json(
    controls: list[flow_control.QueueControl],
    depths: dict[str, stats.QueueState],
    kinds: list[flow_control.KindControl],
) -> dict[str, Any]:
    """The ``--json`` document: ``queues`` and ``kinds`` (docs/reference.md)."""
    queues = []
    for control in controls:
        depth = depths.get(control.name)
        queues.append(
            {
                "queue": control.name,
                "paused": control.paused,
                "paused_at": control.paused_at.isoformat() if control.paused_at else None,
                "paused_until": control.paused_until.isoformat() if control.paused_until else None,
                "concurrency_limit": control.concurrency_limit,
                "concurrency_limit_source": control.concurrency_limit_source,
                "rate_limit": control.rate_limit,
                "rate_limit_source": control.rate_limit_source,
                "ready": depth.ready if depth else 0,
                "running": depth.running if depth else 0,
                "count_cap": COUNT_CAP,
            }
        )
    return {
        "queues": queues,
        "kinds": [
            {
                "kind": kind.kind,
                "concurrency_limit": kind.concurrency_limit,
                "concurrency_limit_source": kind.concurrency_limit_source,
                "rate_limit": kind.rate_limit,
                "rate_limit_source": kind.rate_limit_source,
            }
            for kind in kinds
        ],
    }


def write_tables(
    out: OutputWrapper,
    controls: list[flow_control.QueueControl],
    depths: dict[str, stats.QueueState],
    kinds: list[flow_control.KindControl],
) -> None:
    """The queues' table, then the kinds' limits (if any kind has one)."""
    rows = []
    for control in controls:
        depth = depths.get(control.name)
        rows.append(
            (
                control.name,
                stats.paused_cell(control),
                limit_text(control.concurrency_limit, control.concurrency_limit_source),
                limit_text(control.rate_limit, control.rate_limit_source),
                _counted(depth.ready if depth else 0),
                _counted(depth.running if depth else 0),
            )
        )
    write_table(out, _QUEUE_HEADER, rows, right_aligned={4, 5})
    if kinds:
        out.write("")
        write_table(
            out,
            _KIND_HEADER,
            [
                (
                    kind.kind,
                    limit_text(kind.concurrency_limit, kind.concurrency_limit_source),
                    limit_text(kind.rate_limit, kind.rate_limit_source),
                )
                for kind in kinds
            ],
        )
