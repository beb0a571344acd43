"""Admin screens for jobs and dead letters, with the operators' actions.

Rows are written only by enqueue, the workers' fenced statements and :mod:`.operations`, so
no form here edits one: editing a running job would bypass its lease. What staff can do:

- **Jobs**: "Run selected jobs now" and "Cancel selected ready jobs" (Django's change
  permission on jobs, ``django_jobq.change_job``). Running jobs are skipped by both; there is
  no delete, since deleting a running job would pull the row from under its worker.
- **Dead letters**: "Redrive selected dead letters" (also "select all N" on a filtered list:
  the filtered queryset goes to :func:`.operations.redrive`, one statement per batch) and a
  "Redrive" button on the detail page, both needing what the list needs (Django's view or
  change permission on dead letters) and ``django_jobq.redrive_deadletter``; and Django's
  own delete.

The **dashboard** (:mod:`.dashboard`, linked from the app index and the Jobs list) shows the
queue at a glance to staff who may view jobs.

The actions are POSTs with Django's CSRF protection: Django's admin actions for the lists,
a form button rendered by django-object-actions (``methods=("POST",)``) for the detail page.
The button's URL is answered by :meth:`DeadLetterAdmin.redrive_view`, not by that library's
view, which checks no permission and looks the dead letter up on the default database.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin.utils import flatten, quote, unquote
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.template.defaultfilters import pluralize
from django.urls import URLPattern, path, re_path, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.text import Truncator
from django_object_actions import DjangoObjectActions
from django_object_actions import action as object_action

from . import operations
from .conf import get_settings
from .dashboard import dashboard_view
from .models import DeadLetter, Job

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


class _JobFieldsDisplay:
    """Columns and detail fields both screens show; rows read from the queue's database."""

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        queryset: QuerySet[Any] = super().get_queryset(request)  # type: ignore[misc]
        return queryset.using(get_settings().DATABASE)

    @admin.display(description="attempts", ordering="attempts")
    def attempts_display(self, obj: Job | DeadLetter) -> str:
        return f"{obj.attempts}/{obj.max_attempts}"

    @admin.display(description="payload")
    def payload_json(self, obj: Job | DeadLetter) -> SafeString:
        return _pre(json.dumps(obj.payload, indent=2, ensure_ascii=False))

    @admin.display(description="last error")
    def last_error_text(self, obj: Job | DeadLetter) -> SafeString:
        return _pre(obj.last_error)


@admin.register(Job)
class JobAdmin(_JobFieldsDisplay, JobAdminBase):
    list_display = (
        "id",
        "kind",
        "queue",
        "status",
        "priority",
        "attempts_display",
        "run_at",
        "lease_deadline",
        "worker_id",
    )
    list_filter = ("queue", "kind", "status")
    search_fields = ("=id", "kind", "idempotency_key")
    ordering = ("-priority", "run_at", "id")  # the claim order
    date_hierarchy = "created_at"
    fields = (
        ("id", "kind", "queue"),
        ("status", "priority", "attempts_display"),
        ("run_at", "expires_at", "created_at"),
        ("visibility_timeout", "lease_deadline", "started_at", "worker_id"),
        "idempotency_key",
        "payload_json",
        "last_error_text",
    )
    readonly_fields = flatten(fields)
    actions = ("run_now", "cancel")

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
        """May run jobs now and cancel them: Django's change permission on jobs."""
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

    def _operate(
        self,
        request: HttpRequest,
        queryset: QuerySet[Job],
        operation: Callable[[list[int]], int],
        done: str,
        why_skipped: str,
    ) -> None:
        """Apply a set-based operation to the selected jobs and say what it did."""
        ids = list(queryset.values_list("id", flat=True))
        changed = operation(ids)
        message = f"{changed} {done.format(s=pluralize(changed))}"
        skipped = len(ids) - changed
        if skipped:
            message = f"{message} {skipped} skipped: {why_skipped}"
        self.message_user(request, message, messages.WARNING if skipped else messages.SUCCESS)


@admin.register(DeadLetter)
class DeadLetterAdmin(DjangoObjectActions, _JobFieldsDisplay, DeadLetterAdminBase):
    list_display = (
        "id",
        "kind",
        "queue",
        "reason",
        "error_summary",
        "attempts_display",
        "died_at",
    )
    list_filter = ("kind", "queue", "reason")
    date_hierarchy = "died_at"
    search_fields = ("=job_id", "kind", "reason", "last_error")
    ordering = ("-died_at", "-id")
    fields = (
        ("id", "job_id", "kind", "queue"),
        ("priority", "attempts_display", "visibility_timeout"),
        ("created_at", "died_at"),
        "idempotency_key",
        "reason",
        "payload_json",
        "last_error_text",
        "traceback_text",
    )
    readonly_fields = flatten(fields)
    actions = ("redrive_selected",)
    change_actions = ("redrive",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: DeadLetter | None = None) -> bool:
        return False

    def has_redrive_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(REDRIVE_PERMISSION)

    def get_change_actions(
        self, request: HttpRequest, object_id: str, form_url: str
    ) -> Sequence[str]:
        return self.change_actions if self.has_redrive_permission(request) else ()

    def get_urls(self) -> list[URLPattern]:
        # Before django-object-actions' own route for the button's URL (which its template
        # reverses by that route's name), so this admin's view answers it.
        button = re_path(
            r"^(?P<object_id>.+)/actions/redrive/$",
            self.admin_site.admin_view(self.redrive_view),
            name="django_jobq_deadletter_redrive",
        )
        return [button, *super().get_urls()]

    @admin.display(description="error")
    def error_summary(self, obj: DeadLetter) -> str:
        first_line = obj.last_error.strip().partition("\n")[0]
        return Truncator(first_line).chars(80)

    @admin.display(description="traceback")
    def traceback_text(self, obj: DeadLetter) -> SafeString:
        return _pre(obj.traceback)

    @admin.action(permissions=["redrive"], description="Redrive selected dead letters")
    def redrive_selected(self, request: HttpRequest, queryset: QuerySet[DeadLetter]) -> None:
        selected = queryset.count()
        created = operations.redrive(queryset)
        self.message_user(
            request, f"{created} dead letter{pluralize(created)} redriven as new jobs."
        )
        if created < selected:
            left = selected - created
            self.message_user(
                request,
                f"{left} dead letter{pluralize(left)} left in place: a live job of the same"
                " kind holds the idempotency key.",
                messages.WARNING,
            )

    @object_action(
        label="Redrive",
        description="Enqueue this dead letter again as a fresh job, then delete it",
        methods=("POST",),
        button_type="form",
    )
    def redrive(self, request: HttpRequest, obj: Any) -> HttpResponse:
        """The detail page's button, as django-object-actions renders it; its requests go to
        :meth:`redrive_view`. Only the library's list-wide route still ends here."""
        raise Http404("Redrive is a button of one dead letter's page.")

    def redrive_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The Redrive button: redrive one dead letter, read from the queue's database.

        Answers 405 unless POST (the admin site checks its CSRF token: 403 without), 403
        unless the user may do what the bulk action needs (view the list: Django's view or
        change permission on dead letters; and ``django_jobq.redrive_deadletter``), 404 for
        an id that is not a dead letter. Redirects to the list naming the new job, or back
        to the dead letter if a live job holds its idempotency key.
        """
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not (
            self.has_view_or_change_permission(request) and self.has_redrive_permission(request)
        ):
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
                f" {obj.idempotency_key!r}.",
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
