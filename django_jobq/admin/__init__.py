"""Admin screens for jobs and dead letters, with the operators' actions.

Rows are written only by enqueue, the workers' fenced statements and :mod:`.operations`, so
no form here edits one: editing a running job would bypass its lease. What staff can do:

- **Jobs**: "Run selected jobs now" and "Cancel selected ready jobs" (Django's change
  permission on jobs, ``django_jobq.change_job``). Running jobs are skipped by both; there is
  no delete, since deleting a running job would pull the row from under its worker. "Abort
  the selected running jobs" (the same permission) asks running jobs to stop
  (:func:`.operations.abort_many`) and skips the others; a job with an abort requested shows
  "running (abort requested)" in the list and the request's time on its page.
- **Dead letters**: "Redrive selected dead letters" (also "select all N" on a filtered list:
  the filtered queryset goes to :func:`.operations.redrive`, one statement per batch) and a
  "Redrive" button on the detail page, both needing what the list needs (Django's view or
  change permission on dead letters) and ``django_jobq.redrive_deadletter``; and Django's
  own delete. **Dead letters by cause** (:mod:`.cause_pages`, linked above the list) groups
  them by fingerprint, and redrives or deletes a whole cause after a confirmation, with the
  same permissions.

The **dashboard** (:mod:`.dashboard`, linked from the app index and the Jobs list) shows the
queue at a glance to staff who may view jobs.

**Queues** and **Kind limits** (:mod:`.queues`) are flow control: pause and resume queues
(Django's admin actions, ``django_jobq.change_queue``), and change the limits of queues and
kinds at run time.

No page's cost grows with the size of the tables: the lists count up to
a cap (:mod:`.pagination`), their filters offer what the project names rather than what the
rows hold (:mod:`.filters`), search and ordering use the tables' indexes, and the
dashboard's counts are bounded (docs/operations.md, "The admin with a large queue").

The actions are POSTs with Django's CSRF protection: Django's admin actions for the lists,
and for the detail page a form in the change form's object tools
(``admin/django_jobq/deadletter/change_form.html``) posting to
:meth:`DeadLetterAdmin.redrive_view`, a URL of this admin's own :meth:`~DeadLetterAdmin.get_urls`.
Plain Django admin: ``INSTALLED_APPS`` needs only ``"django_jobq"`` (and Django's admin).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar

from django.contrib import admin, messages
from django.contrib.admin.utils import display_for_value, flatten, quote, unquote
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, models, transaction
from django.db.models import Case, F, Q, QuerySet, TextField, When
from django.db.models.functions import Cast, Left, Length
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.template.defaultfilters import pluralize
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.text import Truncator

from .. import operations
from ..conf import get_settings
from ..models import DeadLetter, Job
from . import cause_pages
from . import queues as queues  # registers the Queues and Kind limits pages
from .dashboard import dashboard_view
from .filters import KindFilter, QueueFilter, ReasonFilter, StatusFilter
from .pagination import CappedCountPaginator

if TYPE_CHECKING:  # ModelAdmin is generic only in django-stubs
    JobAdminBase = admin.ModelAdmin[Job]
    DeadLetterAdminBase = admin.ModelAdmin[DeadLetter]
else:
    JobAdminBase = DeadLetterAdminBase = admin.ModelAdmin

OPERATE_JOBS_PERMISSION = "django_jobq.change_job"
REDRIVE_PERMISSION = "django_jobq.redrive_deadletter"


def _pre(text: str) -> SafeString:
    """``text`` escaped inside ``<pre>`` (payloads and tracebacks are user data), long
    lines wrapped rather than cut off by the admin's layout."""
    return format_html('<pre style="white-space: pre-wrap">{}</pre>', text)


#: A search term that is a job id: a whole number a ``bigint`` holds (18 digits at most).
_JOB_ID = re.compile(r"[0-9]{1,18}")


def _job_id(term: str) -> int | None:
    """``term`` as a job id, or ``None`` if it is not one."""
    return int(term) if _JOB_ID.fullmatch(term) else None


#: The most payload characters a detail page shows (the rest is counted, not shown).
MAX_PAYLOAD_SHOWN = 100_000

# Values Python loads: datetimes of the years 1 to 9999 (a day's margin for time zones),
# timedeltas of fewer than 999,999,999 days.
_LOADABLE_RANGES: dict[type[models.Field[Any, Any]], tuple[Any, Any]] = {
    models.DateTimeField: (datetime(1, 1, 2, tzinfo=UTC), datetime(9999, 12, 30, tzinfo=UTC)),
    models.DurationField: (timedelta(days=-999_999_998), timedelta(days=999_999_998)),
}


def _loadable(model: type[Job | DeadLetter], name: str) -> Case:
    """The field's value where Python can load it, else NULL (then ``_text`` shows it)."""
    field = model._meta.get_field(name)
    assert isinstance(field, models.Field)
    low, high = _LOADABLE_RANGES[type(field)]
    return Case(When(**{f"{name}__range": (low, high)}, then=F(name)), output_field=field)


def _safe_value(name: str, description: str) -> Callable[[Any, Any], str]:
    """A column showing field ``name`` of a row read by :meth:`_JobFieldsDisplay.get_queryset`:
    as Django shows it when Python can load it, else as PostgreSQL prints it."""

    @admin.display(description=description, ordering=name)
    def shown(self: Any, obj: Job | DeadLetter) -> str:
        value = getattr(obj, f"{name}_loadable")
        if value is not None:
            return str(display_for_value(value, "-"))
        text = getattr(obj, f"{name}_text")
        return "-" if text is None else str(text)

    return shown


class _JobFieldsDisplay:
    """Columns and detail fields both screens show; rows read from the queue's database.

    Neither list's cost grows with its table: they count at most
    :attr:`CappedCountPaginator.count_cap` rows (no count of the whole table), their
    filters' choices come from the project (:mod:`.filters`, no ``SELECT DISTINCT``),
    Django's facet counts (one count per choice) are off, and each sorts only by what an
    index serves.

    A row not written by ``enqueue`` (another producer, a hand-written fix; see
    docs/operations.md) may hold what Python cannot load: an infinite time, an interval
    beyond ``timedelta``, a payload nested past the recursion limit. Those fields
    (``risky_fields``) are never loaded: each is read as a loadable value or as text
    (``<name>_loadable``, ``<name>_text``) and the payload as truncated text, so every row
    that exists renders. Ordering and filters still use the fields themselves.
    """

    risky_fields: tuple[str, ...] = ()
    paginator: ClassVar[type] = CappedCountPaginator
    show_full_result_count: ClassVar[bool] = False
    show_facets: ClassVar[admin.ShowFacets] = admin.ShowFacets.NEVER

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        queryset: QuerySet[Any] = super().get_queryset(request)  # type: ignore[misc]
        model = queryset.model
        annotations: dict[str, Any] = {}
        for name in self.risky_fields:
            annotations[f"{name}_loadable"] = _loadable(model, name)
            annotations[f"{name}_text"] = Cast(name, TextField())
        queryset = queryset.using(get_settings().DATABASE).defer("payload", *self.risky_fields)
        annotated: QuerySet[Any] = queryset.annotate(**annotations)
        return annotated

    @admin.display(description="attempts", ordering="attempts")
    def attempts_display(self, obj: Job | DeadLetter) -> str:
        return f"{obj.attempts}/{obj.max_attempts}"

    @admin.display(description="payload")
    def payload_json(self, obj: Job | DeadLetter) -> SafeString:
        """The payload, indented; as PostgreSQL prints it (cut to
        :data:`MAX_PAYLOAD_SHOWN` characters) when Python cannot decode it."""
        text_of_payload = Cast("payload", TextField())
        text, length = (
            type(obj)
            ._default_manager.using(get_settings().DATABASE)
            .filter(pk=obj.pk)
            .values_list(Left(text_of_payload, MAX_PAYLOAD_SHOWN), Length(text_of_payload))
            .get()
        )
        if length > MAX_PAYLOAD_SHOWN:
            return _pre(f"{text}... [{length - MAX_PAYLOAD_SHOWN} more characters]")
        try:
            return _pre(json.dumps(json.loads(text), indent=2, ensure_ascii=False))
        except RecursionError:
            return _pre(text)

    @admin.display(description="last error")
    def last_error_text(self, obj: Job | DeadLetter) -> SafeString:
        return _pre(obj.last_error)


@admin.register(Job)
class JobAdmin(_JobFieldsDisplay, JobAdminBase):
    list_display = (
        "id",
        "kind",
        "queue",
        "status_shown",
        "priority",
        "attempts_display",
        "run_at_shown",
        "lease_deadline_shown",
        "worker_id",
    )
    list_filter = (QueueFilter, KindFilter, StatusFilter)
    search_fields = ("id", "idempotency_key")  # as get_search_results looks them up
    search_help_text = "A job's id, or its idempotency key (exactly)."
    sortable_by = ("id",)
    # No date hierarchy: it loads min(created_at) and each row's year, which a created_at
    # of 'infinity' (a row not written by enqueue) would turn into an error page.
    risky_fields = (
        "run_at",
        "expires_at",
        "created_at",
        "started_at",
        "lease_deadline",
        "visibility_timeout",
        "abort_requested_at",
    )
    run_at_shown = _safe_value("run_at", "run at")
    expires_at_shown = _safe_value("expires_at", "expires at")
    created_at_shown = _safe_value("created_at", "created at")
    started_at_shown = _safe_value("started_at", "started at")
    lease_deadline_shown = _safe_value("lease_deadline", "lease deadline")
    visibility_timeout_shown = _safe_value("visibility_timeout", "visibility timeout")
    abort_requested_at_shown = _safe_value("abort_requested_at", "abort requested at")
    fields = (
        ("id", "kind", "queue"),
        ("status", "priority", "attempts_display"),
        ("run_at_shown", "expires_at_shown", "created_at_shown"),
        (
            "visibility_timeout_shown",
            "lease_deadline_shown",
            "started_at_shown",
            "worker_id",
        ),
        "abort_requested_at_shown",
        "idempotency_key",
        "payload_json",
        "last_error_text",
    )
    readonly_fields = flatten(fields)
    actions = ("run_now", "cancel", "abort")

    @admin.display(description="status")
    def status_shown(self, obj: Job) -> str:
        """The status, and "(abort requested)" once an operator asked the job to stop (a
        running job, or one whose retry or release was written as the request arrived: its
        next claim dead-letters it unrun)."""
        status = obj.get_status_display()
        # The loadable value or the text: either is set when a request was made.
        if obj.abort_requested_at_text is not None:  # type: ignore[attr-defined]
            return f"{status} (abort requested)"
        return str(status)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Job], search_term: str
    ) -> tuple[QuerySet[Job], bool]:
        """The job whose id or idempotency key is exactly ``search_term`` (surrounding
        spaces ignored): the primary key and ``jobq_job_idempotency_uniq`` serve both, where
        Django's own search would compare every row's text."""
        term = search_term.strip()
        if not term:
            return queryset, False
        match = Q(idempotency_key=term)
        job_id = _job_id(term)
        if job_id is not None:
            match |= Q(pk=job_id)
        return queryset.filter(match), False

    def get_ordering(self, request: HttpRequest) -> tuple[str, ...]:
        """Ready jobs in claim order (``jobq_job_claim_idx`` and its kin serve it), running
        ones by lease deadline (``jobq_job_lease_idx``), all live jobs newest first (the
        primary key): each an index scan that stops at the page."""
        status = request.GET.get(StatusFilter.parameter_name)
        if status == Job.Status.READY:
            return ("-priority", "run_at", "id")
        if status == Job.Status.RUNNING:
            return ("lease_deadline", "id")
        return ("-id",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        return False

    def get_urls(self) -> list[URLPattern]:
        dashboard = path(
            "dashboard/",
            self.admin_site.admin_view(lambda request: dashboard_view(request, self)),
            name="django_jobq_dashboard",
        )
        return [dashboard, *super().get_urls()]

    def has_operate_permission(self, request: HttpRequest) -> bool:
        """May run jobs now, cancel and abort them: Django's change permission on jobs."""
        return request.user.has_perm(OPERATE_JOBS_PERMISSION)

    @admin.action(permissions=["operate"], description="Run selected jobs now")
    def run_now(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        self._operate(
            request,
            queryset,
            operations.run_now,
            "job{s} made due now.",
            "running jobs, and ready jobs already due.",
        )

    @admin.action(permissions=["operate"], description="Cancel selected ready jobs")
    def cancel(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        self._operate(
            request,
            queryset,
            operations.cancel_many,
            "ready job{s} cancelled.",
            "running jobs cannot be cancelled (their worker holds a lease).",
        )

    @admin.action(permissions=["operate"], description="Abort the selected running jobs")
    def abort(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        self._operate(
            request,
            queryset,
            operations.abort_many,
            "running job{s}: abort requested (each stops once its handler sees it).",
            "not running (only a running job can be aborted; cancel a ready one).",
        )

    def _operate(
        self,
        request: HttpRequest,
        queryset: QuerySet[Job],
        operation: Callable[[list[int]], int],
        done: str,
        why_skipped: str,
    ) -> None:
        """Apply a set-based operation to the selected jobs and say what it did. A row that
        breaks the jobs table's constraints (written before they existed, see
        docs/operations.md) makes the database refuse the whole statement: say so."""
        ids = list(queryset.values_list("id", flat=True))
        try:
            with transaction.atomic(using=get_settings().DATABASE):  # savepoint if atomic
                changed = operation(ids)
        except IntegrityError as exc:
            self.message_user(request, f"Nothing changed: {exc}", messages.ERROR)
            return
        message = f"{changed} {done.format(s=pluralize(changed))}"
        skipped = len(ids) - changed
        if skipped:
            message = f"{message} {skipped} skipped: {why_skipped}"
        self.message_user(request, message, messages.WARNING if skipped else messages.SUCCESS)


@admin.register(DeadLetter)
class DeadLetterAdmin(_JobFieldsDisplay, DeadLetterAdminBase):
    list_display = (
        "id",
        "kind",
        "queue",
        "reason",
        "error_summary",
        "attempts_display",
        "died_at",
    )
    list_filter = (KindFilter, QueueFilter, ReasonFilter, ("died_at", admin.DateFieldListFilter))
    search_fields = ("job_id", "last_error")  # as get_search_results looks them up
    search_help_text = "The id the job had (exactly), or text in the error."
    ordering = ("-died_at", "-id")
    sortable_by = ("id", "died_at")
    risky_fields = ("created_at", "visibility_timeout")  # as the job had them
    created_at_shown = _safe_value("created_at", "created at")
    visibility_timeout_shown = _safe_value("visibility_timeout", "visibility timeout")
    fields = (
        ("id", "job_id", "kind", "queue"),
        ("priority", "attempts_display", "visibility_timeout_shown"),
        ("created_at_shown", "died_at"),
        "idempotency_key",
        "reason",
        "cause",
        "payload_json",
        "last_error_text",
        "traceback_text",
    )
    readonly_fields = flatten(fields)
    actions = ("redrive_selected",)
    # Django's list with a link to the dead letters by cause; its change form with the
    # Redrive button (shown where ``may_redrive``).
    change_list_template = "admin/django_jobq/deadletter/change_list.html"
    change_form_template = "admin/django_jobq/deadletter/change_form.html"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: DeadLetter | None = None) -> bool:
        return False

    def has_redrive_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(REDRIVE_PERMISSION)

    def may_redrive(self, request: HttpRequest) -> bool:
        """Whether the user may run "Redrive selected dead letters": Django's admin offers
        that action to whoever may see the list (the view or change permission) and has
        :meth:`has_redrive_permission` (``@admin.action(permissions=["redrive"])``). The
        button asks the same, to show itself and to act."""
        return self.has_view_or_change_permission(request) and self.has_redrive_permission(request)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[DeadLetter], search_term: str
    ) -> tuple[QuerySet[DeadLetter], bool]:
        """A whole number finds the dead letter of that job id; any other ``search_term``
        (surrounding spaces ignored) the dead letters whose error contains it, in any case.
        One condition per search, where Django's own search would test every search field's
        text for each word. The kind and reason have their filters."""
        term = search_term.strip()
        if not term:
            return queryset, False
        job_id = _job_id(term)
        if job_id is not None:
            return queryset.filter(job_id=job_id), False
        return queryset.filter(last_error__icontains=term), False

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        """Django's change view (read-only here), with ``may_redrive`` for the template."""
        context = {**(extra_context or {}), "may_redrive": self.may_redrive(request)}
        return super().change_view(request, object_id, form_url, context)

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view
        by_cause = [
            path(
                "causes/",
                view(lambda request: cause_pages.causes_view(request, self)),
                name="django_jobq_deadletter_causes",
            ),
            *(
                path(
                    f"causes/{action.name}/",
                    view(
                        lambda request, action=action: cause_pages.cause_action_view(
                            request, self, action
                        )
                    ),
                    name=f"django_jobq_deadletter_{action.name}_cause",
                )
                for action in (cause_pages.REDRIVE, cause_pages.DELETE)
            ),
        ]
        # After "causes/redrive/", which this pattern would take for a dead letter "causes";
        # before Django's own, whose "<path:object_id>/" redirect would take it.
        button = path(
            "<path:object_id>/redrive/",
            view(self.redrive_view),
            name="django_jobq_deadletter_redrive",
        )
        return [*by_cause, button, *super().get_urls()]

    @admin.display(description="error")
    def error_summary(self, obj: DeadLetter) -> str:
        first_line = obj.last_error.strip().partition("\n")[0]
        return Truncator(first_line).chars(80)

    @admin.display(description="traceback")
    def traceback_text(self, obj: DeadLetter) -> SafeString:
        return _pre(obj.traceback)

    @admin.display(description="cause")
    def cause(self, obj: DeadLetter) -> SafeString:
        """The fingerprint, linked to the list of the dead letters sharing it."""
        return format_html(
            '<a href="{}"><code>{}</code></a>',
            cause_pages.list_url(self, obj.fingerprint),
            obj.fingerprint,
        )

    @admin.action(permissions=["redrive"], description="Redrive selected dead letters")
    def redrive_selected(self, request: HttpRequest, queryset: QuerySet[DeadLetter]) -> None:
        selected = queryset.count()
        self.report_redrive(request, selected, operations.redrive(queryset))

    def report_redrive(self, request: HttpRequest, selected: int, created: int) -> None:
        """Say that ``created`` jobs came of ``selected`` dead letters, and why the others
        were left in place."""
        self.message_user(
            request, f"{created} dead letter{pluralize(created)} redriven as new jobs."
        )
        if created < selected:
            left = selected - created
            self.message_user(
                request,
                f"{left} dead letter{pluralize(left)} left in place: "
                f"{operations.LEFT_IN_PLACE_BECAUSE}.",
                messages.WARNING,
            )

    @staticmethod
    def _key_is_held(obj: DeadLetter) -> bool:
        """Whether a live job of the dead letter's kind holds its idempotency key."""
        return obj.idempotency_key is not None and (
            Job.objects.using(get_settings().DATABASE)
            .filter(kind=obj.kind, idempotency_key=obj.idempotency_key)
            .exists()
        )

    def redrive_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The Redrive button: redrive one dead letter, read from the queue's database.

        URL ``<id>/redrive/`` (name ``admin:django_jobq_deadletter_redrive``), posted by the
        form in the change form's object tools. Answers 405 unless POST (the admin site
        checks its CSRF token: 403 without), 403 unless :meth:`may_redrive` (what the bulk
        action needs), 404 for an id that is not a dead letter on the queue's database
        (``JOBQ["DATABASE"]``, whatever its alias). Redrives with
        :func:`.operations.redrive_one` (the bulk action's statement, on that database), then
        redirects to the list saying which job it became, or back to the dead letter saying
        why it stayed.
        """
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.may_redrive(request):
            raise PermissionDenied
        obj = self.get_object(request, unquote(object_id))
        if obj is None:
            raise Http404(f"No dead letter with id {object_id!r}.")
        site = self.admin_site.name
        job_id = operations.redrive_one(obj.pk)
        if job_id is None:
            self.message_user(
                request,
                f"Not redriven: a live job of kind {obj.kind} holds idempotency key"
                f" {obj.idempotency_key!r}."
                if self._key_is_held(obj)
                else f"Not redriven: {operations.NOT_A_JOB}.",
                messages.ERROR,
            )
            change_url = reverse(f"{site}:django_jobq_deadletter_change", args=[quote(obj.pk)])
            return HttpResponseRedirect(change_url)
        job_url = reverse(f"{site}:django_jobq_job_change", args=[job_id])
        self.message_user(
            request,
            format_html(
                'Dead letter {} redriven as job <a href="{}">{}</a>.', obj.pk, job_url, job_id
            ),
        )
        return HttpResponseRedirect(reverse(f"{site}:django_jobq_deadletter_changelist"))
