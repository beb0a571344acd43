"""OpenTelemetry tracing, when ``opentelemetry-api`` is installed (the ``opentelemetry``
extra); nothing at all when it is not.

The only module of the package that imports OpenTelemetry. It does so once, here, at import:
:data:`ENABLED` says whether that worked, and every call site tests it before calling
anything below (a constant check; no import is tried again, no function called), then
:func:`configured` (is there a tracer provider to record spans?)::

    if tracing.ENABLED and tracing.configured():
        with tracing.sending(prepared) as sending:
            ...  # insert the jobs with sending.trace_context

What is recorded (docs/tracing.md):

- an enqueue (:func:`sending`): a PRODUCER span ``send <kind>`` around the insert, whose
  context is stored with each job it inserts (``jobq_job.trace_context``: the W3C
  ``traceparent``/``tracestate`` carrier of the configured propagator, as JSON), never in the
  payload. Nothing is stored when that span has no valid context: an empty carrier would
  only take room;
- an attempt (:func:`processing`): a CONSUMER span ``process <kind>``, a child of the stored
  context, current while the handler runs (so the handler's own spans nest under it), ended
  once the attempt's outcome is decided (``jobq.outcome``).

The attribute names are OpenTelemetry's messaging semantic conventions
(``messaging.system``, ``messaging.operation.type``, ``messaging.destination.name``,
``messaging.message.id``) plus ``jobq.*`` ones for what only a job queue has.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

try:
    from opentelemetry import propagate, trace
    from opentelemetry.trace import (
        NoOpTracerProvider,
        ProxyTracerProvider,
        SpanKind,
        Status,
        StatusCode,
    )
except ImportError:  # the extra is not installed: the call sites test ENABLED
    ENABLED = False
else:
    ENABLED = True

#: ``messaging.system`` of every span.
SYSTEM = "jobq"
#: The tracer's instrumentation scope name.
SCOPE = "django_jobq"


class Destined(Protocol):
    """What an enqueue's span reads of each job it inserts (a ``PreparedJob``)."""

    @property
    def queue(self) -> str: ...
    @property
    def kind(self) -> str: ...


class Saved(Protocol):
    """What an enqueue's span reads of each job inserted (a ``Job``)."""

    @property
    def pk(self) -> Any: ...


class Claimed(Protocol):
    """What an attempt's span reads of its job (a ``ClaimedJob``)."""

    @property
    def id(self) -> int: ...
    @property
    def queue(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def attempt(self) -> int: ...
    @property
    def trace_context(self) -> str | None: ...


def configured() -> bool:
    """Whether the project has set a tracer provider (an SDK's, or whatever
    ``opentelemetry-instrument`` sets): only then is there anything to record. With the API
    alone (installed, often as another package's dependency, but no SDK set up) every span
    is a no-op, yet opening and closing one per attempt still cost a busy worker about 15% of
    its burn-down rate (bench/results/20261201-214500-issue20-ab.md); so the call sites
    open none, and store no context. Asked at each call (cheap: a global read and an
    ``isinstance``), so a provider set after start-up is used from then on. Only call when
    :data:`ENABLED`."""
    return not isinstance(trace.get_tracer_provider(), (ProxyTracerProvider, NoOpTracerProvider))


def _one(values: Collection[str]) -> str | None:
    """The value all of ``values`` share, else ``None``."""
    distinct = set(values)
    return next(iter(distinct)) if len(distinct) == 1 else None


class Sending:
    """An enqueue's open PRODUCER span (:func:`sending`).

    Attributes:
        trace_context: the carrier to store with each job (``dict`` of str to str, e.g.
            ``{"traceparent": "00-…-01"}``), or ``None`` when the span has no valid context.
    """

    def __init__(self, span: trace.Span) -> None:
        self._span = span
        self.trace_context: dict[str, str] | None = None
        if span.get_span_context().is_valid:
            carrier: dict[str, str] = {}
            propagate.inject(carrier)
            self.trace_context = carrier or None

    def inserted(self, jobs: Sequence[Saved]) -> None:
        """Record the id of the one job inserted (``messaging.message.id``); nothing for a
        batch, or for an insert deferred to a commit (its id is ``None`` until then)."""
        if len(jobs) == 1 and jobs[0].pk is not None:
            self._span.set_attribute("messaging.message.id", str(jobs[0].pk))


@contextmanager
def sending(jobs: Collection[Destined]) -> Iterator[Sending]:
    """A PRODUCER span ``send <kind>`` (``send`` for a batch of several kinds), current
    while ``jobs`` are inserted. Its attributes: ``messaging.destination.name`` (the queue,
    when all share one), ``jobq.kind`` (likewise), ``messaging.batch.message_count`` (more
    than one job). An exception raised inside is recorded on it and re-raised. Only call
    when :data:`ENABLED`."""
    kind = _one([job.kind for job in jobs])
    queue = _one([job.queue for job in jobs])
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
    }
    if queue is not None:
        attributes["messaging.destination.name"] = queue
    if kind is not None:
        attributes["jobq.kind"] = kind
    if len(jobs) > 1:
        attributes["messaging.batch.message_count"] = len(jobs)
    name = "send" if kind is None else f"send {kind}"
    tracer = trace.get_tracer(SCOPE)
    with tracer.start_as_current_span(name, kind=SpanKind.PRODUCER, attributes=attributes) as span:
        yield Sending(span)


def _carrier(text: str | None) -> dict[str, str]:
    """The carrier a claim read (``jobq_job.trace_context`` as text); ``{}`` for none or for
    anything that is not a JSON object of strings (a row another producer wrote): a bad
    carrier starts a new trace, it never fails the attempt."""
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except (RecursionError, ValueError):
        return {}
    if not isinstance(value, dict):
        return {}
    return {key: item for key, item in value.items() if isinstance(item, str)}


class Attempt:
    """An attempt's open CONSUMER span (:func:`processing`)."""

    def __init__(self, span: trace.Span) -> None:
        self._span = span

    def failed(self, exc: BaseException, error: str, traceback: str) -> None:
        """Record the exception the handler raised: an ``exception`` event, as
        ``Span.record_exception`` makes, from ``exc``'s description as the worker stores it
        (``error``: ``"Type: message"``, ``traceback``). Never raises: ``record_exception``
        would call the exception's ``__str__``, which is user code."""
        cls = type(exc)
        name = cls.__qualname__
        if cls.__module__ and cls.__module__ != "builtins":
            name = f"{cls.__module__}.{name}"
        prefix = f"{cls.__name__}: "
        self._span.add_event(
            "exception",
            {
                "exception.type": name,
                "exception.message": error.removeprefix(prefix),
                "exception.stacktrace": traceback,
            },
        )

    def decided(self, outcome: str, reason: str = "") -> None:
        """Record the attempt's outcome (``jobq.outcome``: ``succeeded``, ``retried``,
        ``dead_lettered``, ``lease_lost``). A dead letter sets the span's status to ERROR
        with ``reason`` (the dead letter's) as its description; any other outcome leaves it
        unset."""
        self._span.set_attribute("jobq.outcome", outcome)
        if outcome == "dead_lettered":
            reason = str(reason)  # a plain str, not a Reason (a str enum)
            self._span.set_attribute("jobq.dead_letter.reason", reason)
            self._span.set_status(Status(StatusCode.ERROR, reason))


@contextmanager
def processing(job: Claimed) -> Iterator[Attempt]:
    """A CONSUMER span ``process <kind>`` for one attempt of ``job``, a child of the context
    stored at its enqueue (a root span when none was), current inside the block. Its
    attributes: ``messaging.destination.name`` (queue), ``messaging.message.id`` (job id),
    ``jobq.kind``, ``jobq.attempt``; :meth:`Attempt.decided` adds ``jobq.outcome``. Only
    call when :data:`ENABLED`."""
    parent = propagate.extract(_carrier(job.trace_context))
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": job.queue,
        "messaging.message.id": str(job.id),
        "jobq.kind": job.kind,
        "jobq.attempt": job.attempt,
    }
    tracer = trace.get_tracer(SCOPE)
    with tracer.start_as_current_span(
        f"process {job.kind}",
        context=parent,
        kind=SpanKind.CONSUMER,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield Attempt(span)


#: Seconds :func:`flush` waits for the exporter at most.
FLUSH_TIMEOUT = 5.0


def flush() -> None:
    """Export the spans the SDK's processors still hold (a ``BatchSpanProcessor`` holds up to
    a few seconds' worth), waiting :data:`FLUSH_TIMEOUT` seconds at most; nothing without
    an SDK. For a process that exits without running ``atexit`` handlers, where the SDK
    would flush them itself: a forked worker (``jobq_worker --processes N``). Only call when
    :data:`ENABLED`."""
    force_flush = getattr(trace.get_tracer_provider(), "force_flush", None)
    if force_flush is not None:
        force_flush(int(FLUSH_TIMEOUT * 1000))
