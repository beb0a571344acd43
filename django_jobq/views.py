"""The metrics view: the queue database's gauges in Prometheus's text format.

::

    # urls.py
    urlpatterns = [..., path("jobq/", include("django_jobq.urls"))]   # GET /jobq/metrics

Who may read it: a logged-in, active staff user (handy in a browser), or a scraper sending
``Authorization: Bearer <JOBQ['METRICS_TOKEN']>``. Anyone else gets 401 (no or wrong
credentials) or 403 (logged in, not staff). The gauges are those of
:class:`django_jobq.metrics.collector.DatabaseCollector`, cached ``JOBQ['METRICS_CACHE_TIMEOUT']``
seconds per process; the per-process counters are served by the workers
(``jobq_worker --metrics-port``), not here.
"""

from __future__ import annotations

import hmac

from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .conf import get_settings
from .metrics.collector import database_registry

_REGISTRY = database_registry()


def _bearer_token(request: HttpRequest) -> str | None:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


def _access(request: HttpRequest) -> int:
    """The HTTP status the request earns: 200, 401 (no or wrong credentials) or 403."""
    given = _bearer_token(request)
    if given is not None:
        expected = get_settings().METRICS_TOKEN
        valid = expected is not None and hmac.compare_digest(given.encode(), expected.encode())
        return 200 if valid else 401
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return 401
    # Staff who may see the jobs and the dead letters (the dashboard's permissions).
    allowed = user.is_active and user.is_staff
    allowed = allowed and user.has_perms(["django_jobq.view_job", "django_jobq.view_deadletter"])
    return 200 if allowed else 403


@csrf_exempt  # read-only (GET and HEAD only): other methods get 405, not a CSRF 403
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """The database gauges in the text exposition format; 401 or 403 as above."""
    status = _access(request)
    if status == 401:
        response = HttpResponse("Authentication required.\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="jobq metrics"'
        return response
    if status == 403:
        return HttpResponse("Staff only.\n", status=403, content_type="text/plain")
    response = HttpResponse(generate_latest(_REGISTRY), content_type=CONTENT_TYPE_LATEST)
    response["Cache-Control"] = "no-store"
    return response
