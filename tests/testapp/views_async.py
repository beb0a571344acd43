"""Async views that enqueue, for tests/test_async_enqueue.py (URLs in
``tests/testapp/urls_async.py``). Each answers ``POST`` with ``label`` with 201
``{"job_id": ...}`` (the test client does not check CSRF tokens).

- ``record/``: ``await record.aenqueue(...)``, the plain call: in the caller's transaction
  when the sync thread has one open, otherwise committed at once;
- ``record-then-fail/``: enqueues, then raises: the job stays (no transaction wraps an
  async view);
- ``record-non-atomic/``: the same view marked ``non_atomic_requests``, which a project
  with ``ATOMIC_REQUESTS`` needs for any async view;
- ``effect-and-job/``: the recipe for writes that commit or roll back together: one sync
  function under ``atomic()``, awaited through ``sync_to_async``; with ``fail`` it raises
  after both writes and answers 409, and neither is kept.
"""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.db import transaction
from django.http import HttpRequest, JsonResponse

from django_jobq import aenqueue

from .jobs import record
from .models import Effect


class Refused(Exception):
    """The business rule of ``effect-and-job/`` refused the request after writing."""


async def record_job(request: HttpRequest) -> JsonResponse:
    job = await record.aenqueue(label=request.POST["label"])
    return JsonResponse({"job_id": job.pk}, status=201)


async def record_then_fail(request: HttpRequest) -> JsonResponse:
    await aenqueue("tests.testapp.jobs.record", {"label": request.POST["label"]})
    raise RuntimeError("the view failed after enqueueing")


@transaction.non_atomic_requests
async def record_non_atomic(request: HttpRequest) -> JsonResponse:
    return await record_then_fail(request)


@sync_to_async  # thread_sensitive=True, the default: Django's sync thread
def write_effect_and_job(label: str, fail: bool) -> int | None:
    """Both writes in one transaction: the Effect row and its job commit together."""
    with transaction.atomic():
        Effect.objects.create(label=label)
        job = record.enqueue(label=label)
        if fail:
            raise Refused(label)
    return job.pk


async def effect_and_job(request: HttpRequest) -> JsonResponse:
    try:
        job_id = await write_effect_and_job(request.POST["label"], "fail" in request.POST)
    except Refused:
        return JsonResponse({"error": "refused"}, status=409)
    return JsonResponse({"job_id": job_id}, status=201)
