"""Enqueue: validate a job, then insert it in the caller's transaction.

Usage::

    from django_jobq import enqueue, enqueue_many

    with transaction.atomic():
        order = Order.objects.create(...)
        enqueue("shop.jobs.generate_invoice", {"order_id": order.pk})   # -> Job
    # the job exists only if the order does

Transactions: when the queue's database (``JOBQ['DATABASE']``) is in an ``atomic`` block,
the job row is written in that transaction: rolled back with it, invisible to workers until
it commits, when the workers are also woken (``NOTIFY``, one per queue and transaction).
When it is not, but another database is (the caller's data lives elsewhere), the insert is
deferred with ``transaction.on_commit`` on that database; a crash between that commit and
the insert loses the job (see docs/concepts.md, "Two databases").

Async code (async views, async signal receivers) awaits :func:`aenqueue` and
:func:`aenqueue_many` (``await handler.aenqueue(...)``): validated at once, in the caller's
thread, then inserted by :func:`enqueue_many` in Django's sync thread, as Django's own async
ORM methods do. Django's transactions are sync-only, so the rules above apply to that
thread: the job joins a transaction only when that thread has one open, and otherwise
commits on its own, like ``await Model.objects.acreate()`` (docs/async.md, "Enqueueing from
async code" shows how to make a job commit or roll back with other writes).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypedDict, Unpack

from asgiref.sync import sync_to_async
from django.conf import settings as django_settings
from django.db import connections, transaction
from django.utils import timezone
from psycopg.rows import class_row

from . import db, lanes, registry, sql, tracing
from .conf import get_settings
from .exceptions import UnknownKind
from .models import Job
from .validation import encode_payload, seconds_option, validate_options


class EnqueueOptions(TypedDict, total=False):
    """The options every enqueue accepts (see :func:`enqueue` for their meaning)."""

    queue: str
    priority: int
    run_at: datetime
    delay: timedelta | float
    expires_at: datetime
    idempotency_key: str
    max_attempts: int
    visibility_timeout: timedelta | float
    ordering_key: str
    allow_unregistered: bool


_OPTION_NAMES = frozenset(EnqueueOptions.__annotations__)

#: Called with the jobs each insert wrote, right after writing them (in the caller's
#: transaction, or in the deferred insert at the caller's commit): ``None`` everywhere but in
#: a test in eager mode, which sets it to run them at once (:mod:`django_jobq.testing`).
#: Otherwise the enqueue path pays one attribute check, and imports nothing of the testing
#: package.
after_insert: Callable[[Sequence[Job]], None] | None = None


@dataclass(frozen=True, slots=True)
class PreparedJob:
    """A validated job, ready to insert. Make one with :func:`prepare_job` or
    ``handler.prepare(...)``; insert with :func:`enqueue_many`.

    Exactly one of ``run_at`` and ``delay_seconds`` is set (``delay_seconds`` 0 means now);
    at most one of ``expires_at`` and ``expires_after_seconds``. The ``*_seconds`` fields are
    counted from the insert, on the database clock.
    """

    kind: str
    payload_json: str
    queue: str
    priority: int
    run_at: datetime | None
    delay_seconds: float | None
    expires_at: datetime | None
    expires_after_seconds: float | None
    max_attempts: int
    visibility_timeout_seconds: float
    idempotency_key: str | None
    ordering_key: str | None = None


def _aware(name: str, moment: datetime) -> datetime:
    if not isinstance(moment, datetime):
        raise TypeError(f"{name} must be a datetime, not {moment!r}.")
    if timezone.is_naive(moment):
        if django_settings.USE_TZ:
            raise ValueError(f"{name} must be timezone-aware (USE_TZ is True).")
        # What the ORM does without USE_TZ: the wall time in TIME_ZONE (the session's).
        return timezone.make_aware(moment, timezone.get_default_timezone())
    return moment


@dataclass(frozen=True)
class _KindDefaults:
    """What a job of one kind gets for the options its enqueue does not give: from the
    kind's ``@job(...)`` when it is registered in this process, then from ``JOBQ``."""

    definition: registry.KindDefinition | None
    queue: str
    priority: int
    max_attempts: int
    visibility_timeout_seconds: float
    expires_after_seconds: float | None


#: ``_KindDefaults`` by (kind, registered definition), for one resolved setting: rebuilt
#: when the setting is replaced (``get_settings`` returns another object) or grows large.
_defaults_cache: tuple[object, dict[tuple[str, object], _KindDefaults]] = (None, {})
_DEFAULTS_CACHE_SIZE = 10_000


def _kind_defaults(kind: str, allow_unregistered: bool) -> _KindDefaults:
    """The defaults of ``kind`` (validated once per kind and setting): one dict lookup for
    a kind seen before.

    Raises:
        ValueError: ``kind`` is not a valid kind name.
        UnknownKind: ``kind`` is not registered in this process, and neither
            ``allow_unregistered`` nor ``JOBQ['ENQUEUE_UNREGISTERED_KINDS']`` allows that.
    """
    global _defaults_cache
    if not isinstance(kind, str):
        validate_options(kind=kind)  # raises ValueError naming it
    config = get_settings()
    definition = registry.get(kind)
    cached_config, table = _defaults_cache
    if cached_config is not config or len(table) >= _DEFAULTS_CACHE_SIZE:
        table = {}
        _defaults_cache = (config, table)
    if definition is None and not (allow_unregistered or config.ENQUEUE_UNREGISTERED_KINDS):
        validate_options(kind=kind)  # an invalid name is a ValueError, as ever
        raise UnknownKind(kind, registry.closest(kind))
    found = table.get((kind, definition))
    if found is not None:
        return found
    validate_options(kind=kind)

    def pick(from_definition: Any, fallback: Any) -> Any:
        return fallback if from_definition is None else from_definition

    defaults = _KindDefaults(
        definition=definition,
        queue=pick(definition and definition.queue, config.DEFAULT_QUEUE),
        priority=pick(definition and definition.priority, 0),
        max_attempts=pick(definition and definition.max_attempts, config.MAX_ATTEMPTS),
        visibility_timeout_seconds=seconds_option(
            "visibility_timeout",
            pick(definition and definition.visibility_timeout, config.VISIBILITY_TIMEOUT),
            minimum=0.001,
        ),
        expires_after_seconds=definition.expires_after if definition else None,
    )
    table[(kind, definition)] = defaults
    return defaults


def prepare_job(
    kind: str, payload: Mapping[str, Any] | None = None, **options: Unpack[EnqueueOptions]
) -> PreparedJob:
    """Validate a job and fill in its defaults; see :func:`enqueue` for the arguments.

    Defaults come from the kind's ``@job(...)`` when it is registered in this process,
    then from the ``JOBQ`` setting. Nothing is written.
    """
    unknown = options.keys() - _OPTION_NAMES
    if unknown:
        raise TypeError(f"unknown enqueue options: {', '.join(sorted(unknown))}.")
    allow_unregistered = options.pop("allow_unregistered", False)
    if not isinstance(allow_unregistered, bool):
        raise TypeError(f"allow_unregistered must be True or False, not {allow_unregistered!r}.")
    defaults = _kind_defaults(kind, allow_unregistered)
    payload = {} if payload is None else payload
    payload_json = encode_payload(payload)
    if defaults.definition is not None:
        defaults.definition.check_payload(payload)  # raises TypeError if it cannot take it
    queue, priority = options.get("queue"), options.get("priority")
    max_attempts, idempotency_key = options.get("max_attempts"), options.get("idempotency_key")
    visibility_timeout = options.get("visibility_timeout")
    ordering_key = options.get("ordering_key")
    run_at, delay, expires_at = (
        options.get("run_at"),
        options.get("delay"),
        options.get("expires_at"),
    )
    if options:  # the kind was validated with its defaults
        validate_options(
            kind=kind,
            queue=queue,
            priority=priority,
            max_attempts=max_attempts,
            visibility_timeout=visibility_timeout,
            idempotency_key=idempotency_key,
            ordering_key=ordering_key,
        )
    if run_at is not None and delay is not None:
        raise ValueError("give run_at or delay, not both.")
    return PreparedJob(
        # An alias resolves to its definition, whose own kind is stored (see registry).
        kind=kind if defaults.definition is None else defaults.definition.kind,
        payload_json=payload_json,
        queue=defaults.queue if queue is None else queue,
        priority=defaults.priority if priority is None else priority,
        run_at=None if run_at is None else _aware("run_at", run_at),
        delay_seconds=None
        if run_at is not None
        else seconds_option("delay", delay or 0, minimum=0),
        expires_at=None if expires_at is None else _aware("expires_at", expires_at),
        expires_after_seconds=defaults.expires_after_seconds if expires_at is None else None,
        max_attempts=defaults.max_attempts if max_attempts is None else max_attempts,
        visibility_timeout_seconds=defaults.visibility_timeout_seconds
        if visibility_timeout is None
        else seconds_option("visibility_timeout", visibility_timeout, minimum=0.001),
        idempotency_key=idempotency_key,
        ordering_key=ordering_key,
    )


def enqueue(
    kind: str, payload: Mapping[str, Any] | None = None, **options: Unpack[EnqueueOptions]
) -> Job:
    """Enqueue one job of ``kind`` and return it as a :class:`~django_jobq.models.Job`.

    Args:
        kind: the handler's registered name. A kind not registered in this process
            raises :class:`~django_jobq.exceptions.UnknownKind` (a typo fails here, not in
            a worker), unless ``allow_unregistered`` or
            ``JOBQ['ENQUEUE_UNREGISTERED_KINDS']`` accepts it (the kind of another
            service's workers). An alias (``@job(aliases=[...])``) is accepted and the job
            stored under the handler's kind.
        payload: keyword arguments for the handler; JSON via ``DjangoJSONEncoder``.
        queue: defaults to the kind's queue, then ``JOBQ['DEFAULT_QUEUE']``.
        priority: higher runs first; defaults to the kind's, then 0.
        run_at: an aware datetime before which the job is not claimed.
        delay: seconds (or a timedelta) from now, on the database's clock.
        idempotency_key: if a live (ready or running) job of this kind has this key, that
            job is returned and nothing is inserted. The live job is read, not locked: the
            caller's open transaction never delays its heartbeat or ack (see
            docs/idempotency.md, also for REPEATABLE READ and SERIALIZABLE).
        max_attempts: attempts before the job becomes a dead letter.
        visibility_timeout: lease length in seconds (or a timedelta).
        ordering_key: the job's lane (a str of 1 to 200 characters, e.g.
            ``f"customer:{customer.pk}"``): jobs with the same key run one at a time, in
            enqueue order, across every queue and worker; other lanes are not held up. A job
            behind another of its lane is stored ``waiting`` until that one ends (its
            success, or its dead letter; a retry keeps the lane waiting). See
            docs/flow-control.md, "Ordered lanes".
        allow_unregistered: ``True`` enqueues a kind that no ``@job`` registers in this
            process (default ``False``: ``UnknownKind``).

    Returns:
        The saved job. If the insert is deferred to another database's commit (see the
        module docs), the job's ``id`` is ``None`` until that commit. Its ``payload`` is
        the JSON as sent; ``jsonb`` stores a normalised form (keys reordered, ``1e20`` as
        the integer, ``-0.0`` as ``0.0``), which is what a worker's handler receives.

    Raises:
        TypeError: a payload value cannot be JSON (the message names it), or the payload
            does not fit the registered handler's signature.
        ValueError: invalid kind or queue name, negative delay, ``run_at`` with ``delay``,
            ``max_attempts < 1``, non-positive visibility timeout, an empty or overlong
            ``ordering_key``.
        UnknownKind: ``kind`` is not registered in this process (a ``LookupError``; the
            message suggests the closest registered kind), and unregistered kinds are not
            allowed.
    """
    return enqueue_many([prepare_job(kind, payload, **options)])[0]


def enqueue_many(jobs: Iterable[PreparedJob | Mapping[str, Any]]) -> list[Job]:
    """Enqueue many jobs with one INSERT statement; return them in input order.

    Each item is a :class:`PreparedJob` (from ``handler.prepare(...)``) or a dict of
    :func:`enqueue`'s arguments (``{"kind": ..., "payload": ..., "priority": ...}``).
    Every item is validated before anything is written. Transactions and idempotency keys
    behave as for :func:`enqueue`; keyed jobs are inserted sorted by (kind, key), so two
    batches wait for each other's new keys in one order and cannot deadlock.

    Raises:
        TypeError, ValueError, UnknownKind: as :func:`enqueue`, for the first invalid item.
        RuntimeError: the live jobs of the batch's keys kept ending between the insert and
            the read (10 rounds); nothing was inserted.
    """
    return insert(_prepared(jobs))[0]


def _prepared(jobs: Iterable[PreparedJob | Mapping[str, Any]]) -> list[PreparedJob]:
    """Each item of an :func:`enqueue_many` batch validated, as a :class:`PreparedJob`.

    Raises:
        TypeError, ValueError, UnknownKind: as :func:`enqueue`, for the first invalid item.
    """
    return [job if isinstance(job, PreparedJob) else prepare_job(**job) for job in jobs]


async def aenqueue(
    kind: str, payload: Mapping[str, Any] | None = None, **options: Unpack[EnqueueOptions]
) -> Job:
    """:func:`enqueue` for async code: ``job = await aenqueue("shop.jobs.refund", {...})``.

    The job is validated before any thread hop, so the errors are :func:`enqueue`'s, raised
    by the call; then it is inserted in Django's sync thread (``sync_to_async`` with
    ``thread_sensitive=True``, as Django's async ORM methods run), by the transaction rules
    of :func:`enqueue` in that thread: inside a transaction only when that thread has one
    open (the async code runs under ``async_to_sync`` called in an ``atomic()`` block), and
    otherwise committed at once, in autocommit. Django's transactions are sync-only: to make
    the job commit or roll back with other writes, do them together in one sync function
    under ``atomic()`` and await it through ``sync_to_async`` (docs/async.md, "Enqueueing
    from async code").

    Returns:
        The saved job, as :func:`enqueue` returns it.

    Raises:
        TypeError, ValueError, UnknownKind: as :func:`enqueue`.
    """
    return (await aenqueue_many([prepare_job(kind, payload, **options)]))[0]


async def aenqueue_many(jobs: Iterable[PreparedJob | Mapping[str, Any]]) -> list[Job]:
    """:func:`enqueue_many` for async code: every item validated before any thread hop,
    then one insert in Django's sync thread (the transaction rules of :func:`aenqueue`).

    Returns:
        The saved jobs, in input order.

    Raises:
        TypeError, ValueError, UnknownKind: as :func:`enqueue`, for the first invalid item;
            nothing is inserted then.
        RuntimeError: as :func:`enqueue_many`.
    """
    prepared = _prepared(jobs)
    return await sync_to_async(enqueue_many, thread_sensitive=True)(prepared)


def insert(
    prepared: Sequence[PreparedJob], *, statement: str | None = None
) -> tuple[list[Job], str]:
    """Insert prepared jobs by the transaction rules of the module docs.

    ``statement`` is one built on ``sql.enqueue.INSERT_JOBS_TEMPLATE`` with the same
    parameters and columns (``sql.tasks.INSERT_TASK_JOBS``, for jobs without idempotency
    keys); by default ``INSERT_JOBS``, or ``INSERT_UNKEYED_JOBS`` when no job has a key.

    With OpenTelemetry (:mod:`django_jobq.tracing`), the insert runs in an enqueue span
    whose context every job stores (``Job.trace_context``), taken at this call even when
    the insert is deferred.

    Returns:
        The jobs in input order (unsaved placeholders, filled in at commit, when the insert
        is deferred), and the database alias whose commit makes them visible: run
        ``transaction.on_commit(..., using=alias)`` for anything that must follow it.
    """
    alias = get_settings().DATABASE
    if not prepared:
        return [], alias
    if not (tracing.ENABLED and tracing.configured()):
        return _insert_by_transaction(alias, prepared, statement, None)
    with tracing.sending(prepared) as sending:
        jobs, commit_alias = _insert_by_transaction(
            alias, prepared, statement, sending.trace_context
        )
        sending.inserted(jobs)
    return jobs, commit_alias


def _insert_by_transaction(
    alias: str,
    prepared: Sequence[PreparedJob],
    statement: str | None,
    trace_context: dict[str, str] | None,
) -> tuple[list[Job], str]:
    """:func:`insert`, with the trace context to store in each job (or ``None``)."""
    if connections[alias].in_atomic_block:
        return _insert(alias, prepared, statement, trace_context), alias
    caller_alias = next(
        (c.alias for c in connections.all(initialized_only=True) if c.in_atomic_block), None
    )
    if caller_alias is None:
        return _insert(alias, prepared, statement, trace_context), alias
    placeholders = [_unsaved_job(job, trace_context) for job in prepared]

    def insert_after_commit() -> None:
        saved = _insert(alias, prepared, statement, trace_context)
        for placeholder, job in zip(placeholders, saved, strict=True):
            placeholder.__dict__.update(job.__dict__)

    transaction.on_commit(insert_after_commit, using=caller_alias)
    return placeholders, caller_alias


_READY = str(Job.Status.READY.value)
_WAITING = str(Job.Status.WAITING.value)


def _unsaved_job(job: PreparedJob, trace_context: dict[str, str] | None) -> Job:
    """The :class:`Job` a prepared job becomes; ``run_at`` stays unset for a delay (the
    database computes it)."""
    instance = Job(**_prepared_values(job, trace_context))
    if job.run_at is not None:
        instance.run_at = job.run_at
    return instance


def _prepared_values(job: PreparedJob, trace_context: dict[str, str] | None) -> dict[str, Any]:
    """A new job's field values that the prepared job and its enqueue's trace context
    decide (by attribute name), of the types the ORM reads (a str, not a str subclass or an
    enum; an int, not an IntEnum)."""
    return {
        "queue": str(job.queue),
        "kind": str(job.kind),
        "payload": json.loads(job.payload_json),
        "priority": int(job.priority),
        "status": _READY,
        "ordering_key": None if job.ordering_key is None else str(job.ordering_key),
        "abort_requested_at": None,
        "attempts": 0,
        "max_attempts": int(job.max_attempts),
        "visibility_timeout": timedelta(seconds=job.visibility_timeout_seconds),
        "idempotency_key": None if job.idempotency_key is None else str(job.idempotency_key),
        "worker_id": "",
        "last_error": "",
        "lease_deadline": None,
        "started_at": None,
        "trace_context": trace_context,
    }


#: ``Job``'s fields in model order, as :meth:`Model.from_db` takes its values.
_JOB_FIELDS = [field.attname for field in Job._meta.concrete_fields]


@dataclass(frozen=True, slots=True)
class _Inserted:
    """A row of ``sql.enqueue.INSERT_JOBS`` and its forms: what the database chose for a new
    job (its id and times, read in binary: aware datetimes in the session's time zone); the
    keyed form also names the job by ``kind`` and ``idempotency_key``."""

    id: int
    run_at: datetime
    created_at: datetime
    expires_at: datetime | None
    status: str
    kind: str | None = None
    idempotency_key: str | None = None


def _saved_job(
    alias: str, job: PreparedJob, trace_context: dict[str, str] | None, row: _Inserted
) -> Job:
    """The :class:`Job` that ``INSERT_JOBS`` made of ``job``: its own values plus the
    database's from ``row`` (without ``USE_TZ`` Django's ORM returns the times' wall time in
    the session's time zone, naive, and so does this)."""
    values = _prepared_values(job, trace_context)
    values["id"] = row.id
    moments = [row.run_at, row.created_at, row.expires_at]
    if not django_settings.USE_TZ:
        moments = [moment and moment.replace(tzinfo=None) for moment in moments]
    values["run_at"], values["created_at"], values["expires_at"] = moments
    values["status"] = row.status
    return Job.from_db(alias, _JOB_FIELDS, [values[name] for name in _JOB_FIELDS])


def _insert(
    alias: str,
    jobs: Sequence[PreparedJob],
    statement: str | None,
    trace_context: dict[str, str] | None,
) -> list[Job]:
    """Run ``statement``, each new job storing ``trace_context``; return a saved
    :class:`Job` per input, existing ones included."""
    unique, position = _one_per_key(jobs)
    if any(job.idempotency_key is not None for job in unique):
        saved, inserted = _insert_keyed(
            alias, unique, statement or sql.enqueue.INSERT_JOBS, trace_context
        )
    else:
        rows = _execute(alias, statement or sql.enqueue.INSERT_UNKEYED_JOBS, unique, trace_context)
        saved = [
            _saved_job(alias, job, trace_context, row)
            for job, row in zip(unique, rows, strict=True)
        ]
        inserted = saved
    lanes.promote_at_commit(
        alias,
        (job.ordering_key for job in inserted if job.status == _WAITING and job.ordering_key),
    )
    _count_enqueued(alias, inserted)
    if after_insert is not None:
        after_insert(inserted)
    return [saved[index] for index in position]


def _count_enqueued(alias: str, inserted: Sequence[Job]) -> None:
    """Count ``inserted`` in ``jobq_jobs_enqueued_total`` at commit, in a process that has
    loaded prometheus-client: a worker, or a web process that exposes metrics
    (django-prometheus, ``prometheus_client.make_wsgi_app()``, the jobq metrics view). A
    process that has not loaded it exposes no metrics, so it counts nothing and enqueueing
    never imports prometheus-client for it (docs/operations.md, "Metrics")."""
    if "prometheus_client" in sys.modules:
        from .metrics import instruments

        instruments.count_enqueued(alias, [(job.queue, job.kind) for job in inserted])


def _one_per_key(jobs: Sequence[PreparedJob]) -> tuple[list[PreparedJob], list[int]]:
    """The jobs with each (kind, idempotency key) once (one statement may not insert a key
    twice), and for each input the position of its job among them."""
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
    return unique, position


def _execute(
    alias: str,
    statement: str,
    jobs: Sequence[PreparedJob],
    trace_context: dict[str, str] | None,
) -> list[_Inserted]:
    """Run an insert statement built on ``sql.enqueue.INSERT_JOBS_TEMPLATE`` for ``jobs``,
    each storing ``trace_context``; return its rows."""
    parameters: dict[str, Any] = {
        "queue": [job.queue for job in jobs],
        "kind": [job.kind for job in jobs],
        "payload": [job.payload_json for job in jobs],
        "priority": [job.priority for job in jobs],
        "run_at": [job.run_at for job in jobs],
        "delay_seconds": [job.delay_seconds for job in jobs],
        "expires_at": [job.expires_at for job in jobs],
        "expires_after_seconds": [job.expires_after_seconds for job in jobs],
        "max_attempts": [job.max_attempts for job in jobs],
        # An interval, not seconds: the returned Job's timedelta is then exactly the stored
        # one (Python's and PostgreSQL's rounding of seconds to microseconds differ).
        "visibility_timeout": [timedelta(seconds=job.visibility_timeout_seconds) for job in jobs],
        "idempotency_key": [job.idempotency_key for job in jobs],
        "ordering_key": [job.ordering_key for job in jobs],
        "trace_context": None if trace_context is None else json.dumps(trace_context),
        "channel": sql.wake.WAKE_CHANNEL,
    }
    with db.server_binding_cursor(alias, binary_results=True) as cursor:
        cursor.cursor.row_factory = class_row(_Inserted)  # the psycopg cursor Django wraps
        cursor.execute(statement, parameters)
        rows: list[_Inserted] = cursor.fetchall()
    return rows


#: Rounds of insert-then-read an idempotent enqueue makes before it gives up. A round is
#: repeated only when a key's live job ended between its insert and its read, which takes
#: a job of that key to finish within one round trip.
_KEY_ROUNDS = 10


class _KeyFreed(Exception):
    """A key the insert skipped had no live job any more when read: try the round again."""


def _insert_keyed(
    alias: str,
    jobs: Sequence[PreparedJob],
    statement: str,
    trace_context: dict[str, str] | None,
) -> tuple[list[Job], list[Job]]:
    """Insert jobs of which some have idempotency keys (each key once); return a saved Job
    per input (the live job for a key one holds), and the jobs inserted.

    No lock is taken on an existing job (see ``sql.enqueue.INSERT_JOBS``): the insert skips
    its key and a plain read returns it. The batch is inserted sorted by (kind, key), so concurrent
    batches wait for each other's keys in one order. Each round runs in a savepoint (or a
    transaction of its own): if a skipped key's job ended before the read, the round is
    rolled back, releasing every key it inserted, and the whole sorted batch goes again, so
    the keys are still taken in order.

    Raises:
        RuntimeError: the keys' jobs kept ending between insert and read for
            ``_KEY_ROUNDS`` rounds.
    """
    order = sorted(range(len(jobs)), key=lambda index: _lock_order(jobs[index]))
    batch = [jobs[index] for index in order]
    for _ in range(_KEY_ROUNDS):
        try:
            with transaction.atomic(using=alias):
                found, inserted = _insert_or_find(alias, batch, statement, trace_context)
        except _KeyFreed:
            continue
        saved: list[Job] = [found[0]] * len(jobs)
        for index, job in zip(order, found, strict=True):
            saved[index] = job
        return saved, inserted
    raise RuntimeError(
        f"enqueue: the live jobs of these idempotency keys kept ending between the insert "
        f"and the read ({_KEY_ROUNDS} rounds); nothing was inserted. Retry the enqueue."
    )


def _lock_order(job: PreparedJob) -> tuple[bool, str, str]:
    """Keyed jobs by (kind, key), then the jobs without a key (which take no key lock)."""
    return (job.idempotency_key is None, job.kind, job.idempotency_key or "")


def _insert_or_find(
    alias: str,
    batch: Sequence[PreparedJob],
    statement: str,
    trace_context: dict[str, str] | None,
) -> tuple[list[Job], list[Job]]:
    """One round of :func:`_insert_keyed`: a saved Job per job of ``batch``, and those
    inserted.

    Raises:
        _KeyFreed: a skipped key has no live job any more.
    """
    rows = _execute(alias, statement, batch, trace_context)
    new_rows: dict[tuple[str, str] | int, _Inserted] = {}
    unkeyed = 0
    for row in rows:
        if row.kind is None or row.idempotency_key is None:
            new_rows[unkeyed] = row
            unkeyed += 1
        else:
            new_rows[(row.kind, row.idempotency_key)] = row
    skipped = [
        (job.kind, job.idempotency_key)
        for job in batch
        if job.idempotency_key is not None and (job.kind, job.idempotency_key) not in new_rows
    ]
    live = _live_jobs_by_key(alias, skipped)
    if len(live) < len(skipped):
        raise _KeyFreed
    found: list[Job] = []
    inserted: list[Job] = []
    unkeyed = 0
    for job in batch:
        if job.idempotency_key is None:
            row = new_rows[unkeyed]
            unkeyed += 1
        elif (job.kind, job.idempotency_key) in live:
            found.append(live[(job.kind, job.idempotency_key)])
            continue
        else:
            row = new_rows[(job.kind, job.idempotency_key)]
        inserted.append(_saved_job(alias, job, trace_context, row))
        found.append(inserted[-1])
    return found, inserted


def _live_jobs_by_key(alias: str, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], Job]:
    """The live jobs holding ``(kind, idempotency key)`` pairs, read without a lock."""
    if not keys:
        return {}
    with connections[alias].cursor() as cursor:
        cursor.execute(
            sql.enqueue.SELECT_JOBS_BY_KEY,
            {"kind": [kind for kind, _ in keys], "idempotency_key": [key for _, key in keys]},
        )
        names = [column.name for column in cursor.description]
        jobs = db.from_rows(Job, alias, names, cursor.fetchall())
    return {(job.kind, str(job.idempotency_key)): job for job in jobs}
