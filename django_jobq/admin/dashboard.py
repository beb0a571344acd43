"""The admin dashboard: the queue at a glance (``/admin/django_jobq/job/dashboard/``).

Per queue: ready, scheduled and running jobs, the oldest ready job's wait (red above
``JOBQ['ALERT_OLDEST_READY_AGE']``, saying so when the queue is paused: that is why it
grows), the last hour's outcomes and p50/p99 durations, its pause and limits (linked to the
Queues page, :mod:`.queues`, for those who may see it), and four
charts of the last hour minute by minute (ready depth, oldest ready age, succeeded, failed).
Below: dead letters by queue and kind, linked to the filtered dead-letter list (shown to
users who may view dead letters), the jobs waiting for a worker that can run them (live
workers serve their queue, none has their kind), the registered workers with the kinds
they claim (count and fingerprint; the list unfolds), stale ones marked, and the database's
MVCC health (:mod:`django_jobq.mvcc`): the findings, who holds the xmin horizon back (the
oldest few, red above ``JOBQ['ALERT_HORIZON_AGE']``; without their queries, which can carry
data a viewer of jobs should not see: ``jobq_doctor`` shows them) and every jobq table's live
and dead rows, autovacuum and last vacuum.

Its reads are bounded however many jobs and dead letters there are
(``stats.snapshot(count_cap=COUNT_CAP)``): each queue's ready and scheduled jobs, each
group's dead letters and the jobs waiting for a worker of their kind are counted up to
:data:`COUNT_CAP`, and shown as "more than 1,000" beyond it; the ready jobs then also show
the latest sample of the queue's depth (taken by a worker once a minute, exactly), the
number the "Ready jobs" chart plots. Running jobs are counted exactly (they are as many as
the workers hold).

Linked from the app's index page and the Jobs list. Needs staff status and the permission to
view jobs (``django_jobq.view_job`` or ``change_job``); it only reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING
from urllib.parse import urlencode

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.safestring import SafeString

from .. import flow_control, mvcc, stats
from ..conf import get_settings
from ..models import DeadLetter, Job
from .charts import chart

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin

VIEW_DEAD_LETTERS_PERMISSION = "django_jobq.view_deadletter"
VIEW_QUEUES_PERMISSION = "django_jobq.view_queue"
CHANGE_QUEUES_PERMISSION = "django_jobq.change_queue"
#: The most jobs per queue and state, and dead letters per (queue, kind), the dashboard counts.
COUNT_CAP = 1_000


def counted(count: int) -> str:
    """A count read with :data:`COUNT_CAP`, as the dashboard shows it: ``"37"``, or ``"more
    than 1,000"`` for a count above the cap."""
    return f"more than {COUNT_CAP:,}" if count > COUNT_CAP else str(count)


@dataclass(frozen=True)
class QueueRow:
    """One queue's line and charts on the dashboard: the counts as :func:`counted` shows
    them, and for a ready count above the cap the latest sampled depth (``"1234567 at
    14:05"``, or ``None`` without a sample in the last hour)."""

    state: stats.QueueState
    ready: str
    scheduled: str
    running: str
    ready_sampled: str | None
    last_hour: stats.Outcomes
    oldest_ready_age: str
    duration_p50: str
    duration_p99: str
    alert: bool
    charts: list[SafeString]
    #: Why its ready jobs wait when the queue is paused (:func:`django_jobq.stats.pause_text`).
    paused: str | None = None
    #: Its effective limits, e.g. ``"3 running (setting), 100/s (operator)"``; ``""``: none.
    limits: str = ""


def _charts(history: stats.QueueHistory | None) -> list[SafeString]:
    minutes = stats.HISTORY_MINUTES
    if history is None:
        empty: list[float | None] = [None] * minutes
        ready = age = empty
        succeeded = failed = [0.0] * minutes
    else:
        ready = [None if value is None else float(value) for value in history.ready]
        age = list(history.oldest_ready_age)
        succeeded = [float(value) for value in history.succeeded]
        failed = [float(value) for value in history.failed]
    return [
        chart(ready, title="Ready jobs", style="line"),
        chart(age, title="Oldest ready age", style="line", label=stats.format_seconds),
        chart(succeeded, title="Succeeded / min"),
        chart(failed, title="Failed / min", color="#ba2121"),
    ]


#: Horizon holders the dashboard lists, the oldest first (``jobq_doctor`` lists them all).
HOLDERS_SHOWN = 5


@dataclass(frozen=True)
class HolderRow:
    """A horizon holder's line on the dashboard: its age in seconds or transactions, red
    when it makes a finding."""

    holder: mvcc.Holder
    age: str
    alert: bool


@dataclass(frozen=True)
class TableRow:
    """A jobq table's line on the dashboard."""

    table: mvcc.TableHealth
    dead_ratio: str
    vacuumed: str
    alert: bool


def _ago(moment: datetime | None, now: datetime) -> str:
    if moment is None:
        return "never"
    return f"{stats.format_seconds(max((now - moment).total_seconds(), 0.0))} ago"


def _holder_age(holder: mvcc.Holder) -> str:
    """Its transaction's age, else how many transactions it holds the horizon back by."""
    if holder.transaction_age is not None:
        return stats.format_seconds(holder.transaction_age)
    transactions = holder.xmin_age if holder.xmin_age is not None else holder.catalog_xmin_age
    return f"{transactions} transactions"


def mvcc_context(health: mvcc.Health, thresholds: mvcc.Thresholds) -> dict[str, object]:
    """The MVCC panel's part of the template context: ``findings`` (problems first),
    ``holders`` (:class:`HolderRow`, at most :data:`HOLDERS_SHOWN`), ``more_holders``
    (how many are not shown), ``tables`` (:class:`TableRow`), ``mvcc`` (the health)."""
    found = mvcc.findings(health, thresholds)
    flagged = {finding.subject for finding in found if finding.problem}
    holders = [
        HolderRow(holder=holder, age=_holder_age(holder), alert=holder.subject in flagged)
        for holder in health.holders[:HOLDERS_SHOWN]
    ]
    tables = [
        TableRow(
            table=table,
            dead_ratio="-" if table.dead_ratio is None else f"{table.dead_ratio:.2f}",
            vacuumed=_ago(table.vacuumed_at, health.taken_at),
            alert=f"table {table.table}" in flagged,
        )
        for table in health.tables
    ]
    return {
        "mvcc": health,
        "findings": found,
        "holders": holders,
        "more_holders": max(len(health.holders) - HOLDERS_SHOWN, 0),
        "tables": tables,
    }


def limits_text(control: flow_control.QueueControl | None) -> str:
    """A queue's effective limits with their sources, for people: ``"at most 3 running
    (setting), 100/s (operator)"``; ``""`` without any."""
    if control is None:
        return ""
    parts = []
    if control.concurrency_limit is not None:
        parts.append(
            f"at most {control.concurrency_limit} running ({control.concurrency_limit_source})"
        )
    if control.rate_limit is not None:
        parts.append(f"{control.rate_limit} ({control.rate_limit_source})")
    return ", ".join(parts)


def _latest_sample(history: stats.QueueHistory | None) -> str | None:
    """The latest sampled ready depth of the last hour, with its minute (UTC)."""
    if history is not None:
        for minute, ready in zip(reversed(history.minutes), reversed(history.ready), strict=True):
            if ready is not None:
                return f"{ready} at {minute:%H:%M} UTC"
    return None


def dashboard_view(request: HttpRequest, model_admin: ModelAdmin[Job]) -> TemplateResponse:
    """Render the dashboard (one :func:`django_jobq.stats.snapshot`) for the jobs'
    ``model_admin`` (:class:`~django_jobq.admin.JobAdmin`, whose URL it is).

    Raises:
        PermissionDenied: the user may not view jobs.
    """
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    config = get_settings()
    taken = stats.snapshot(count_cap=COUNT_CAP)
    health = mvcc.read()
    rows = []
    for name in taken.queue_names:
        state = taken.queue(name)
        activity = taken.activity.get(name)
        history = taken.history.get(name)
        rows.append(
            QueueRow(
                state=state,
                ready=counted(state.ready),
                scheduled=counted(state.scheduled),
                running=str(state.running),
                ready_sampled=_latest_sample(history) if state.ready > COUNT_CAP else None,
                last_hour=activity.last_hour if activity else stats.Outcomes(),
                oldest_ready_age=stats.format_seconds(state.oldest_ready_age)
                if state.ready
                else "-",
                duration_p50=stats.format_seconds(activity.duration_p50 if activity else None),
                duration_p99=stats.format_seconds(activity.duration_p99 if activity else None),
                alert=state.oldest_ready_age > config.ALERT_OLDEST_READY_AGE,
                charts=_charts(history),
                paused=stats.pause_text(pause) if (pause := taken.pause(name)) else None,
                limits=limits_text(taken.controls.get(name)),
            )
        )
    show_dead_letters = request.user.has_perm(VIEW_DEAD_LETTERS_PERMISSION)
    dead_letters_url = reverse(f"{model_admin.admin_site.name}:django_jobq_deadletter_changelist")
    dead_letters = [
        {
            "group": group,
            "count": counted(group.count),
            "url": f"{dead_letters_url}?{urlencode({'queue': group.queue, 'kind': group.kind})}",
        }
        for group in taken.dead_letters
    ]
    # At least this many: each group's count stops at the cap, and the groups at CAPPED_GROUPS.
    total_dead = sum(min(group.count, COUNT_CAP) for group in taken.dead_letters)
    more_dead = len(taken.dead_letters) == stats.CAPPED_GROUPS or any(
        group.count > COUNT_CAP for group in taken.dead_letters
    )
    limit = config.ALERT_DEAD_LETTERS
    context = {
        **model_admin.admin_site.each_context(request),
        "title": "Job queue dashboard",
        "opts": model_admin.model._meta,
        "dead_letter_opts": DeadLetter._meta,
        "taken": taken,
        "rows": rows,
        "show_dead_letters": show_dead_letters,
        "dead_letters": dead_letters,
        "total_dead_letters": f"more than {total_dead:,}" if more_dead else str(total_dead),
        "dead_letters_plural": total_dead != 1 or more_dead,
        "dead_letter_groups_cut": len(taken.dead_letters) == stats.CAPPED_GROUPS,
        "dead_letters_alert": limit is not None and total_dead > limit,
        "workers": [(worker, stats.format_seconds(worker.seen_ago)) for worker in taken.workers],
        "live_workers": sum(not worker.stale for worker in taken.workers),
        "waiting": [
            (item, counted(item.jobs), stats.format_seconds(item.oldest_age))
            for item in taken.waiting
        ],
        "unknown_kind_grace": "forever"
        if config.UNKNOWN_KIND_GRACE is None
        else stats.format_seconds(config.UNKNOWN_KIND_GRACE),
        "alert_oldest_ready_age": stats.format_seconds(config.ALERT_OLDEST_READY_AGE),
        "show_queues_page": request.user.has_perm(VIEW_QUEUES_PERMISSION)
        or request.user.has_perm(CHANGE_QUEUES_PERMISSION),
        "history_minutes": stats.HISTORY_MINUTES,
        **mvcc_context(health, mvcc.Thresholds(horizon_age=config.ALERT_HORIZON_AGE)),
    }
    return TemplateResponse(request, "admin/django_jobq/dashboard.html", context)
