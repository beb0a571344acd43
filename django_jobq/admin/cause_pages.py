"""The admin's "Dead letters by cause" page and its redrive and delete confirmations.

``/admin/django_jobq/deadletter/causes/`` (URL name ``admin:django_jobq_deadletter_causes``,
linked from the dead-letter list) shows the causes (:mod:`django_jobq.causes`), the biggest
first, :data:`PER_PAGE` a page (``?p=2``): per cause its dead letters (linked to the list
filtered to it, ``?fingerprint=...``), the fingerprint, its kinds, the first and last
``died_at``, and its newest dead letter as an example (linked). One statement reads the
page. Needs what the dead-letter list needs: staff, and Django's view (or change)
permission on dead letters.

``causes/redrive/?fingerprint=...`` and ``causes/delete/?fingerprint=...`` answer a GET with
a confirmation page (it changes nothing) and act on its POST, a form with Django's CSRF
token: redrive every dead letter of the cause (``django_jobq.redrive_deadletter`` besides
the view permission, as the list's redrive action), or delete them (Django's
``delete_deadletter``, as the list's delete action). Without those permissions both answer
403 and change nothing; other methods 405. Both then return to the causes page, saying what
they did.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol
from urllib.parse import urlencode

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.template.defaultfilters import pluralize
from django.template.response import TemplateResponse
from django.urls import reverse

from .. import causes
from ..models import DeadLetter

if TYPE_CHECKING:
    from django.contrib.admin import AdminSite

#: Causes a page shows.
PER_PAGE = 50


class DeadLetterAdmin(Protocol):
    """What these pages use of the dead letters' model admin
    (:class:`django_jobq.admin.DeadLetterAdmin`, which routes their URLs to them): Django's
    permissions and messages, plus its redrive permission and report."""

    admin_site: AdminSite

    def has_view_or_change_permission(
        self, request: HttpRequest, obj: DeadLetter | None = None
    ) -> bool: ...
    def has_delete_permission(
        self, request: HttpRequest, obj: DeadLetter | None = None
    ) -> bool: ...
    def has_redrive_permission(self, request: HttpRequest) -> bool: ...
    def report_redrive(self, request: HttpRequest, selected: int, created: int) -> None: ...
    def message_user(self, request: HttpRequest, message: str, level: int = ...) -> None: ...


@dataclass(frozen=True)
class CauseRow:
    """One cause on the page, with the URLs of its list, example and confirmations."""

    cause: causes.Cause
    list_url: str
    example_url: str
    redrive_url: str
    delete_url: str


def _url(model_admin: DeadLetterAdmin, name: str, *args: object) -> str:
    return reverse(f"{model_admin.admin_site.name}:django_jobq_deadletter_{name}", args=args)


def _with_fingerprint(url: str, fingerprint: str) -> str:
    return f"{url}?{urlencode({'fingerprint': fingerprint})}"


def list_url(model_admin: DeadLetterAdmin, fingerprint: str) -> str:
    """The dead-letter list filtered to the cause ``fingerprint``."""
    return _with_fingerprint(_url(model_admin, "changelist"), fingerprint)


def _page_number(request: HttpRequest) -> int:
    try:
        number = int(request.GET.get("p", "1"))
    except ValueError:
        number = 0
    if number < 1:
        raise Http404("The page number must be a whole number, at least 1.")
    return number


def causes_view(request: HttpRequest, model_admin: DeadLetterAdmin) -> TemplateResponse:
    """Render one page of the causes (``?p=N``, from 1; 404 past the last page).

    Raises:
        PermissionDenied: the user may not view dead letters.
        Http404: no such page.
    """
    if not model_admin.has_view_or_change_permission(request):
        raise PermissionDenied
    number = _page_number(request)
    found = causes.page(limit=PER_PAGE, offset=(number - 1) * PER_PAGE)
    pages = max(1, -(-found.cause_count // PER_PAGE))
    if number > pages:
        raise Http404(f"There are {pages} pages of causes.")
    redrive_url, delete_url = _url(model_admin, "redrive_cause"), _url(model_admin, "delete_cause")
    rows = [
        CauseRow(
            cause=cause,
            list_url=list_url(model_admin, cause.fingerprint),
            example_url=_url(model_admin, "change", cause.example_id),
            redrive_url=_with_fingerprint(redrive_url, cause.fingerprint),
            delete_url=_with_fingerprint(delete_url, cause.fingerprint),
        )
        for cause in found.causes
    ]
    here = _url(model_admin, "causes")
    context = {
        **model_admin.admin_site.each_context(request),
        "title": "Dead letters by cause",
        "opts": DeadLetter._meta,
        "rows": rows,
        "page": found,
        "number": number,
        "pages": pages,
        "first_rank": (number - 1) * PER_PAGE + 1,
        "previous_url": f"{here}?p={number - 1}" if number > 1 else None,
        "next_url": f"{here}?p={number + 1}" if number < pages else None,
        "may_redrive": model_admin.has_redrive_permission(request),
        "may_delete": model_admin.has_delete_permission(request),
    }
    return TemplateResponse(request, "admin/django_jobq/deadletter/causes.html", context)


@dataclass(frozen=True)
class CauseAction:
    """What a confirmation does to a cause's dead letters, and who may."""

    name: str  # "redrive" or "delete": the button's words, and the URL's
    allowed: Callable[[DeadLetterAdmin, HttpRequest], bool]
    act: Callable[[DeadLetterAdmin, HttpRequest, str], None]  # act, then say what it did


def _redrive(model_admin: DeadLetterAdmin, request: HttpRequest, fingerprint: str) -> None:
    outcome = causes.redrive(fingerprint)
    model_admin.report_redrive(request, outcome.selected, outcome.created)


def _delete(model_admin: DeadLetterAdmin, request: HttpRequest, fingerprint: str) -> None:
    deleted = causes.delete(fingerprint)
    model_admin.message_user(request, f"{deleted} dead letter{pluralize(deleted)} deleted.")


REDRIVE = CauseAction(
    "redrive", lambda model_admin, request: model_admin.has_redrive_permission(request), _redrive
)
DELETE = CauseAction(
    "delete", lambda model_admin, request: model_admin.has_delete_permission(request), _delete
)


def cause_action_view(
    request: HttpRequest, model_admin: DeadLetterAdmin, action: CauseAction
) -> HttpResponse:
    """GET: the confirmation page of ``action`` on the cause ``?fingerprint=``; POST (its
    form, field ``fingerprint``): do it, then go back to the causes page. A cause with no
    dead letter left goes back at once, saying so. 400 without a fingerprint.

    Raises:
        PermissionDenied: the user may not view dead letters, or not do ``action``.
    """
    if request.method not in ("GET", "POST"):
        return HttpResponseNotAllowed(["GET", "POST"])
    if not (
        model_admin.has_view_or_change_permission(request) and action.allowed(model_admin, request)
    ):
        raise PermissionDenied
    fingerprint = (request.POST if request.method == "POST" else request.GET).get("fingerprint")
    if fingerprint is None:
        return HttpResponseBadRequest("Which cause? The fingerprint parameter is missing.")
    back = HttpResponseRedirect(_url(model_admin, "causes"))
    cause = causes.get(fingerprint)
    if cause is None:
        model_admin.message_user(
            request,
            f"No dead letter has the cause {fingerprint!r} (any more): nothing to {action.name}.",
            messages.WARNING,
        )
        return back
    if request.method == "POST":
        action.act(model_admin, request, fingerprint)
        return back
    context = {
        **model_admin.admin_site.each_context(request),
        "title": "Are you sure?",
        "opts": DeadLetter._meta,
        "action": action.name,
        "cause": cause,
        "list_url": list_url(model_admin, fingerprint),
        "example_url": _url(model_admin, "change", cause.example_id),
        "causes_url": _url(model_admin, "causes"),
    }
    return TemplateResponse(
        request, "admin/django_jobq/deadletter/cause_confirmation.html", context
    )
