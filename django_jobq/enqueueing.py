"""Enqueue: validate a job, then insert it in the caller's transaction.

Usage::

    from django_jobq import enqueue, enqueue_many

    with transaction.atomic():
        order = Order.objects.create(...)
        enqueue("shop.jobs.generate_invoice", {"order_id": order.pk})   # -> Job
    # the job exists only if the order does

Transactions: when the queue's database (``JOBQ['DATABASE']``) is in an ``atomic`` block,
the job row is written in that transaction: rolled back with it, invisible to workers until
it commits. When it is not, but another database is (the caller's data lives elsewhere), the
insert is deferred with ``transaction.on_commit`` on that database; a crash between that
commit and the insert loses the job (see docs/concepts.md, "Two databases").
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypedDict, Unpack

from django.conf import settings as django_settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connections, transaction
from django.utils import timezone

from . import registry, sql
from .conf import KIND_NAME_RE, QUEUE_NAME_RE, get_settings
from .models import Job

_INT_RANGE = (-(2**31), 2**31 - 1)
_MAX_KEY_LENGTH = 200


class EnqueueOptions(TypedDict, total=False):
    """The options every enqueue accepts (see :func:`enqueue` for their meaning)."""

    queue: str
    priority: int
    run_at: datetime
    delay: timedelta | float
    idempotency_key: str
    max_attempts: int
    visibility_timeout: timedelta | float


@dataclass(frozen=True)
class PreparedJob:
    """A validated job, ready to insert. Make one with :func:`prepare_job` or
    ``handler.prepare(...)``; insert with :func:`enqueue_many`.

    Exactly one of ``run_at`` and ``delay_seconds`` is set (``delay_seconds`` 0 means now).
    """

    kind: str
    payload_json: str
    queue: str
    priority: int
    run_at: datetime | None
    delay_seconds: float | None
    max_attempts: int
    visibility_timeout_seconds: float
    idempotency_key: str | None


def _seconds(name: str, value: timedelta | float) -> float:
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    raise TypeError(f"{name} must be a timedelta or a number of seconds, not {value!r}.")


def validate_options(
    *,
    kind: str,
    queue: str | None = None,
    priority: int | None = None,
    max_attempts: int | None = None,
    visibility_timeout: timedelta | float | None = None,
    idempotency_key: str | None = None,
) -> None:
    """Check enqueue options; ``None`` means "not given" and always passes.

    Raises:
        ValueError: a name, range or length is invalid.
        TypeError: a value has the wrong type.
    """
    if not isinstance(kind, str) or not KIND_NAME_RE.match(kind):
        raise ValueError(f"invalid job kind {kind!r}: expected {KIND_NAME_RE.pattern}.")
    if queue is not None and (not isinstance(queue, str) or not QUEUE_NAME_RE.match(queue)):
        raise ValueError(f"invalid queue name {queue!r}: expected {QUEUE_NAME_RE.pattern}.")
    if priority is not None:
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise TypeError(f"priority must be an int, not {priority!r}.")
        if not _INT_RANGE[0] <= priority <= _INT_RANGE[1]:
            raise ValueError(f"priority {priority} is outside the 32-bit integer range.")
    if max_attempts is not None:
        if not isinstance(max_attempts, int) or isinstance(max_attempts, bool):
            raise TypeError(f"max_attempts must be an int, not {max_attempts!r}.")
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, not {max_attempts}.")
    if visibility_timeout is not None and _seconds("visibility_timeout", visibility_timeout) <= 0:
        raise ValueError(f"visibility_timeout must be positive, not {visibility_timeout!r}.")
    if idempotency_key is not None and (
        not isinstance(idempotency_key, str) or not 0 < len(idempotency_key) <= _MAX_KEY_LENGTH
    ):
        raise ValueError(
            f"idempotency_key must be a non-empty str of at most {_MAX_KEY_LENGTH} characters."
        )


def _find_unencodable(value: Any, path: str) -> tuple[str, str] | None:
    """Return ``(path, problem)`` for the first part of ``value`` JSON cannot hold."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{path}[{key!r}]", f"key {key!r} (type {type(key).__name__}) is not a str"
            found = _find_unencodable(item, f"{path}[{key!r}]")
            if found:
                return found
        return None
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = _find_unencodable(item, f"{path}[{index}]")
            if found:
                return found
        return None
    if isinstance(value, str) and "\x00" in value:
        return path, "a string containing NUL (\\x00), which PostgreSQL's jsonb rejects"
    try:
        json.dumps(value, cls=DjangoJSONEncoder, allow_nan=False)
    except (TypeError, ValueError):
        return path, f"{value!r} (type {type(value).__name__}) is not JSON-serialisable"
    return None


def encode_payload(payload: Any) -> str:
    """Encode a payload as JSON text with :class:`DjangoJSONEncoder`.

    Dates, times, decimals and UUIDs become strings (the handler receives strings).

    Raises:
        TypeError: ``payload`` is not a dict, or some value cannot be JSON; the message names
            the offending key, e.g. ``payload['user']``.
    """
    if not isinstance(payload, Mapping):
        raise TypeError(f"payload must be a dict of JSON values, not {type(payload).__name__}.")
    found = _find_unencodable(payload, "payload")
    if found:
        path, problem = found
        raise TypeError(
            f"{path}: {problem}. Job payloads are JSON; pass ids or plain values instead."
        )
    return json.dumps(payload, cls=DjangoJSONEncoder, allow_nan=False)


def _aware(run_at: datetime) -> datetime:
    if not isinstance(run_at, datetime):
        raise TypeError(f"run_at must be a datetime, not {run_at!r}.")
    if timezone.is_naive(run_at):
        if django_settings.USE_TZ:
            raise ValueError("run_at must be timezone-aware (USE_TZ is True).")
        return timezone.make_aware(run_at)
    return run_at


def prepare_job(
    kind: str,
    payload: Mapping[str, Any] | None = None,
    *,
    queue: str | None = None,
    priority: int | None = None,
    run_at: datetime | None = None,
    delay: timedelta | float | None = None,
    idempotency_key: str | None = None,
    max_attempts: int | None = None,
    visibility_timeout: timedelta | float | None = None,
) -> PreparedJob:
    """Validate a job and fill in its defaults; see :func:`enqueue` for the arguments.

    Defaults come from the kind's ``@job(...)`` when it is registered in this process,
    then from the ``JOBQ`` setting. Nothing is written.
    """
    config = get_settings()
    definition = registry.get(kind) if isinstance(kind, str) else None
    payload = {} if payload is None else payload
    payload_json = encode_payload(payload)
    if definition is not None:
        definition.payload_for((), payload)  # raises TypeError if the handler cannot take it
    validate_options(
        kind=kind,
        queue=queue,
        priority=priority,
        max_attempts=max_attempts,
        visibility_timeout=visibility_timeout,
        idempotency_key=idempotency_key,
    )
    if run_at is not None and delay is not None:
        raise ValueError("give run_at or delay, not both.")
    delay_seconds = None if run_at is not None else _seconds("delay", delay or 0)
    if delay_seconds is not None and delay_seconds < 0:
        raise ValueError(f"delay must not be negative, not {delay!r}.")
    if visibility_timeout is None and definition is not None:
        visibility_timeout = definition.visibility_timeout
    return PreparedJob(
        kind=kind,
        payload_json=payload_json,
        queue=queue or (definition and definition.queue) or config.DEFAULT_QUEUE,
        priority=priority if priority is not None else (definition.priority if definition else 0),
        run_at=_aware(run_at) if run_at is not None else None,
        delay_seconds=delay_seconds,
        max_attempts=max_attempts
        or (definition and definition.max_attempts)
        or config.MAX_ATTEMPTS,
        visibility_timeout_seconds=_seconds(
            "visibility_timeout", visibility_timeout or config.VISIBILITY_TIMEOUT
        ),
        idempotency_key=idempotency_key,
    )


def enqueue(
    kind: str, payload: Mapping[str, Any] | None = None, **options: Unpack[EnqueueOptions]
) -> Job:
    """Enqueue one job of ``kind`` and return it as a :class:`~django_jobq.models.Job`.

    Args:
        kind: the handler's registered name. A kind not registered in this process is
            accepted (the worker may run other code); a worker without it dead-letters the
            job with reason "unknown kind".
        payload: keyword arguments for the handler; JSON via ``DjangoJSONEncoder``.
        queue: defaults to the kind's queue, then ``JOBQ['DEFAULT_QUEUE']``.
        priority: higher runs first; defaults to the kind's, then 0.
        run_at: an aware datetime before which the job is not claimed.
        delay: seconds (or a timedelta) from now, on the database's clock.
        idempotency_key: if a live (ready or running) job of this kind has this key, that
            job is returned and nothing is inserted.
        max_attempts: attempts before the job becomes a dead letter.
        visibility_timeout: lease length in seconds (or a timedelta).

    Returns:
        The saved job. If the insert is deferred to another database's commit (see the
        module docs), the job's ``id`` is ``None`` until that commit.

    Raises:
        TypeError: a payload value cannot be JSON (the message names it), or the payload
            does not fit the registered handler's signature.
        ValueError: invalid kind or queue name, negative delay, ``run_at`` with ``delay``,
            ``max_attempts < 1``, non-positive visibility timeout.
    """
    return enqueue_many([prepare_job(kind, payload, **options)])[0]


def enqueue_many(jobs: Iterable[PreparedJob | Mapping[str, Any]]) -> list[Job]:
    """Enqueue many jobs with one INSERT statement; return them in input order.

    Each item is a :class:`PreparedJob` (from ``handler.prepare(...)``) or a dict of
    :func:`enqueue`'s arguments (``{"kind": ..., "payload": ..., "priority": ...}``).
    Every item is validated before anything is written. Transactions and idempotency keys
    behave as for :func:`enqueue`.

    Raises:
        TypeError, ValueError: as :func:`enqueue`, for the first invalid item.
    """
    prepared = [job if isinstance(job, PreparedJob) else prepare_job(**job) for job in jobs]
    if not prepared:
        return []
    alias = get_settings().DATABASE
    if connections[alias].in_atomic_block:
        return _insert(alias, prepared)
    caller_alias = next(
        (c.alias for c in connections.all(initialized_only=True) if c.in_atomic_block), None
    )
    if caller_alias is None:
        return _insert(alias, prepared)
    placeholders = [_unsaved_job(job) for job in prepared]

    def insert_after_commit() -> None:
        for placeholder, saved in zip(placeholders, _insert(alias, prepared), strict=True):
            placeholder.__dict__.update(saved.__dict__)

    transaction.on_commit(insert_after_commit, using=caller_alias)
    return placeholders


def _unsaved_job(job: PreparedJob) -> Job:
    """The :class:`Job` a prepared job becomes; ``run_at`` stays unset for a delay (the
    database computes it)."""
    instance = Job(
        queue=job.queue,
        kind=job.kind,
        payload=json.loads(job.payload_json),
        priority=job.priority,
        status=Job.Status.READY,
        attempts=0,
        max_attempts=job.max_attempts,
        visibility_timeout=timedelta(seconds=job.visibility_timeout_seconds),
        idempotency_key=job.idempotency_key,
    )
    if job.run_at is not None:
        instance.run_at = job.run_at
    return instance


def _insert(alias: str, jobs: Sequence[PreparedJob]) -> list[Job]:
    """Run ``INSERT_JOBS``; return a saved :class:`Job` per input, existing ones included."""
    # One row per idempotency key: the statement may not touch the same row twice.
    first_of_key: dict[tuple[str, str], int] = {}
    unique: list[PreparedJob] = []
    position: list[int] = []
    for job in jobs:
        if job.idempotency_key is None:
            position.append(len(unique))
            unique.append(job)
            continue
        key = (job.kind, job.idempotency_key)
        if key not in first_of_key:
            first_of_key[key] = len(unique)
            unique.append(job)
        position.append(first_of_key[key])
    columns: dict[str, list[Any]] = {
        "queue": [job.queue for job in unique],
        "kind": [job.kind for job in unique],
        "payload": [job.payload_json for job in unique],
        "priority": [job.priority for job in unique],
        "run_at": [job.run_at for job in unique],
        "delay_seconds": [job.delay_seconds for job in unique],
        "max_attempts": [job.max_attempts for job in unique],
        "visibility_timeout_seconds": [job.visibility_timeout_seconds for job in unique],
        "idempotency_key": [job.idempotency_key for job in unique],
    }
    connection = connections[alias]
    with connection.cursor() as cursor:
        cursor.execute(sql.INSERT_JOBS, columns)
        names = [column.name for column in cursor.description][:-1]  # drop "inserted"
        saved = [_job_from_row(alias, names, row[:-1]) for row in cursor.fetchall()]
    return [saved[index] for index in position]


def _job_from_row(alias: str, names: Sequence[str], row: Sequence[Any]) -> Job:
    """Build a :class:`Job` from a ``RETURNING *`` row, converting values as the ORM does."""
    connection = connections[alias]
    values = []
    for name, value in zip(names, row, strict=True):
        field = Job._meta.get_field(name)
        from_db_value = getattr(field, "from_db_value", None)
        values.append(from_db_value(value, None, connection) if from_db_value else value)
    return Job.from_db(alias, list(names), values)
