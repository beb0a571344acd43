"""The admin's Queues and Kind limits pages: flow control for operators
(:mod:`django_jobq.flow_control`).

**Queues** (``/admin/django_jobq/queue/``) lists every known queue
(:func:`django_jobq.flow_control.queue_states`), whether or not it has a ``jobq_queue`` row
yet: its pause (since, until), its effective concurrency and rate limits with their source
(setting or operator), and its ready and running jobs (counted up to
:data:`~django_jobq.admin.dashboard.COUNT_CAP`). A GET writes nothing: a queue gets its row
when an operator first pauses or limits it. Its actions, Django's admin actions (POST, with
Django's CSRF protection, offered only to users with Django's change permission on queues,
``django_jobq.change_queue``):

- "Pause the selected queues" (until resumed);
- "Pause the selected queues until...": a confirmation page (as Django's delete
  confirmation) asking for an end, a time or a number of minutes, then pausing them;
- "Resume the selected queues".

Each runs one statement for all the selected queues. The selection is read by name from
the POST (Django's action machinery filters the queryset of rows, which a queue without a
row is not in), and only known queues are acted on.

Each queue's change page edits its run-time limits (empty: no override, the setting's
applies), validated as the API validates them (the rate grammar of :mod:`django_jobq.rates`)
and saved through :func:`~django_jobq.flow_control.set_queue_limits`, which wakes the
queue's workers; it opens for any known queue, row or not, and writes only on save.

**Kind limits** (``/admin/django_jobq/kindlimit/``) does the same for kinds: every kind with
a limit (``@job`` or an operator's), editable, and "Add" for a limit on another kind
(``add_kindlimit``), saved through :func:`~django_jobq.flow_control.set_kind_limits`. No
row is deleted here: emptying both limits removes the override.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import ValidationError
from django.db.models import Model, QuerySet
from django.forms import ModelForm
from django.http import HttpRequest, HttpResponse
from django.template.defaultfilters import pluralize
from django.template.response import TemplateResponse
from django.utils import timezone

from .. import flow_control, registry, stats
from ..conf import get_settings
from ..exceptions import UnknownQueue
from ..models import KindLimit, Queue
from .dashboard import COUNT_CAP, counted

if TYPE_CHECKING:  # ModelAdmin is generic only in django-stubs
    QueueAdminBase = admin.ModelAdmin[Queue]
    KindLimitAdminBase = admin.ModelAdmin[KindLimit]
else:
    QueueAdminBase = KindLimitAdminBase = admin.ModelAdmin

#: The longest pause the "until" confirmation takes, in minutes (10 years).
MAX_PAUSE_MINUTES = 10 * 365 * 24 * 60


def _limit_text(value: object, source: flow_control.LimitSource) -> str:
    return "-" if value is None else f"{value} ({source})"


class LimitsForm(ModelForm):  # type: ignore[type-arg]
    """The run-time limits of a queue or a kind, checked as :mod:`django_jobq.flow_control`
    checks them (the error names the problem; an empty field: no override)."""

    def clean_kind(self) -> str:
        try:
            return flow_control.check_kind_name(self.cleaned_data["kind"])
        except (TypeError, ValueError) as exc:
            raise ValidationError(str(exc)) from None

    def clean_concurrency_limit(self) -> int | None:
        try:
            return flow_control.check_concurrency_limit(self.cleaned_data["concurrency_limit"])
        except (TypeError, ValueError) as exc:
            raise ValidationError(str(exc).removeprefix("concurrency_limit ")) from None

    def clean_rate_limit(self) -> str | None:
        value = (self.cleaned_data["rate_limit"] or "").strip() or None
        try:
            return flow_control.check_rate_limit(value)
        except (TypeError, ValueError) as exc:
            raise ValidationError(str(exc).removeprefix("rate_limit: ")) from None


class PauseUntilForm(forms.Form):
    """The end of a pause, one of: a time (in the current time zone), or minutes from now."""

    until = forms.DateTimeField(
        required=False,
        label="Until",
        help_text="Resume by itself at this time (the server's time zone).",
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
    )
    minutes = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=MAX_PAUSE_MINUTES,
        label="Or for minutes",
        help_text="Resume by itself this many minutes from now.",
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        given = [data.get("until") is not None, data.get("minutes") is not None]
        if sum(given) != 1:
            raise ValidationError("Give either a time or a number of minutes.")
        return data

    def end(self) -> datetime | timedelta:
        """The end as :func:`~django_jobq.flow_control.pause_queues` takes it."""
        until = self.cleaned_data.get("until")
        return until if until is not None else timedelta(minutes=self.cleaned_data["minutes"])


class _FlowControlAdmin:
    """What the Queues and Kind limits pages share: a list of :meth:`rows` (known names,
    with or without a row), a change page for each of them that writes only on save, saved
    through the API (:meth:`save_limits`), and no delete."""

    form: ClassVar[type[ModelForm]] = LimitsForm  # type: ignore[type-arg]
    list_per_page: ClassVar[int] = 10_000  # one page: the rows listed are not the queryset's
    # Else Django hides the actions while the table has no row (a queue needs none).
    show_full_result_count: ClassVar[bool] = False

    def rows(self, request: HttpRequest) -> list[Any]:
        """The list's entries (:class:`~django_jobq.flow_control.QueueControl` or
        :class:`~django_jobq.flow_control.KindControl`)."""
        raise NotImplementedError

    def new_object(self, name: str) -> Model | None:
        """An unsaved row for ``name`` if it is a known name without a row, else ``None``."""
        raise NotImplementedError

    def save_limits(self, obj: Any) -> None:
        """Write ``obj``'s limits through the API."""
        raise NotImplementedError

    def get_object(
        self, request: HttpRequest, object_id: str, from_field: str | None = None
    ) -> Any:
        obj = super().get_object(request, object_id, from_field)  # type: ignore[misc]
        return obj if obj is not None else self.new_object(object_id)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        """The rows, with only the columns the change page edits: the pauses are read through
        the API, which copes with a time no datetime holds (a row written by hand)."""
        queryset: QuerySet[Any] = super().get_queryset(request)  # type: ignore[misc]
        return queryset.using(get_settings().DATABASE).only("pk", "concurrency_limit", "rate_limit")

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        self.save_limits(obj)

    def delete_model(self, request: HttpRequest, obj: Any) -> None:  # pragma: no cover
        raise NotImplementedError("flow control rows are not deleted from the admin")

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """Django's list, whose table shows :meth:`rows` instead of the rows of the table."""
        rows = self.rows(request)
        context = {**(extra_context or {}), "flow_rows": rows, "flow_count": len(rows)}
        response: HttpResponse = super().changelist_view(request, context)  # type: ignore[misc]
        return response


@admin.register(Queue)
class QueueAdmin(_FlowControlAdmin, QueueAdminBase):
    change_list_template = "admin/django_jobq/queue/change_list.html"
    fields = (
        "name",
        "pause_shown",
        "concurrency_limit",
        "concurrency_limit_setting",
        "rate_limit",
        "rate_limit_setting",
    )
    readonly_fields = ("name", "pause_shown", "concurrency_limit_setting", "rate_limit_setting")
    actions = ("pause_selected", "pause_selected_until", "resume_selected")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # queues are named by the code and the jobs; pause or limit them

    def rows(self, request: HttpRequest) -> list[Any]:
        depths = {state.queue: state for state in stats.queue_states(count_cap=COUNT_CAP)}
        return [
            {
                "control": control,
                "paused": stats.paused_cell(control),
                "concurrency_limit": _limit_text(
                    control.concurrency_limit, control.concurrency_limit_source
                ),
                "rate_limit": _limit_text(control.rate_limit, control.rate_limit_source),
                "ready": counted(depths[control.name].ready) if control.name in depths else "0",
                "running": str(depths[control.name].running) if control.name in depths else "0",
            }
            for control in flow_control.queue_states()
        ]

    def new_object(self, name: str) -> Queue | None:
        return Queue(name=name) if name in flow_control.known_queues() else None

    def save_limits(self, obj: Queue) -> None:
        flow_control.set_queue_limits(
            obj.name, concurrency_limit=obj.concurrency_limit, rate_limit=obj.rate_limit
        )

    def _control(self, obj: Queue) -> flow_control.QueueControl | None:
        if not hasattr(obj, "_flow_control"):
            obj._flow_control = flow_control.queue_state(obj.name)  # type: ignore[attr-defined]
        control: flow_control.QueueControl | None = obj._flow_control  # type: ignore[attr-defined]
        return control

    @admin.display(description="paused")
    def pause_shown(self, obj: Queue) -> str:
        control = self._control(obj)
        if control is None or not control.paused:
            return "No (the list's actions pause it)"
        return stats.pause_text(control).removeprefix("the queue is ").capitalize()

    @admin.display(description="JOBQ['QUEUES'] concurrency limit")
    def concurrency_limit_setting(self, obj: Queue) -> str:
        control = self._control(obj)
        value = control.setting_concurrency_limit if control else None
        return "-" if value is None else f"{value} (applies when the field above is empty)"

    @admin.display(description="JOBQ['QUEUES'] rate limit")
    def rate_limit_setting(self, obj: Queue) -> str:
        control = self._control(obj)
        value = control.setting_rate_limit if control else None
        return "-" if value is None else f"{value} (applies when the field above is empty)"

    # -- actions ---------------------------------------------------------------------------

    @staticmethod
    def _selected(request: HttpRequest, queryset: QuerySet[Queue]) -> list[str]:
        """The selected queues by name (a queue without a row is in the POST, not in the
        queryset): the known ones among them."""
        names = set(request.POST.getlist(helpers.ACTION_CHECKBOX_NAME))
        if request.POST.get("select_across") == "1":
            names.update(queryset.values_list("name", flat=True))
        known = flow_control.known_queues()
        return [name for name in known if name in names]

    def _pause(self, request: HttpRequest, names: list[str], until: Any = None) -> None:
        if not names:
            self.message_user(request, "No known queue selected.", messages.WARNING)
            return
        try:
            pauses = flow_control.pause_queues(names, until=until)
        except (UnknownQueue, ValueError) as exc:
            self.message_user(request, f"Nothing paused: {exc}", messages.ERROR)
            return
        end = (
            "until resumed"
            if until is None
            else f"until {stats.local_time(pauses[0].paused_until)}"
        )
        self.message_user(
            request,
            f"{len(pauses)} queue{pluralize(len(pauses))} paused {end}: "
            f"{', '.join(p.queue for p in pauses)}. Running jobs finish; no worker claims "
            f"their jobs from its next claim.",
        )

    @admin.action(permissions=["change"], description="Pause the selected queues")
    def pause_selected(self, request: HttpRequest, queryset: QuerySet[Queue]) -> None:
        self._pause(request, self._selected(request, queryset))

    @admin.action(permissions=["change"], description="Pause the selected queues until…")
    def pause_selected_until(
        self, request: HttpRequest, queryset: QuerySet[Queue]
    ) -> TemplateResponse | None:
        """The confirmation page asking for the end (GET-free: it is the answer to the
        action's POST); its own POST (``post=yes``) pauses them."""
        names = self._selected(request, queryset)
        if not names:
            self.message_user(request, "No known queue selected.", messages.WARNING)
            return None
        form = PauseUntilForm(request.POST if request.POST.get("post") else None)
        if form.is_bound and form.is_valid():
            self._pause(request, names, form.end())
            return None
        context = {
            **self.admin_site.each_context(request),
            "title": "Pause the selected queues until…",
            "opts": self.model._meta,
            "queues": names,
            "form": form,
            "action": "pause_selected_until",
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "now": timezone.localtime(),
        }
        return TemplateResponse(request, "admin/django_jobq/queue/pause_until.html", context)

    @admin.action(permissions=["change"], description="Resume the selected queues")
    def resume_selected(self, request: HttpRequest, queryset: QuerySet[Queue]) -> None:
        names = self._selected(request, queryset)
        resumed = flow_control.resume_queues(names)
        message = f"{len(resumed)} queue{pluralize(len(resumed))} resumed"
        message += f": {', '.join(resumed)}." if resumed else "."
        not_paused = sorted(set(names) - set(resumed))
        if not_paused:
            message += f" Not paused: {', '.join(not_paused)}."
        self.message_user(request, message, messages.SUCCESS if resumed else messages.WARNING)


@admin.register(KindLimit)
class KindLimitAdmin(_FlowControlAdmin, KindLimitAdminBase):
    change_list_template = "admin/django_jobq/kindlimit/change_list.html"

    fields = ("kind", "job_limits", "concurrency_limit", "rate_limit")

    def get_readonly_fields(
        self, request: HttpRequest, obj: KindLimit | None = None
    ) -> tuple[str, ...]:
        """The kind is typed on "Add" only."""
        return ("job_limits",) if obj is None else ("kind", "job_limits")

    def rows(self, request: HttpRequest) -> list[Any]:
        return [
            {
                "control": control,
                "concurrency_limit": _limit_text(
                    control.concurrency_limit, control.concurrency_limit_source
                ),
                "rate_limit": _limit_text(control.rate_limit, control.rate_limit_source),
            }
            for control in flow_control.kind_limits()
        ]

    def new_object(self, name: str) -> KindLimit | None:
        definition = registry.get(name)
        return KindLimit(kind=name) if definition is not None and definition.kind == name else None

    def save_limits(self, obj: KindLimit) -> None:
        flow_control.set_kind_limits(
            obj.kind, concurrency_limit=obj.concurrency_limit, rate_limit=obj.rate_limit
        )

    @admin.display(description="@job's limits")
    def job_limits(self, obj: KindLimit) -> str:
        definition = registry.get(obj.kind) if obj.kind else None
        if definition is None or definition.kind != obj.kind:
            return "- (no @job registers this kind in this process)"
        return (
            f"concurrency {definition.concurrency_limit or '-'}, rate "
            f"{definition.rate_limit or '-'} (apply when the fields below are empty)"
        )
