"""The queue's tables. Declarative only: the statements that move rows live in ``sql/``.

``Job`` holds live jobs (ready or running); a finished job is deleted by its ack. A job that
cannot succeed moves to ``DeadLetter`` in the same transaction that deletes it. ``DedupKey``
records business effects that must happen once (see the idempotency docs). ``Schedule``
records the last tick enqueued for each recurring schedule. ``StoredTaskResult`` holds the
result of each task enqueued through Django's Tasks framework (``tasks_backend.py``).
``OutcomeRollup``, ``QueueSample`` and ``WorkerProcess`` are the observability history and
the worker registry (see docs/operations.md): finished jobs are deleted, so throughput and
durations are kept per minute instead.
"""

from __future__ import annotations

import functools
import json
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.db.models.functions import Now
from django.db.models.lookups import Exact

from . import fingerprints


class IsFinite(models.Func):
    """PostgreSQL's ``isfinite(timestamptz)``: false for 'infinity' and '-infinity'."""

    function = "isfinite"
    output_field = models.BooleanField()


class JSONTypeOf(models.Func):
    """PostgreSQL's ``jsonb_typeof(jsonb)``: 'object', 'array', 'string', 'number', ..."""

    function = "jsonb_typeof"
    output_field = models.CharField()


# What a producer may insert: the invariants ``enqueue`` enforces, refused by the database
# for rows written any other way (see docs/operations.md, "Rows written by other
# producers"). Each holds for ready rows only: a running row is the worker's, and a claim
# must be able to lease (then quarantine) a row that predates the constraints, which are
# added NOT VALID (migration 0008). Every write a worker makes to a ready row keeps them.
_RUNNING = models.Q(status="running")
JOB_INSERT_CONSTRAINTS = [
    models.CheckConstraint(
        condition=_RUNNING | models.Q(IsFinite("run_at")), name="jobq_job_run_at_is_finite"
    ),
    models.CheckConstraint(
        condition=_RUNNING | models.Q(expires_at__isnull=True) | models.Q(IsFinite("expires_at")),
        name="jobq_job_expires_at_is_finite",
    ),
    models.CheckConstraint(
        condition=_RUNNING | models.Q(IsFinite("created_at")), name="jobq_job_created_at_is_finite"
    ),
    models.CheckConstraint(
        condition=_RUNNING
        | models.Q(
            visibility_timeout__gte=timedelta(milliseconds=1),
            visibility_timeout__lte=timedelta(days=3650),
        ),
        name="jobq_job_visibility_timeout_1ms_to_10y",
    ),
    models.CheckConstraint(
        condition=_RUNNING | models.Q(Exact(JSONTypeOf("payload"), "object")),
        name="jobq_job_payload_is_object",
    ),
    models.CheckConstraint(
        condition=_RUNNING | models.Q(attempts__lte=models.F("max_attempts")),
        name="jobq_job_ready_attempts_within_max",
    ),
    models.CheckConstraint(
        condition=models.Q(status__in=["ready", "running", "waiting"]),
        name="jobq_job_status_is_known",
    ),
]


class Job(models.Model):
    """A unit of work waiting for, or leased by, a worker.

    Defaults are database defaults (``db_default``) because rows are inserted by raw SQL.
    """

    class Status(models.TextChoices):
        READY = "ready", "ready"
        RUNNING = "running", "running"
        # Behind an earlier job of its lane (``ordering_key``): made ready when that one ends.
        WAITING = "waiting", "waiting in its lane"

    id = models.BigAutoField(primary_key=True)
    queue = models.CharField(max_length=63, default="default")
    kind = models.CharField(max_length=200, help_text="The registered handler's name.")
    payload = models.JSONField(encoder=DjangoJSONEncoder, default=dict)
    priority = models.IntegerField(db_default=0, help_text="Higher runs first.")
    status = models.CharField(max_length=16, choices=Status.choices, db_default=Status.READY)
    run_at = models.DateTimeField(db_default=Now(), help_text="Not claimed before this time.")
    attempts = models.PositiveIntegerField(
        db_default=0,
        help_text="Claims so far; the current attempt number is the lease's fencing token.",
    )
    max_attempts = models.PositiveIntegerField(default=5)
    visibility_timeout = models.DurationField(help_text="Lease length granted by each claim.")
    lease_deadline = models.DateTimeField(
        null=True,
        blank=True,
        help_text="While running: when the lease lapses unless a heartbeat extends it.",
    )
    worker_id = models.CharField(max_length=200, blank=True, db_default="")
    # NULL (not "") means "no key": the partial unique constraint ignores NULLs.
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    expires_at = models.DateTimeField(
        null=True, blank=True, help_text="Dead-lettered as expired if not started by then."
    )
    created_at = models.DateTimeField(db_default=Now())
    started_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, db_default="")
    trace_context = models.JSONField(
        null=True,
        blank=True,
        help_text="The OpenTelemetry context of the enqueue (a W3C traceparent/tracestate "
        "carrier), the parent of each attempt's span; NULL when none was recorded.",
    )
    # NULL (not "") means "in no lane" (docs/flow-control.md, "Ordered lanes").
    ordering_key = models.CharField(  # noqa: DJ001
        max_length=200,
        null=True,
        blank=True,
        help_text="Its lane: jobs with the same key run one at a time, in enqueue order.",
    )
    abort_requested_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When an abort of the running attempt was requested (docs/flow-control.md).",
    )

    class Meta:
        db_table = "jobq_job"
        indexes = [
            # Serves the claim for one queue: equality on queue, then the claim order.
            models.Index(
                "queue",
                models.F("priority").desc(),
                "run_at",
                "id",
                name="jobq_job_claim_idx",
                condition=models.Q(status="ready"),
            ),
            # Serves the claim of a worker that takes every queue (no queue filter).
            models.Index(
                models.F("priority").desc(),
                "run_at",
                "id",
                name="jobq_job_claim_all_idx",
                condition=models.Q(status="ready"),
            ),
            # Serves the claim's kind filter (a worker claims only the kinds it has): per
            # queue and kind, the claim order; and the walk of their distinct pairs.
            models.Index(
                "queue",
                "kind",
                models.F("priority").desc(),
                "run_at",
                "id",
                name="jobq_job_kind_claim_idx",
                condition=models.Q(status="ready"),
            ),
            # Serves the reclaim of jobs whose lease has lapsed (few rows: the running ones).
            models.Index(
                fields=["lease_deadline"],
                name="jobq_job_lease_idx",
                condition=models.Q(status="running"),
            ),
            # Serves the lanes: a lane's jobs in enqueue order (its next job, whether it has
            # one live). Only jobs in a lane have an entry.
            models.Index(
                fields=["ordering_key", "id"],
                name="jobq_job_lane_idx",
                condition=models.Q(ordering_key__isnull=False),
            ),
        ]
        constraints = [
            # Idempotent enqueue: one live job per (kind, idempotency key).
            models.UniqueConstraint(
                fields=["kind", "idempotency_key"],
                condition=models.Q(idempotency_key__isnull=False),
                name="jobq_job_idempotency_uniq",
            ),
            # At most one job of a lane runs at a time, whatever the claims saw.
            models.UniqueConstraint(
                fields=["ordering_key"],
                condition=models.Q(status="running", ordering_key__isnull=False),
                name="jobq_job_one_running_per_lane",
            ),
            models.CheckConstraint(
                condition=models.Q(max_attempts__gte=1), name="jobq_job_max_attempts_gte_1"
            ),
            *JOB_INSERT_CONSTRAINTS,
        ]

    def __str__(self) -> str:
        return (
            f"{self.kind} #{self.pk} ({self.status}, attempt {self.attempts}/{self.max_attempts})"
        )


class DeadLetter(models.Model):
    """A job that will not be retried: a copy of the job plus why and how it died."""

    class Reason(models.TextChoices):
        """Why a job died. ``reason`` may extend one of these (``"failed: card declined"``)."""

        MAX_ATTEMPTS_EXCEEDED = "max attempts exceeded"
        FAILED = "failed"  # the handler raised Fail/PermanentError: "failed: <message>"
        EXPIRED = "expired"
        UNKNOWN_KIND = "unknown kind"
        LEASE_EXPIRED_ON_FINAL_ATTEMPT = "lease expired on final attempt"
        # the worker's write of the outcome failed: "outcome could not be recorded: <error>"
        OUTCOME_NOT_RECORDED = "outcome could not be recorded"
        # A row holding what enqueue never writes: "poison row: run_at is -infinity"
        POISON_ROW = "poison row"
        # An operator asked the running attempt to stop (operations.abort()) and, once the
        # worker saw it, the handler raised; or the job was claimed with the request, unrun.
        ABORTED = "aborted"

    id = models.BigAutoField(primary_key=True)
    job_id = models.BigIntegerField(help_text="The id the job had in the jobs table.")
    queue = models.CharField(max_length=63)
    kind = models.CharField(max_length=200)
    payload = models.JSONField(encoder=DjangoJSONEncoder, default=dict)
    priority = models.IntegerField(default=0)
    attempts = models.PositiveIntegerField()
    max_attempts = models.PositiveIntegerField()
    visibility_timeout = models.DurationField()
    # NULL (not "") means "no key": the partial unique constraint ignores NULLs.
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    created_at = models.DateTimeField(help_text="When the job was first enqueued.")
    reason = models.CharField(max_length=500)
    last_error = models.TextField(blank=True, default="")
    traceback = models.TextField(blank=True, default="")
    died_at = models.DateTimeField(db_default=Now())
    trace_context = models.JSONField(
        null=True, blank=True, help_text="The job's trace context, kept for its redrive."
    )
    ordering_key = models.CharField(  # noqa: DJ001
        max_length=200, null=True, blank=True, help_text="The job's lane, kept for its redrive."
    )
    # Computed by PostgreSQL in every insert, whoever writes the row (django_jobq.fingerprints).
    fingerprint = fingerprints.FingerprintField(
        expression=fingerprints.expression(),
        output_field=models.TextField(),
        db_persist=True,
        help_text="The error's first line, its values replaced: dead letters of one cause.",
    )

    class Meta:
        db_table = "jobq_dead_letter"
        permissions = [("redrive_deadletter", "Can redrive dead letters")]
        indexes = [
            models.Index(fields=["queue", "kind"], name="jobq_dead_queue_kind_idx"),
            models.Index(fields=["died_at"], name="jobq_dead_died_at_idx"),
            # Serve the dead letters by cause (sql.causes.DEAD_LETTER_CAUSES: a pass in fingerprint
            # order; a seek per kind of a cause) and the list of one cause, newest first.
            models.Index(fields=["fingerprint", "died_at", "id"], name="jobq_dead_fingerprint_idx"),
            models.Index(fields=["fingerprint", "kind"], name="jobq_dead_fingerprint_kind_idx"),
            # Serve the admin: the dead letter of a job id (its search), and the reason
            # filter's "reason = X OR reason LIKE 'X:%'" for a reason few dead letters have.
            models.Index(fields=["job_id"], name="jobq_dead_job_id_idx"),
            models.Index(
                fields=["reason"], name="jobq_dead_reason_idx", opclasses=["varchar_pattern_ops"]
            ),
            # Serves redrive's "oldest dead letter per idempotency key" check.
            models.Index(
                fields=["kind", "idempotency_key"],
                name="jobq_dead_idempotency_idx",
                condition=models.Q(idempotency_key__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} #{self.job_id}: {self.reason}"


class DedupKey(models.Model):
    """A business effect that has happened: its key commits with the effect itself."""

    id = models.BigAutoField(primary_key=True)
    kind = models.CharField(max_length=200)
    key = models.CharField(max_length=200)
    job_id = models.BigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "jobq_dedup_key"
        constraints = [
            models.UniqueConstraint(fields=["kind", "key"], name="jobq_dedup_key_uniq"),
        ]
        indexes = [models.Index(fields=["created_at"], name="jobq_dedup_created_at_idx")]

    def __str__(self) -> str:
        return f"{self.kind}: {self.key}"


class Schedule(models.Model):
    """The state of one recurring schedule: the last tick whose job was enqueued.

    Schedules are declared in code (``@job(schedule=...)``) or in ``JOBQ['SCHEDULES']``, not
    here. A scheduler creates the row the first time it sees a schedule and advances
    ``last_tick`` by compare-and-set in the transaction that enqueues the tick's job. A row
    whose schedule is no longer declared is ignored, and kept (deleting it is safe).
    """

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(max_length=200, unique=True)
    kind = models.CharField(max_length=200, help_text="The kind each tick enqueues.")
    cron = models.CharField(max_length=200)
    timezone = models.CharField(max_length=100)
    defined_at = models.DateTimeField(
        help_text="When this cron and timezone were first seen; no earlier tick is enqueued."
    )
    last_tick = models.DateTimeField(
        null=True, blank=True, help_text="The latest tick whose job was enqueued."
    )
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "jobq_schedule"

    def __str__(self) -> str:
        return f"{self.name} ({self.cron}, {self.timezone})"


class StoredTaskResult(models.Model):
    """The result of a task enqueued through Django's Tasks framework (docs/tasks.md).

    Written with the task's job: inserted by the enqueue, marked running by each attempt's
    start, and updated by the same statement as the job's ack (successful), retry (ready
    again, with the attempt's error) or dead letter (failed); a redrive makes it ready again.
    ``id`` is the framework's result id; it lives in the job's payload, so it survives the
    fresh job row a redrive creates. ``errors`` holds one ``{"exception_class_path",
    "traceback"}`` per failed attempt and ``worker_ids`` one worker id per attempt started.
    """

    class Status(models.TextChoices):
        """The framework's ``TaskResultStatus`` values."""

        READY = "READY"
        RUNNING = "RUNNING"
        SUCCESSFUL = "SUCCESSFUL"
        FAILED = "FAILED"

    id = models.CharField(max_length=64, primary_key=True)
    task_path = models.CharField(max_length=200, help_text="The task's module path: its kind.")
    backend = models.CharField(max_length=100, help_text="The TASKS alias it was enqueued with.")
    queue = models.CharField(max_length=63)
    priority = models.IntegerField()
    args = models.JSONField(default=list)
    kwargs = models.JSONField(default=dict)
    status = models.CharField(max_length=16, choices=Status.choices)
    job_id = models.BigIntegerField(
        null=True, blank=True, help_text="The latest job (or dead letter's job_id) running it."
    )
    run_after = models.DateTimeField(null=True, blank=True)
    enqueued_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True, help_text="The first attempt's start.")
    last_attempted_at = models.DateTimeField(
        null=True, blank=True, help_text="The latest attempt's start."
    )
    finished_at = models.DateTimeField(null=True, blank=True)
    return_value = models.JSONField(null=True, blank=True)
    errors = models.JSONField(default=list)
    worker_ids = models.JSONField(default=list)

    class Meta:
        db_table = "jobq_task_result"
        indexes = [
            # Serves the retention sweep (JOBQ['TASK_RESULT_RETENTION']) of finished results.
            models.Index(
                fields=["finished_at"],
                name="jobq_task_result_finished_idx",
                condition=models.Q(finished_at__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.task_path} {self.id} ({self.status})"


def stored_task_result_from_json(text: str) -> StoredTaskResult:
    """A :class:`StoredTaskResult` from the JSON text of its row (``row_to_json(result)``, as
    the worker's statements that start tasks and record their outcomes return it:
    ``sql.tasks``, ``sql.outcomes``): its times arrive as ISO 8601 strings, its ``jsonb``
    columns as JSON. Columns the model does not know are left out: one a newer migration
    added (a rolling deploy, old workers on the new schema) must not stop the worker reading
    its results.

    Raises:
        ValueError: the text is not a JSON object, or a time is not one Python holds
            (``infinity``, a year BC: a value written by hand); ``RecursionError``: JSON
            nested deeper than Python's recursion limit.
    """
    columns = json.loads(text)
    if not isinstance(columns, dict):
        raise ValueError(f"a task result's row is not a JSON object: {text[:100]!r}")
    names, fields = _stored_task_result_layout()
    values = []
    for field, is_time in fields:
        value = columns.get(field.attname, _MISSING)
        if value is _MISSING:  # a column an older schema lacks: the model's default
            value = field.get_default()
        elif is_time and value is not None:
            if not isinstance(value, str):
                raise ValueError(f"a task result's {field.attname} is not a time: {value!r}")
            value = datetime.fromisoformat(value)
        values.append(value)
    # Every field in order, as Django builds the rows a query reads (``from_db``: a saved
    # row, ``_state.adding`` false): half the cost of keywords, paid twice for each task a
    # worker runs.
    return StoredTaskResult.from_db(None, names, values)


_MISSING = object()


@functools.cache
def _stored_task_result_layout() -> tuple[
    tuple[str, ...], tuple[tuple[models.Field[Any, Any], bool], ...]
]:
    """The model's column names in order, and each column with whether it is a time."""
    fields = StoredTaskResult._meta.concrete_fields
    return (
        tuple(field.attname for field in fields),
        tuple((field, isinstance(field, models.DateTimeField)) for field in fields),
    )


class OutcomeRollup(models.Model):
    """The outcomes of one kind on one queue in one minute (database clock), as counts and a
    histogram of handler durations.

    Workers add to these rows, one upsert statement for all their outcomes every few
    seconds (``UPSERT_OUTCOME_ROLLUPS``); the maintenance sweep deletes rows older than
    ``JOBQ['STATS_RETENTION']``. ``duration_buckets[i]`` counts the runs that took at most
    ``DURATION_BUCKETS[i]`` seconds and more than the bound before it (the last entry: more
    than the last bound); see :mod:`django_jobq.stats`.
    """

    id = models.BigAutoField(primary_key=True)
    queue = models.CharField(max_length=63)
    kind = models.CharField(max_length=200)
    minute = models.DateTimeField(help_text="The minute (truncated) these outcomes fell in.")
    succeeded = models.BigIntegerField(default=0)
    retried = models.BigIntegerField(default=0)
    dead_lettered = models.BigIntegerField(default=0)
    duration_sum = models.FloatField(default=0.0, help_text="Seconds, summed over the runs.")
    duration_buckets = models.JSONField(default=list, help_text="Counts per duration bucket.")

    class Meta:
        db_table = "jobq_outcome_rollup"
        constraints = [
            models.UniqueConstraint(
                fields=["queue", "kind", "minute"], name="jobq_outcome_rollup_uniq"
            ),
        ]
        indexes = [models.Index(fields=["minute"], name="jobq_outcome_rollup_minute_idx")]

    def __str__(self) -> str:
        return f"{self.queue} {self.kind} {self.minute:%Y-%m-%d %H:%M}"


class QueueSample(models.Model):
    """The depth and oldest ready age of one queue, sampled once a minute by one worker
    (``SAMPLE_QUEUES``), for the dashboard's charts. Pruned like :class:`OutcomeRollup`."""

    id = models.BigAutoField(primary_key=True)
    queue = models.CharField(max_length=63)
    minute = models.DateTimeField()
    ready = models.BigIntegerField(help_text="Ready and due jobs.")
    scheduled = models.BigIntegerField(help_text="Ready jobs whose run_at is in the future.")
    running = models.BigIntegerField()
    oldest_ready_age = models.FloatField(
        help_text="Seconds the oldest ready, due job had waited (0 when none)."
    )

    class Meta:
        db_table = "jobq_queue_sample"
        constraints = [
            models.UniqueConstraint(fields=["queue", "minute"], name="jobq_queue_sample_uniq"),
        ]
        indexes = [models.Index(fields=["minute"], name="jobq_queue_sample_minute_idx")]

    def __str__(self) -> str:
        return f"{self.queue} {self.minute:%Y-%m-%d %H:%M}"


#: Seconds after its last beat (``WorkerProcess.last_seen``) that a worker counts as stale:
#: six missed beats (a worker beats every 10 s, see :mod:`django_jobq.worker.registration`).
#: Also ``django_jobq.stats.STALE_AFTER``.
WORKER_STALE_AFTER = 60.0


class WorkerProcess(models.Model):
    """A running worker, registered when it starts and deleted when it stops.

    ``last_seen`` is refreshed every few seconds by the worker's main loop
    (:mod:`django_jobq.worker.registration`); a row not seen for
    :data:`WORKER_STALE_AFTER` seconds belongs to a worker that crashed, hangs or
    lost its database: it is shown as stale, and the maintenance sweep deletes it an hour
    after its last beat.
    """

    id = models.BigAutoField(primary_key=True)
    worker_id = models.CharField(max_length=200, help_text="As recorded on claimed jobs.")
    host = models.CharField(max_length=255)
    pid = models.IntegerField()
    queues = models.JSONField(
        null=True, blank=True, help_text="The queues it claims from; null: every queue."
    )
    concurrency = models.IntegerField()
    kinds = models.JSONField(
        default=list, blank=True, help_text="The kinds it claims (its registry), sorted."
    )
    kinds_fingerprint = models.CharField(
        max_length=16,
        default="",
        blank=True,
        help_text="Short hash of its kinds: workers with the same registry have the same one.",
    )
    started_at = models.DateTimeField(db_default=Now())
    last_seen = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "jobq_worker_process"
        indexes = [models.Index(fields=["last_seen"], name="jobq_worker_last_seen_idx")]

    def __str__(self) -> str:
        return self.worker_id


#: What ``rate_limit`` columns hold: ``<count>/<window>`` (see :mod:`django_jobq.rates`).
RATE_LIMIT_PATTERN = r"^([1-9][0-9]{0,5}|1000000)/([1-9][0-9]{0,5})?[smhd]$"
#: The names ``jobq_queue`` and ``jobq_kind_limit`` hold: queue and kind names as
#: ``conf.QUEUE_NAME_RE`` and ``conf.KIND_NAME_RE`` check them (in PostgreSQL's regex syntax).
QUEUE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
KIND_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.:-]{0,199}$"


def _limit_constraints(table: str) -> list[models.BaseConstraint]:
    """The checks a table of limits keeps, whoever writes it (the admin, SQL by hand)."""
    return [
        models.CheckConstraint(
            condition=models.Q(concurrency_limit__isnull=True) | models.Q(concurrency_limit__gte=1),
            name=f"{table}_concurrency_limit_gte_1",
        ),
        models.CheckConstraint(
            condition=models.Q(rate_limit__isnull=True)
            | models.Q(rate_limit__regex=RATE_LIMIT_PATTERN),
            name=f"{table}_rate_limit_grammar",
        ),
    ]


#: The times a pause may hold (``Queue.paused_at``, ``paused_until``): those a Python datetime
#: holds in any time zone (years 1 to 9999, with a day to spare), as every reader of the
#: pauses needs; not 'infinity'.
PAUSE_TIMES = (datetime(1, 1, 2, tzinfo=UTC), datetime(9999, 12, 30, tzinfo=UTC))


class Queue(models.Model):
    """What operators set on a queue at run time: a pause, and limits that override the
    ``JOBQ['QUEUES']`` setting's (docs/flow-control.md). A queue needs no row to work: one is
    written the first time it is paused or limited (:mod:`django_jobq.flow_control`), or
    shown in the admin."""

    name = models.CharField(max_length=63, primary_key=True)
    paused_at = models.DateTimeField(
        null=True, blank=True, help_text="Paused since then; empty: not paused."
    )
    paused_until = models.DateTimeField(
        null=True,
        blank=True,
        help_text="While paused: resumes by itself then; empty: until resumed.",
    )
    concurrency_limit = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="The most jobs of the queue running at once, fleet-wide; empty: the setting's.",
    )
    rate_limit = models.CharField(  # noqa: DJ001
        max_length=16,
        null=True,
        blank=True,
        help_text='The most jobs started per window, fleet-wide ("100/s", "600/m", "5/10s"); '
        "empty: the setting's.",
    )
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "jobq_queue"
        constraints = [
            models.CheckConstraint(
                condition=models.Q(name__regex=QUEUE_NAME_PATTERN), name="jobq_queue_name_valid"
            ),
            *_limit_constraints("jobq_queue"),
            *(
                models.CheckConstraint(
                    condition=models.Q(**{f"{field}__range": PAUSE_TIMES}),
                    name=f"jobq_queue_{field}_in_range",
                )
                for field in ("paused_at", "paused_until")
            ),
            models.CheckConstraint(
                condition=models.Q(paused_until__isnull=True) | models.Q(paused_at__isnull=False),
                name="jobq_queue_paused_until_needs_paused_at",
            ),
        ]

    def __str__(self) -> str:
        return self.name


class KindLimit(models.Model):
    """Limits operators set on a kind at run time, overriding ``@job(concurrency_limit=...,
    rate_limit=...)`` (docs/flow-control.md)."""

    kind = models.CharField(max_length=200, primary_key=True)
    concurrency_limit = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="The most jobs of the kind running at once, fleet-wide; empty: @job's.",
    )
    rate_limit = models.CharField(  # noqa: DJ001
        max_length=16,
        null=True,
        blank=True,
        help_text='The most jobs started per window, fleet-wide ("100/s"); empty: @job\'s.',
    )
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "jobq_kind_limit"
        constraints = [
            models.CheckConstraint(
                condition=models.Q(kind__regex=KIND_NAME_PATTERN), name="jobq_kind_limit_kind_valid"
            ),
            *_limit_constraints("jobq_kind_limit"),
        ]

    def __str__(self) -> str:
        return self.kind


class LimitState(models.Model):
    """The row a limited claim locks for one queue or kind with a limit
    (:mod:`django_jobq.limited_claims`): while one worker's claim holds it, no other claim
    counts or takes jobs under that limit. Workers write it; it is not configuration (that is
    :class:`Queue` and :class:`KindLimit`)."""

    class Scope(models.TextChoices):
        QUEUE = "queue"
        KIND = "kind"

    id = models.BigAutoField(primary_key=True)
    scope = models.CharField(max_length=5, choices=Scope.choices)
    name = models.CharField(max_length=200)

    class Meta:
        db_table = "jobq_limit_state"
        constraints = [
            models.UniqueConstraint(fields=["scope", "name"], name="jobq_limit_state_uniq"),
        ]

    def __str__(self) -> str:
        return f"{self.scope} {self.name}"


class LimitStart(models.Model):
    """Starts counted by the rate limit of a queue or kind: ``starts`` jobs one limited claim
    took, stamped with the database clock (later, for a claim that may hold them in a
    worker's prefetch for a while: see :mod:`django_jobq.limited_claims`), or one late
    handler's start, stamped as it began. A claim writes one row per rate limit, however
    many jobs it took, so counting a window reads a row per claim, not per start; a late
    start moves out of its claim's row into one of its own. Deleted once out of the limit's
    window."""

    id = models.BigAutoField(primary_key=True)
    scope = models.CharField(max_length=5, choices=LimitState.Scope.choices)
    name = models.CharField(max_length=200)
    started_at = models.DateTimeField()
    starts = models.IntegerField(help_text="How many starts this row counts.")

    class Meta:
        db_table = "jobq_limit_start"
        constraints = [
            models.CheckConstraint(
                condition=models.Q(starts__gte=0), name="jobq_limit_start_starts_gte_0"
            ),
        ]
        indexes = [
            # The starts of one limit within its window, newest first.
            models.Index(fields=["scope", "name", "started_at"], name="jobq_limit_start_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.scope} {self.name}: {self.starts} at {self.started_at}"
