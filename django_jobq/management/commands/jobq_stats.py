"""``manage.py jobq_stats``: the queue at a glance, for people (a table) and scripts
(``--json``); with ``--check``, an exit status for cron-style alerting."""

from __future__ import annotations

import json
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError, OutputWrapper

from ... import mvcc
from ...conf import get_settings
from ...stats import (
    Outcomes,
    Snapshot,
    format_seconds,
    local_time,
    pause_text,
    paused_cell,
    snapshot,
)
from ..arguments import bounded_int, seconds
from ..tables import write_table

#: Exit status of ``--check`` when a threshold is exceeded (as a monitoring plugin's
#: "critical"); errors such as an unreachable database exit 1.
CHECK_FAILED = 2

_QUEUE_HEADER = (
    "QUEUE",
    "READY",
    "SCHEDULED",
    "RUNNING",
    "OLDEST READY",
    "SUCCEEDED 1M",
    "SUCCEEDED 1H",
    "FAILED 1H",
    "P50",
    "P99",
    "PAUSED",
)
_DEAD_HEADER = ("QUEUE", "KIND", "DEAD LETTERS")
_WORKER_HEADER = (
    "WORKER",
    "HOST",
    "PID",
    "QUEUES",
    "THREADS",
    "KINDS",
    "STARTED",
    "LAST SEEN",
)
_WAITING_HEADER = ("QUEUE", "KIND", "WAITING", "OLDEST", "LIVE WORKERS OF THE QUEUE KNOW")
#: Kinds named in the waiting table's last column before "and N more".
_KNOWN_SHOWN = 5


def _outcomes(outcomes: Outcomes) -> dict[str, int]:
    return {
        "succeeded": outcomes.succeeded,
        "retried": outcomes.retried,
        "dead_lettered": outcomes.dead_lettered,
    }


def as_json(taken: Snapshot, problems: list[str]) -> dict[str, Any]:
    """The ``--json`` document (see docs/reference.md, ``jobq_stats``)."""
    queues = []
    for name in taken.queue_names:
        state = taken.queue(name)
        activity = taken.activity.get(name)
        pause = taken.pause(name)
        queues.append(
            {
                "queue": name,
                "ready": state.ready,
                "scheduled": state.scheduled,
                "running": state.running,
                "oldest_ready_age": state.oldest_ready_age,
                "last_minute": _outcomes(activity.last_minute if activity else Outcomes()),
                "last_hour": _outcomes(activity.last_hour if activity else Outcomes()),
                "duration_p50": activity.duration_p50 if activity else None,
                "duration_p99": activity.duration_p99 if activity else None,
                "paused": pause is not None,
                "paused_until": pause.paused_until.isoformat()
                if pause is not None and pause.paused_until is not None
                else None,
            }
        )
    return {
        "taken_at": taken.taken_at.isoformat(),
        "queues": queues,
        "dead_letters": [
            {"queue": group.queue, "kind": group.kind, "count": group.count}
            for group in taken.dead_letters
        ],
        "workers": [
            {
                "worker_id": worker.worker_id,
                "host": worker.host,
                "pid": worker.pid,
                "queues": worker.queues,
                "concurrency": worker.concurrency,
                "kinds": worker.kinds,
                "kinds_fingerprint": worker.kinds_fingerprint,
                "started_at": worker.started_at.isoformat(),
                "last_seen": worker.last_seen.isoformat(),
                "seen_ago": worker.seen_ago,
                "stale": worker.stale,
            }
            for worker in taken.workers
        ],
        "waiting_for_a_worker": [
            {
                "queue": waiting.queue,
                "kind": waiting.kind,
                "jobs": waiting.jobs,
                "oldest_age": waiting.oldest_age,
                "known": waiting.known,
            }
            for waiting in taken.waiting
        ],
        "problems": problems,
        "warnings": find_warnings(taken),
    }


def find_problems(
    taken: Snapshot, *, max_oldest_ready_age: float, max_dead_letters: int | None
) -> list[str]:
    """What ``--check`` reports: each queue whose oldest ready job has waited longer than
    ``max_oldest_ready_age`` seconds (saying so when the queue is paused: that is why its
    jobs wait), and the dead letters if more than ``max_dead_letters`` (``None``: not
    checked)."""
    problems = []
    for queue in taken.queues:
        if queue.oldest_ready_age > max_oldest_ready_age:
            pause = taken.pause(queue.queue)
            because = f": {pause_text(pause)}" if pause is not None else ""
            problems.append(
                f"queue {queue.queue}: the oldest ready job has waited "
                f"{format_seconds(queue.oldest_ready_age)} "
                f"(threshold {format_seconds(max_oldest_ready_age)}){because}"
            )
    dead = sum(group.count for group in taken.dead_letters)
    if max_dead_letters is not None and dead > max_dead_letters:
        problems.append(f"{dead} dead letters (threshold {max_dead_letters})")
    return problems


def find_warnings(taken: Snapshot) -> list[str]:
    """What ``--check`` warns about without failing: jobs that wait for a worker that can
    run them (live workers serve their queue, none has their kind). They either get one (a
    deploy in progress) or become dead letters after ``JOBQ['UNKNOWN_KIND_GRACE']``, which
    the dead-letter threshold then reports; a long wait also trips the ready-age one."""
    return [
        f"{waiting.jobs} jobs of kind {waiting.kind} wait for a worker that can run them "
        f"(queue {waiting.queue}, the oldest for {format_seconds(waiting.oldest_age)})"
        for waiting in taken.waiting
    ]


def _known(kinds: list[str]) -> str:
    shown = ", ".join(kinds[:_KNOWN_SHOWN]) or "no kinds"
    more = len(kinds) - _KNOWN_SHOWN
    return f"{shown} and {more} more" if more > 0 else shown


def write_tables(out: OutputWrapper, taken: Snapshot) -> None:
    """The human-readable report: queues, dead letters, workers."""
    rows = []
    for name in taken.queue_names:
        state = taken.queue(name)
        activity = taken.activity.get(name)
        minute = activity.last_minute if activity else Outcomes()
        hour = activity.last_hour if activity else Outcomes()
        rows.append(
            (
                name,
                str(state.ready),
                str(state.scheduled),
                str(state.running),
                format_seconds(state.oldest_ready_age) if state.ready else "-",
                str(minute.succeeded),
                str(hour.succeeded),
                str(hour.failed),
                format_seconds(activity.duration_p50 if activity else None),
                format_seconds(activity.duration_p99 if activity else None),
                paused_cell(taken.pause(name)),
            )
        )
    if rows:
        write_table(out, _QUEUE_HEADER, rows, right_aligned=set(range(1, 10)))
    else:
        out.write("No queues: no live jobs, dead letters or outcomes in the last hour.")
    out.write("")
    if taken.dead_letters:
        write_table(
            out,
            _DEAD_HEADER,
            [(group.queue, group.kind, str(group.count)) for group in taken.dead_letters],
            right_aligned={2},
        )
    else:
        out.write("No dead letters.")
    out.write("")
    if taken.workers:
        write_table(
            out,
            _WORKER_HEADER,
            [
                (
                    worker.worker_id,
                    worker.host,
                    str(worker.pid),
                    ",".join(worker.queues) if worker.queues is not None else "*",
                    str(worker.concurrency),
                    f"{len(worker.kinds)} ({worker.kinds_fingerprint or '-'})",
                    local_time(worker.started_at),
                    f"{format_seconds(worker.seen_ago)} ago" + (" STALE" if worker.stale else ""),
                )
                for worker in taken.workers
            ],
            right_aligned={2, 4},
        )
    else:
        out.write("No workers registered.")
    if taken.waiting:
        out.write("")
        write_table(
            out,
            _WAITING_HEADER,
            [
                (
                    waiting.queue,
                    waiting.kind,
                    str(waiting.jobs),
                    format_seconds(waiting.oldest_age),
                    _known(waiting.known),
                )
                for waiting in taken.waiting
            ],
            right_aligned={2, 3},
        )


class Command(BaseCommand):
    help = (
        "Show every queue (ready, scheduled and running jobs, the oldest ready job's wait, "
        "outcomes over the last minute and hour, p50/p99 handler duration, whether it is "
        "paused: jobq_queues says more), the dead letters "
        "by kind and the registered workers. --json prints the same as JSON. --check exits "
        f"with status {CHECK_FAILED} when a queue's oldest ready job has waited longer than "
        "the threshold, the dead letters exceed theirs, or a transaction has held the xmin "
        "horizon back longer than its own (jobq_doctor says more); it warns (without failing) "
        "about jobs that wait for a worker that can run them."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--json", action="store_true", help="Print JSON instead of tables.")
        parser.add_argument(
            "--check",
            action="store_true",
            help=f"Exit {CHECK_FAILED} (after printing) if a threshold is exceeded.",
        )
        parser.add_argument(
            "--max-oldest-ready-age",
            type=seconds(zero=True),
            metavar="SECONDS",
            help="With --check: the longest acceptable wait of a ready job, finite and at "
            "least 0 (default JOBQ['ALERT_OLDEST_READY_AGE'], 300).",
        )
        parser.add_argument(
            "--max-dead-letters",
            type=bounded_int(0),
            metavar="N",
            help="With --check: the most dead letters acceptable, all queues together, at "
            "least 0 (default JOBQ['ALERT_DEAD_LETTERS'], 0).",
        )
        parser.add_argument(
            "--max-horizon-age",
            type=seconds(zero=True),
            metavar="SECONDS",
            help="With --check: the longest a transaction (a session's, a prepared one) may "
            "hold the xmin horizon back, finite and at least 0 (default "
            "JOBQ['ALERT_HORIZON_AGE'], 600).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        config = get_settings()
        max_age = options["max_oldest_ready_age"]
        max_dead = options["max_dead_letters"]
        max_horizon = options["max_horizon_age"]
        if max_horizon is None:
            max_horizon = config.ALERT_HORIZON_AGE
        taken = snapshot()
        problems = []
        horizon_warnings = []
        if options["check"]:
            problems = find_problems(
                taken,
                max_oldest_ready_age=config.ALERT_OLDEST_READY_AGE if max_age is None else max_age,
                max_dead_letters=config.ALERT_DEAD_LETTERS if max_dead is None else max_dead,
            )
            if max_horizon is not None:
                health = mvcc.read()
                horizon = mvcc.horizon_findings(
                    health.holders, health.role, max_age=max_horizon, max_transactions=None
                )
                problems += [finding.text for finding in horizon if finding.problem]
                horizon_warnings = [finding.text for finding in horizon if not finding.problem]
        if options["json"]:
            self.stdout.write(json.dumps(as_json(taken, problems), indent=2))
        else:
            write_tables(self.stdout, taken)
        if options["check"]:
            for warning in [*find_warnings(taken), *horizon_warnings]:
                self.stderr.write(f"warning: {warning}")
        if problems:
            raise CommandError("; ".join(problems), returncode=CHECK_FAILED)
