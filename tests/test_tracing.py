"""OpenTelemetry: a request that enqueues a job and the job's attempts are one trace
(django_jobq.tracing, docs/tracing.md).

The SDK's in-memory exporter collects the spans. A process has one global tracer provider,
set at most once: :func:`exporter` sets it the first time (or joins one set before), so every
later test of the session runs with an SDK configured too, which only makes their jobs store
a trace context. What happens without the SDK, or without OpenTelemetry at all, runs in
subprocesses.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.test import Client
from django.urls import path
from opentelemetry import trace
from opentelemetry.instrumentation.django import DjangoInstrumentor
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from django_jobq import enqueue, enqueue_many, job, registry
from django_jobq.backoff import FixedBackoff
from django_jobq.context import JobContext
from django_jobq.models import DeadLetter, Job
from django_jobq.operations import redrive_one
from django_jobq.scheduling import ScheduledJob, enqueue_due
from django_jobq.timetables import Timetable
from django_jobq.worker import Worker
from tests.conftest import REPO_ROOT, database_url
from tests.factories import JobFactory
from tests.testapp import tasks
from tests.testapp.jobs import raise_unprintable, record
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)

_PROCESSOR: list[InMemorySpanExporter] = []  # the one exporter of this process


@pytest.fixture(scope="module")
def exporter() -> Iterator[InMemorySpanExporter]:
    """The in-memory exporter on the process's SDK tracer provider (set here once)."""
    if not _PROCESSOR:
        provider = trace.get_tracer_provider()
        if not isinstance(provider, TracerProvider):
            provider = TracerProvider()
            trace.set_tracer_provider(provider)
        found = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(found))
        _PROCESSOR.append(found)
    yield _PROCESSOR[0]


@pytest.fixture
def spans(exporter: InMemorySpanExporter) -> Iterator[InMemorySpanExporter]:
    """The exporter, emptied before and after the test."""
    exporter.clear()
    yield exporter
    exporter.clear()


@pytest.fixture
def instrumented() -> Iterator[None]:
    """Django's OpenTelemetry instrumentation (its middleware starts each request's span)."""
    DjangoInstrumentor().instrument()
    yield
    DjangoInstrumentor().uninstrument()


def named(spans: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [span for span in spans.get_finished_spans() if span.name == name]


def only(spans: InMemorySpanExporter, name: str) -> ReadableSpan:
    (span,) = named(spans, name)
    return span


def attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def stored_parent(trace_context: object) -> tuple[int, int]:
    """The trace id and span id of a stored carrier's ``traceparent``."""
    assert isinstance(trace_context, dict) and set(trace_context) == {"traceparent"}
    _, trace_id, span_id, _ = trace_context["traceparent"].split("-")
    return int(trace_id, 16), int(span_id, 16)


def run_burst() -> None:
    Worker(burst=True, poll_interval=0.05).run()


# -- the views of the request tests ----------------------------------------------------------


def signup(request: HttpRequest) -> HttpResponse:
    with transaction.atomic():
        saved = record.enqueue("from a request")
    return HttpResponse(str(saved.pk))


urlpatterns = [path("signup/", signup)]


# -- handlers registered by the tests that run them ----------------------------------------


def flaky(ctx: JobContext) -> None:
    """Fails its first attempt; the second opens a span of its own, then succeeds."""
    if ctx.attempt == 1:
        raise RuntimeError("partner timed out")
    with trace.get_tracer("tests").start_as_current_span("charge card"):
        Effect.objects.create(label=f"charged on attempt {ctx.attempt}")


def doomed() -> None:
    raise ValueError("card declined")


@pytest.fixture
def handlers() -> Iterator[None]:
    with registry.isolated():
        job(name="tests.tracing.flaky", takes_context=True, backoff=FixedBackoff(0))(flaky)
        job(name="tests.tracing.doomed", max_attempts=1)(doomed)
        yield


# -- one trace -------------------------------------------------------------------------------


@pytest.mark.urls("tests.test_tracing")
def test_a_request_and_the_job_it_enqueued_are_one_trace(spans, instrumented):
    response = Client().get("/signup/")
    assert response.status_code == 200
    job_id = response.content.decode()
    run_burst()
    assert Effect.objects.get().label == "from a request"

    (request,) = [s for s in spans.get_finished_spans() if s.kind is SpanKind.SERVER]
    send = only(spans, "send tests.testapp.jobs.record")
    process = only(spans, "process tests.testapp.jobs.record")
    trace_ids = {span.context.trace_id for span in (request, send, process)}
    assert trace_ids == {request.context.trace_id}
    assert parent_id(send) == request.context.span_id
    assert parent_id(process) == send.context.span_id
    assert send.kind is SpanKind.PRODUCER
    assert attributes(send) == {
        "messaging.system": "jobq",
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": "default",
        "messaging.message.id": job_id,
        "jobq.kind": "tests.testapp.jobs.record",
    }
    assert process.kind is SpanKind.CONSUMER
    assert attributes(process) == {
        "messaging.system": "jobq",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": "default",
        "messaging.message.id": job_id,
        "jobq.kind": "tests.testapp.jobs.record",
        "jobq.attempt": 1,
        "jobq.outcome": "succeeded",
    }
    assert process.status.status_code is StatusCode.UNSET


def test_a_retry_adds_a_second_attempt_span_the_first_recording_the_exception(spans, handlers):
    with trace.get_tracer("tests").start_as_current_span("request"):
        enqueue("tests.tracing.flaky")
    run_burst()
    assert Effect.objects.get().label == "charged on attempt 2"

    request = only(spans, "request")
    send = only(spans, "send tests.tracing.flaky")
    first, second = sorted(
        named(spans, "process tests.tracing.flaky"),
        key=lambda span: int(attributes(span)["jobq.attempt"]),
    )
    for attempt in (first, second):
        assert attempt.context.trace_id == request.context.trace_id
        assert parent_id(attempt) == send.context.span_id  # each attempt: the enqueue's child
    assert attributes(first)["jobq.outcome"] == "retried"
    assert first.status.status_code is StatusCode.UNSET  # the job goes on: no error
    (event,) = first.events
    assert event.name == "exception"
    assert dict(event.attributes or {})["exception.type"] == "RuntimeError"
    assert dict(event.attributes or {})["exception.message"] == "partner timed out"
    assert attributes(second)["jobq.attempt"] == 2
    assert attributes(second)["jobq.outcome"] == "succeeded"
    assert not second.events
    # The handler saw its attempt's span as current: its own span is that span's child.
    assert parent_id(only(spans, "charge card")) == second.context.span_id


def test_an_exception_that_cannot_be_printed_is_recorded_and_retried(spans):
    raise_unprintable.enqueue()
    run_burst()
    job = Job.objects.get()
    assert (job.attempts, job.last_error) == (1, "Unprintable (its message could not be formatted)")
    attempt = only(spans, "process tests.testapp.jobs.raise_unprintable")
    assert attributes(attempt)["jobq.outcome"] == "retried"
    (event,) = attempt.events
    assert dict(event.attributes or {})["exception.type"] == "tests.testapp.jobs.Unprintable"
    assert "raise Unprintable" in str(dict(event.attributes or {})["exception.stacktrace"])


def test_a_dead_letter_marks_the_span_an_error_and_its_redrive_joins_the_trace(spans, handlers):
    with trace.get_tracer("tests").start_as_current_span("request"):
        saved = enqueue("tests.tracing.doomed")
    run_burst()
    dead = DeadLetter.objects.get()
    assert dead.trace_context == saved.trace_context  # kept by the dead letter

    attempt = only(spans, "process tests.tracing.doomed")
    assert attributes(attempt)["jobq.outcome"] == "dead_lettered"
    assert attributes(attempt)["jobq.dead_letter.reason"] == "max attempts exceeded"
    assert attempt.status.status_code is StatusCode.ERROR
    assert attempt.status.description == "max attempts exceeded"
    (event,) = attempt.events
    assert dict(event.attributes or {})["exception.type"] == "ValueError"

    new_id = redrive_one(dead.pk)
    assert new_id is not None
    assert Job.objects.get(pk=new_id).trace_context == saved.trace_context
    spans.clear()
    run_burst()
    again = only(spans, "process tests.tracing.doomed")
    assert again.context.trace_id == attempt.context.trace_id
    assert parent_id(again) == parent_id(attempt)


def test_a_job_refused_at_its_claim_gets_an_error_span(spans):
    with trace.get_tracer("tests").start_as_current_span("request") as request:
        saved = record.using(max_attempts=1).enqueue("never")
    Job.objects.filter(pk=saved.pk).update(attempts=1)  # no attempt left
    run_burst()
    assert not Effect.objects.exists()
    refused = only(spans, "process tests.testapp.jobs.record")
    assert refused.context.trace_id == request.get_span_context().trace_id
    assert attributes(refused)["jobq.outcome"] == "dead_lettered"
    assert refused.status.status_code is StatusCode.ERROR
    assert DeadLetter.objects.get().trace_context == saved.trace_context


def test_a_django_task_carries_the_trace_context(spans):
    with trace.get_tracer("tests").start_as_current_span("request") as request:
        result = tasks.add.enqueue(2, 3)
    stored = Job.objects.get().trace_context
    assert stored_parent(stored)[0] == request.get_span_context().trace_id
    run_burst()
    assert tasks.add.get_result(result.id).return_value == 5
    send = only(spans, "send tests.testapp.tasks.add")
    attempt = only(spans, "process tests.testapp.tasks.add")
    assert parent_id(send) == request.get_span_context().span_id
    assert parent_id(attempt) == send.context.span_id
    assert attributes(attempt)["jobq.outcome"] == "succeeded"


def test_a_batch_is_one_send_span_whose_context_every_job_stores(spans):
    with trace.get_tracer("tests").start_as_current_span("request"):
        saved = enqueue_many(
            [record.prepare(f"n{n}") for n in range(3)]
            + [{"kind": "some.kind", "payload": {}, "queue": "other"}]
        )
    send = only(spans, "send")  # several kinds: no kind in the name
    assert attributes(send)["messaging.batch.message_count"] == 4
    assert "messaging.destination.name" not in attributes(send)  # several queues
    parent = (send.context.trace_id, send.context.span_id)
    rows = Job.objects.order_by("id")
    assert [stored_parent(row.trace_context) for row in rows] == [parent] * 4
    assert [job.trace_context for job in saved] == [row.trace_context for row in rows]


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_an_insert_deferred_to_another_databases_commit_keeps_the_enqueues_context(spans):
    tracer = trace.get_tracer("tests")
    with tracer.start_as_current_span("request") as request, transaction.atomic(using="other"):
        placeholder = record.enqueue("deferred")
        assert placeholder.pk is None
    send = only(spans, "send tests.testapp.jobs.record")
    assert parent_id(send) == request.get_span_context().span_id
    assert "messaging.message.id" not in attributes(send)  # unknown until the commit
    stored = Job.objects.get().trace_context
    assert stored_parent(stored) == (send.context.trace_id, send.context.span_id)


def test_a_schedules_tick_starts_a_trace_of_its_own(spans):
    """The scheduler runs outside any span: a tick's send span is a root, its attempt the
    send span's child."""
    every_minute = ScheduledJob(
        name="every",
        kind="tests.testapp.jobs.record",
        timetable=Timetable("* * * * *", "UTC"),
        payload={"label": "tick"},
        catch_up=1,
        origin="test",
    )
    floors: dict[str, datetime] = {}
    enqueue_due([every_minute], now=datetime(2026, 5, 1, 12, 0, 30, tzinfo=UTC), floors=floors)
    enqueue_due([every_minute], now=datetime(2026, 5, 1, 12, 1, 0, tzinfo=UTC), floors=floors)
    run_burst()
    assert Effect.objects.get().label == "tick"
    send = only(spans, "send tests.testapp.jobs.record")
    assert send.parent is None
    assert parent_id(only(spans, "process tests.testapp.jobs.record")) == send.context.span_id


@pytest.mark.parametrize("stored", ["not a carrier", [1, 2], {"traceparent": 42}, {}])
def test_a_bad_stored_context_starts_a_new_trace_and_the_job_runs(spans, stored):
    JobFactory(kind="tests.testapp.jobs.record", payload={"label": "ran"}, trace_context=stored)
    run_burst()
    assert Effect.objects.get().label == "ran"
    attempt = only(spans, "process tests.testapp.jobs.record")
    assert attempt.parent is None
    assert attributes(attempt)["jobq.outcome"] == "succeeded"


# -- the documented set-up ---------------------------------------------------------------------

DOCS = (REPO_ROOT / "docs" / "tracing.md").read_text()
MANAGE = REPO_ROOT / "testproject" / "manage.py"


def exported_spans(output: str) -> list[dict[str, Any]]:
    """The spans ``ConsoleSpanExporter`` printed (JSON objects, one after another)."""
    decoder = json.JSONDecoder()
    found, position = [], 0
    while (start := output.find("{", position)) != -1:
        span, position = decoder.raw_decode(output, start)
        found.append(span)
    return found


def test_the_documented_set_up_exports_the_spans_of_forked_workers(spans, tmp_path):
    """The docs' SDK set-up in a project's settings; ``--processes 2`` forks the workers,
    which exit without atexit handlers: their spans are exported all the same."""
    (snippet,) = re.findall(r"```python\n(.*?)```", DOCS, re.DOTALL)
    (tmp_path / "traced_settings.py").write_text(f"from tests.settings import *\n{snippet}")
    with trace.get_tracer("tests").start_as_current_span("request"):
        record.enqueue("exported")
    send = only(spans, "send tests.testapp.jobs.record")
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "DJANGO_SETTINGS_MODULE": "traced_settings",
        "PYTHONPATH": os.pathsep.join(
            [str(tmp_path), str(REPO_ROOT), str(REPO_ROOT / "testproject")]
        ),
    }
    result = subprocess.run(
        [sys.executable, str(MANAGE), "jobq_worker", "--processes", "2", "--burst"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert Effect.objects.get().label == "exported"
    (attempt,) = [
        span
        for span in exported_spans(result.stdout)
        if span["name"] == "process tests.testapp.jobs.record"
    ]
    assert attempt["context"]["trace_id"] == f"0x{send.context.trace_id:032x}"
    assert attempt["parent_id"] == f"0x{send.context.span_id:016x}"
    assert attempt["kind"] == "SpanKind.CONSUMER"
    assert attempt["resource"]["attributes"]["service.name"] == "shop"


# -- the cost without OpenTelemetry, or without its SDK ----------------------------------------

_SCRIPT = """
import json, sys

tried = []


class HideOpenTelemetry:
    '''Stands for an environment without the opentelemetry packages; records each try.'''

    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            tried.append(name)
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None


if sys.argv[1] == "hidden":
    sys.meta_path.insert(0, HideOpenTelemetry())

import django

django.setup()
from django.db import transaction

from django_jobq import enqueue_many, tracing
from django_jobq.models import Job
from django_jobq.worker import Worker
from tests.testapp.jobs import raise_unprintable, record
from tests.testapp.models import Effect

at_setup = list(tried)
with transaction.atomic():
    saved = record.enqueue("one")
    enqueue_many([record.prepare("two")])
stored = [job.trace_context for job in Job.objects.all()]
stats = Worker(burst=True, poll_interval=0.05).run()
print(json.dumps({
    "enabled": tracing.ENABLED,
    "tried_at_setup": at_setup,
    "tried_since": tried[len(at_setup):],
    "loaded": sorted(name for name in sys.modules if name.startswith("opentelemetry")),
    "stored": stored,
    "returned": saved.trace_context,
    "succeeded": stats.outcome_counts.succeeded,
    "effects": sorted(Effect.objects.values_list("label", flat=True)),
}))
"""


def run_script(mode: str) -> dict[str, object]:
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "testproject")]),
    }
    result = subprocess.run(
        [sys.executable, "-c", _SCRIPT, mode],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    found: dict[str, object] = json.loads(result.stdout.splitlines()[-1])
    return found


def test_without_opentelemetry_enqueue_and_the_worker_never_try_to_import_it():
    found = run_script("hidden")
    assert found["enabled"] is False
    # One try, at django_jobq.tracing's import; none by enqueue or the worker's run.
    assert found["tried_at_setup"] == ["opentelemetry"]
    assert found["tried_since"] == []
    assert found["loaded"] == []
    assert (found["stored"], found["returned"]) == ([None, None], None)
    assert (found["succeeded"], found["effects"]) == (2, ["one", "two"])


def test_with_opentelemetry_but_no_sdk_nothing_is_stored():
    """The API's tracer without an SDK makes spans with no valid context: an empty carrier
    would only take room, so the job stores none, and its attempt runs as ever."""
    found = run_script("installed")
    assert found["enabled"] is True
    assert (found["stored"], found["returned"]) == ([None, None], None)
    assert (found["succeeded"], found["effects"]) == (2, ["one", "two"])


def test_the_tracing_module_is_the_only_one_that_imports_opentelemetry():
    package = REPO_ROOT / "django_jobq"
    importers = set()
    for source in package.rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            if any(name.split(".")[0] == "opentelemetry" for name in names):
                importers.add(str(source.relative_to(package)))
    assert importers == {"tracing.py"}
