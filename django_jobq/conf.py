"""The ``JOBQ`` setting: defaults, types and validation.

Users configure django-jobq with one dictionary in their settings module::

    JOBQ = {
        "DATABASE": "default",        # alias in DATABASES holding the queue tables
        "LISTEN_DATABASE": None,      # alias the workers' listeners connect with; None: DATABASE
        "DEFAULT_QUEUE": "default",   # queue for jobs that name none
        "MAX_ATTEMPTS": 5,            # attempts before a job becomes a dead letter
        "VISIBILITY_TIMEOUT": 30,     # lease length in seconds
        "RETRY_BACKOFF_BASE": 2,      # seconds: first retry waits 1-2 s, then doubling
        "RETRY_BACKOFF_CAP": 3600,    # seconds: no retry waits longer
        "POLL_INTERVAL": 1.0,         # seconds a worker sleeps when it found nothing
        "DEAD_LETTER_RETENTION": None,  # seconds (or timedelta) to keep dead letters; None: forever
        "DEDUP_RETENTION": 30 * 86400,  # seconds (or timedelta) to keep dedup keys; None: forever
        "TASK_RESULT_RETENTION": 7 * 86400,  # seconds (or timedelta) to keep finished task results
        "SCHEDULES": {},              # name -> {"kind", "cron", "timezone", "payload", "catch_up"}
        "STATS_RETENTION": 7 * 86400,  # seconds (or timedelta) to keep per-minute statistics
        "METRICS_TOKEN": None,        # bearer token for the metrics view (besides staff sessions)
        "METRICS_CACHE_TIMEOUT": 5,   # seconds the database gauges are cached per process (0: not)
        "ALERT_OLDEST_READY_AGE": 300,  # seconds: jobq_stats --check fails above; dashboard in red
        "ALERT_DEAD_LETTERS": 0,      # dead letters: jobq_stats --check fails above; None: no check
        "ALERT_HORIZON_AGE": 600,     # seconds a transaction may hold the xmin horizon back
        "CONNECT_TIMEOUT": 10,        # seconds a worker's own connection may take to open
        "STATEMENT_TIMEOUT": None,    # seconds per worker statement; None: VISIBILITY_TIMEOUT / 3
        "ENQUEUE_UNREGISTERED_KINDS": False,  # True: enqueue kinds this process does not register
        "UNKNOWN_KIND_GRACE": 600,    # seconds a job no live worker can run waits; None: forever
        "ASYNC_CONCURRENCY": 100,     # async jobs one worker process runs at once on its loop
        "QUEUES": {},                 # queue -> {"CONCURRENCY_LIMIT": int, "RATE_LIMIT": "100/s"}
    }

Durations are seconds (int or float) or ``datetime.timedelta``. ``SCHEDULES`` declares
recurring jobs (see :mod:`django_jobq.schedules`; they are bound and checked by
:mod:`django_jobq.scheduling`); :func:`validate` checks its shape (E006),
and the schedules' system check its values (cron, timezone, payload: E006-E009). The
``STATS_RETENTION``, ``METRICS_*`` and ``ALERT_*`` keys are for observability
(docs/operations.md): ``METRICS_TOKEN`` must be ``None`` or at least 16 characters (E012),
``STATS_RETENTION`` at least an hour, since the dashboard and ``jobq_stats`` read the last
hour (E013). ``ALERT_HORIZON_AGE`` is how long a transaction may hold the xmin horizon back
before ``jobq_stats --check`` and ``jobq_doctor --check`` fail, system check W005 warns and
the dashboard shows it in red (:mod:`django_jobq.mvcc`).

``LISTEN_DATABASE`` names the ``DATABASES`` alias each worker's listener (its ``LISTEN``
connection) opens, ``None`` for ``DATABASE``'s: the same database reached another way, e.g.
directly while ``DATABASE`` goes through PgBouncer in transaction mode, which carries no
``LISTEN`` (docs/pgbouncer.md). A str or ``None`` (E003); an alias of ``DATABASES`` that is
PostgreSQL (E004, E001).

``CONNECT_TIMEOUT`` and ``STATEMENT_TIMEOUT`` bound the worker's own connections (main loop,
heartbeat, listener; :func:`django_jobq.db.connect`, docs/operations.md): a connect timeout
of 2 to 3600 s (E015); a statement timeout of 0.1 to 3600 s, or ``None`` for a third of
``VISIBILITY_TIMEOUT`` (1 to 3600 s) (E016). :func:`statement_timeout` resolves it.

``ENQUEUE_UNREGISTERED_KINDS`` (a bool, E017): ``False``, the default, makes enqueueing a
kind that no ``@job`` registers in this process raise
:class:`~django_jobq.exceptions.UnknownKind`; ``True`` accepts any valid kind name, for a
project whose web processes enqueue the jobs of another service's workers (one call opts in
with ``allow_unregistered=True`` instead).

``UNKNOWN_KIND_GRACE`` is how long a due job waits when live workers serve its queue but none
of them has registered its kind (a mixed fleet during a deploy, or a removed kind), counted
from the moment it became due (``GREATEST(run_at, created_at)``); then the maintenance sweep
makes it an "unknown kind" dead letter (docs/deploying.md). 1 s to 10 years, or ``None``:
such jobs wait until a worker that has the kind comes (E018).

``ASYNC_CONCURRENCY`` is how many async jobs (``async def`` handlers) one worker process
runs side by side on its event loop, and how many claim slots that adds to the worker's
threads when it registers async kinds (docs/async.md); ``jobq_worker --async-concurrency``
overrides it. An int from 1 to :data:`MAX_ASYNC_CONCURRENCY` (E020).

``QUEUES`` sets fleet-wide limits per queue (docs/flow-control.md): each key a queue name,
each value a dict with ``CONCURRENCY_LIMIT`` (an int from 1 to 2**31 - 1: the most jobs of
the queue running at once) and/or ``RATE_LIMIT`` (a rate limit such as ``"100/s"``, see
:mod:`django_jobq.rates`), either ``None`` for no limit. Operators override them at run
time (:mod:`django_jobq.flow_control`, the Queues admin page). A problem is E021.

``TASKS`` entries whose backend is ``django_jobq.tasks_backend.JobqBackend`` are checked by
:func:`validate_tasks_backend` (E010): their ``QUEUES`` must be queue names, and their
``OPTIONS`` take ``MAX_ATTEMPTS``, ``VISIBILITY_TIMEOUT``, ``RETRY_BACKOFF_BASE`` and
``RETRY_BACKOFF_CAP``, the task defaults that override ``JOBQ``'s (docs/tasks.md).

Every key is optional. :func:`get_settings` notices a replaced setting on its next call, so
``override_settings(JOBQ=...)`` in tests takes effect at once. :func:`validate`
powers the ``django_jobq.E00x`` system checks; :func:`get_settings` raises
:class:`~django.core.exceptions.ImproperlyConfigured` for the same problems at run time.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import Any

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured

from .rates import parse_rate

#: Queue names: a letter or digit, then letters, digits, ``_ . -``; at most 63 characters
#: (PostgreSQL's identifier length, so a queue name can always become a channel name).
QUEUE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,62}\Z")
#: Kind names: a dotted Python path such as ``shop.jobs.send_receipt`` or any name given
#: with ``@job(name=...)`` made of letters, digits and ``_ . : -``; at most 200 characters.
KIND_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:\-]{0,199}\Z")
#: The keys of one ``JOBQ['SCHEDULES']`` entry; ``kind`` and ``cron`` are required.
SCHEDULE_KEYS = frozenset({"kind", "cron", "timezone", "payload", "catch_up"})
#: The most missed ticks of one schedule enqueued at once (a schedule's ``catch_up``).
MAX_CATCH_UP = 1000
#: The shortest ``JOBQ['METRICS_TOKEN']`` accepted (``secrets.token_urlsafe()`` gives 43).
MIN_METRICS_TOKEN_LENGTH = 16
#: The shortest ``JOBQ['STATS_RETENTION']``, in seconds: the last hour is what is shown.
MIN_STATS_RETENTION = 3600.0
#: The range of ``JOBQ['CONNECT_TIMEOUT']`` in seconds (libpq waits at least 2 s anyway).
CONNECT_TIMEOUT_RANGE = (2.0, 3600.0)
#: The range of ``JOBQ['STATEMENT_TIMEOUT']`` in seconds.
STATEMENT_TIMEOUT_RANGE = (0.1, 3600.0)
#: The shortest statement timeout derived from ``VISIBILITY_TIMEOUT``, in seconds.
MIN_DERIVED_STATEMENT_TIMEOUT = 1.0
#: The most async jobs one worker process may run at once (``JOBQ['ASYNC_CONCURRENCY']``).
MAX_ASYNC_CONCURRENCY = 10_000
#: The range of ``JOBQ['UNKNOWN_KIND_GRACE']`` in seconds (``None`` is also allowed).
UNKNOWN_KIND_GRACE_RANGE = (1.0, 10 * 365 * 24 * 3600.0)


@dataclass(frozen=True)
class JobqSettings:
    """The resolved ``JOBQ`` setting. Durations are seconds (``float``)."""

    DATABASE: str = "default"
    LISTEN_DATABASE: str | None = None
    DEFAULT_QUEUE: str = "default"
    MAX_ATTEMPTS: int = 5
    VISIBILITY_TIMEOUT: float = 30.0
    RETRY_BACKOFF_BASE: float = 2.0
    RETRY_BACKOFF_CAP: float = 3600.0
    POLL_INTERVAL: float = 1.0
    DEAD_LETTER_RETENTION: float | None = None
    DEDUP_RETENTION: float | None = 30 * 86400.0
    TASK_RESULT_RETENTION: float | None = 7 * 86400.0
    SCHEDULES: Mapping[str, Mapping[str, object]] = field(default_factory=dict)
    STATS_RETENTION: float | None = 7 * 86400.0
    METRICS_TOKEN: str | None = None
    METRICS_CACHE_TIMEOUT: float = 5.0
    ALERT_OLDEST_READY_AGE: float = 300.0
    ALERT_DEAD_LETTERS: int | None = 0
    ALERT_HORIZON_AGE: float | None = 600.0
    CONNECT_TIMEOUT: float = 10.0
    STATEMENT_TIMEOUT: float | None = None
    ENQUEUE_UNREGISTERED_KINDS: bool = False
    UNKNOWN_KIND_GRACE: float | None = 600.0
    ASYNC_CONCURRENCY: int = 100
    QUEUES: Mapping[str, Mapping[str, object]] = field(default_factory=dict)


#: The keys of one ``JOBQ['QUEUES']`` entry.
QUEUE_LIMIT_KEYS = frozenset({"CONCURRENCY_LIMIT", "RATE_LIMIT"})
#: The largest concurrency limit (PostgreSQL's integer).
MAX_CONCURRENCY_LIMIT = 2**31 - 1

_KNOWN_KEYS = frozenset(f.name for f in fields(JobqSettings))


#: What ``JOBQ`` is when the project does not set it (one object, so it can be cached).
_UNSET: dict[str, Any] = {}


def _raw_setting() -> Any:
    return getattr(django_settings, "JOBQ", _UNSET)


#: The last resolved setting and the raw value it came from.
_resolved: tuple[object, JobqSettings] | None = None


#: The longest duration any option or setting accepts: 10 years, in seconds. It keeps every
#: computed time within PostgreSQL's and Python's date ranges.
MAX_DURATION = 10 * 365 * 24 * 3600.0

_DURATION_KEYS = (
    "VISIBILITY_TIMEOUT",
    "RETRY_BACKOFF_BASE",
    "RETRY_BACKOFF_CAP",
    "POLL_INTERVAL",
    "DEAD_LETTER_RETENTION",
    "DEDUP_RETENTION",
    "TASK_RESULT_RETENTION",
    "STATS_RETENTION",
    "METRICS_CACHE_TIMEOUT",
    "ALERT_OLDEST_READY_AGE",
    "ALERT_HORIZON_AGE",
    "CONNECT_TIMEOUT",
    "STATEMENT_TIMEOUT",
)
_MAY_BE_NONE = (
    "DEAD_LETTER_RETENTION",
    "DEDUP_RETENTION",
    "TASK_RESULT_RETENTION",
    "STATS_RETENTION",
    "STATEMENT_TIMEOUT",
    "ALERT_HORIZON_AGE",
)
_MAY_BE_ZERO = ("METRICS_CACHE_TIMEOUT",)  # 0: no cache


def duration_seconds(value: object) -> float | None:
    """Seconds in a duration (a number of seconds or a timedelta); ``None`` if neither."""
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def validate(raw: Any) -> list[tuple[str, str]]:
    """Return the problems in a raw ``JOBQ`` value as ``(check id, message)`` pairs.

    An empty list means the value is usable. Used by the system checks in
    :mod:`django_jobq.checks` and by :func:`get_settings`.
    """
    if not isinstance(raw, dict):
        return [("django_jobq.E002", f"JOBQ must be a dict, not {type(raw).__name__}.")]
    problems: list[tuple[str, str]] = []
    for key in sorted(set(raw) - _KNOWN_KEYS):
        problems.append(
            (
                "django_jobq.E002",
                f"JOBQ has an unknown key {key!r}; known keys: {', '.join(sorted(_KNOWN_KEYS))}.",
            )
        )
    if "DATABASE" in raw and not isinstance(raw["DATABASE"], str):
        problems.append(("django_jobq.E003", "JOBQ['DATABASE'] must be a database alias (str)."))
    if raw.get("LISTEN_DATABASE") is not None and not isinstance(raw["LISTEN_DATABASE"], str):
        problems.append(
            ("django_jobq.E003", "JOBQ['LISTEN_DATABASE'] must be a database alias (str) or None.")
        )
    queue = raw.get("DEFAULT_QUEUE", JobqSettings.DEFAULT_QUEUE)
    if not isinstance(queue, str) or not QUEUE_NAME_RE.match(queue):
        problems.append(
            (
                "django_jobq.E003",
                f"JOBQ['DEFAULT_QUEUE'] = {queue!r} is not a valid queue name "
                f"(pattern {QUEUE_NAME_RE.pattern}).",
            )
        )
    attempts = raw.get("MAX_ATTEMPTS", JobqSettings.MAX_ATTEMPTS)
    if not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 1:
        problems.append(
            ("django_jobq.E003", f"JOBQ['MAX_ATTEMPTS'] = {attempts!r} must be an int >= 1.")
        )
    unregistered = raw.get("ENQUEUE_UNREGISTERED_KINDS", False)
    if not isinstance(unregistered, bool):
        problems.append(
            (
                "django_jobq.E017",
                f"JOBQ['ENQUEUE_UNREGISTERED_KINDS'] = {unregistered!r} must be True or False.",
            )
        )
    async_concurrency = raw.get("ASYNC_CONCURRENCY", JobqSettings.ASYNC_CONCURRENCY)
    if (
        not isinstance(async_concurrency, int)
        or isinstance(async_concurrency, bool)
        or not 1 <= async_concurrency <= MAX_ASYNC_CONCURRENCY
    ):
        problems.append(
            (
                "django_jobq.E020",
                f"JOBQ['ASYNC_CONCURRENCY'] = {async_concurrency!r} must be an int from 1 to "
                f"{MAX_ASYNC_CONCURRENCY}.",
            )
        )
    durations = {}
    for key in _DURATION_KEYS:
        value = raw.get(key, getattr(JobqSettings, key))
        if value is None and key in _MAY_BE_NONE:
            continue
        seconds = duration_seconds(value)
        zero_ok = key in _MAY_BE_ZERO and seconds == 0
        if seconds is None or not (0 < seconds <= MAX_DURATION or zero_ok):
            problems.append(
                (
                    "django_jobq.E003",
                    f"JOBQ[{key!r}] = {value!r} must be a "
                    f"{'non-negative' if key in _MAY_BE_ZERO else 'positive'} number of "
                    f"seconds (or a timedelta) of at most 10 years.",
                )
            )
        else:
            durations[key] = seconds
    if durations.get("POLL_INTERVAL", 0) > 3600:
        problems.append(("django_jobq.E003", "JOBQ['POLL_INTERVAL'] must be at most 3600 s."))
    base, cap = durations.get("RETRY_BACKOFF_BASE"), durations.get("RETRY_BACKOFF_CAP")
    if base is not None and cap is not None and cap < base:
        problems.append(
            ("django_jobq.E003", "JOBQ['RETRY_BACKOFF_CAP'] must not be below RETRY_BACKOFF_BASE.")
        )
    stats_retention = durations.get("STATS_RETENTION")
    if stats_retention is not None and stats_retention < MIN_STATS_RETENTION:
        problems.append(
            (
                "django_jobq.E013",
                f"JOBQ['STATS_RETENTION'] must be at least {MIN_STATS_RETENTION:g} s (an hour): "
                f"the dashboard and jobq_stats show the last hour.",
            )
        )
    problems.extend(_connection_timeouts(durations))
    problems.extend(_unknown_kind_grace(raw))
    problems.extend(_observability_values(raw))
    problems.extend(_schedules_shape(raw.get("SCHEDULES", {})))
    problems.extend(_queue_limits(raw.get("QUEUES", {})))
    return problems


def concurrency_limit_problem(value: object) -> str | None:
    """Why ``value`` is not a concurrency limit (an int from 1 to
    :data:`MAX_CONCURRENCY_LIMIT`, or ``None`` for none), or ``None`` when it is one."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        return f"must be an int or None, not {value!r}"
    if not 1 <= value <= MAX_CONCURRENCY_LIMIT:
        return f"must be 1 to {MAX_CONCURRENCY_LIMIT}, not {value}"
    return None


def _queue_limits(queues: Any) -> list[tuple[str, str]]:
    """E021: ``JOBQ['QUEUES']`` maps queue names to dicts of valid limits."""
    if not isinstance(queues, dict):
        return [("django_jobq.E021", f"JOBQ['QUEUES'] must be a dict, not {queues!r}.")]
    problems = []
    for name, limits in queues.items():
        where = f"JOBQ['QUEUES'][{name!r}]"
        if not isinstance(name, str) or not QUEUE_NAME_RE.match(name):
            problems.append(
                (
                    "django_jobq.E021",
                    f"{where}: not a queue name (pattern {QUEUE_NAME_RE.pattern}).",
                )
            )
            continue
        if not isinstance(limits, dict):
            problems.append(("django_jobq.E021", f"{where} must be a dict, not {limits!r}."))
            continue
        unknown = sorted(map(str, set(limits) - QUEUE_LIMIT_KEYS))
        if unknown:
            problems.append(
                (
                    "django_jobq.E021",
                    f"{where} has unknown key(s) {', '.join(unknown)}; known: "
                    f"{', '.join(sorted(QUEUE_LIMIT_KEYS))}.",
                )
            )
        problem = concurrency_limit_problem(limits.get("CONCURRENCY_LIMIT"))
        if problem:
            problems.append(("django_jobq.E021", f"{where}['CONCURRENCY_LIMIT'] {problem}."))
        rate = limits.get("RATE_LIMIT")
        if rate is not None:
            try:
                parse_rate(rate)
            except ValueError as exc:
                problems.append(("django_jobq.E021", f"{where}['RATE_LIMIT']: {exc}."))
    return problems


def _connection_timeouts(durations: dict[str, float]) -> list[tuple[str, str]]:
    """Problems in ``CONNECT_TIMEOUT`` (E015) and ``STATEMENT_TIMEOUT`` (E016), given the
    durations that are valid seconds (type errors are E003's)."""
    problems: list[tuple[str, str]] = []
    for key, check_id, (low, high) in (
        ("CONNECT_TIMEOUT", "django_jobq.E015", CONNECT_TIMEOUT_RANGE),
        ("STATEMENT_TIMEOUT", "django_jobq.E016", STATEMENT_TIMEOUT_RANGE),
    ):
        seconds = durations.get(key)
        if seconds is not None and not low <= seconds <= high:
            problems.append(
                (check_id, f"JOBQ[{key!r}] must be {low:g} to {high:g} seconds, not {seconds:g}.")
            )
    return problems


def _unknown_kind_grace(raw: dict[str, Any]) -> list[tuple[str, str]]:
    """Problems in ``UNKNOWN_KIND_GRACE`` (E018): ``None``, or seconds (a timedelta) in
    :data:`UNKNOWN_KIND_GRACE_RANGE`."""
    value = raw.get("UNKNOWN_KIND_GRACE", JobqSettings.UNKNOWN_KIND_GRACE)
    if value is None:
        return []
    seconds = duration_seconds(value)
    low, high = UNKNOWN_KIND_GRACE_RANGE
    if seconds is not None and low <= seconds <= high:
        return []
    return [
        (
            "django_jobq.E018",
            f"JOBQ['UNKNOWN_KIND_GRACE'] = {value!r} must be None (wait forever) or "
            f"{low:g} s to 10 years, as seconds or a timedelta.",
        )
    ]


def statement_timeout(config: JobqSettings) -> float:
    """Seconds a worker's own statement may take (``JOBQ['STATEMENT_TIMEOUT']``, or a third
    of ``VISIBILITY_TIMEOUT``, at least :data:`MIN_DERIVED_STATEMENT_TIMEOUT`)."""
    if config.STATEMENT_TIMEOUT is not None:
        return config.STATEMENT_TIMEOUT
    derived = max(config.VISIBILITY_TIMEOUT / 3, MIN_DERIVED_STATEMENT_TIMEOUT)
    return min(derived, STATEMENT_TIMEOUT_RANGE[1])


def _observability_values(raw: dict[str, Any]) -> list[tuple[str, str]]:
    """Problems in ``METRICS_TOKEN`` (E012) and ``ALERT_DEAD_LETTERS`` (E003)."""
    problems: list[tuple[str, str]] = []
    token = raw.get("METRICS_TOKEN")
    if token is not None and (
        not isinstance(token, str)
        or len(token) < MIN_METRICS_TOKEN_LENGTH
        or token != token.strip()
    ):
        problems.append(
            (
                "django_jobq.E012",
                f"JOBQ['METRICS_TOKEN'] must be None or a string of at least "
                f"{MIN_METRICS_TOKEN_LENGTH} characters without surrounding whitespace "
                f"(e.g. from secrets.token_urlsafe()).",
            )
        )
    limit = raw.get("ALERT_DEAD_LETTERS", JobqSettings.ALERT_DEAD_LETTERS)
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0):
        problems.append(
            (
                "django_jobq.E003",
                f"JOBQ['ALERT_DEAD_LETTERS'] = {limit!r} must be an int >= 0, or None.",
            )
        )
    return problems


def _schedules_shape(schedules: Any) -> list[tuple[str, str]]:
    """Problems in the shape of ``JOBQ['SCHEDULES']``: a dict of name -> dict with known keys,
    including ``kind`` and ``cron``. The values are the schedules check's business."""
    if not isinstance(schedules, dict):
        return [("django_jobq.E006", "JOBQ['SCHEDULES'] must be a dict of name -> schedule dict.")]
    problems: list[tuple[str, str]] = []
    for name, spec in schedules.items():
        where = f"JOBQ['SCHEDULES'][{name!r}]"
        if not isinstance(spec, dict):
            problems.append(("django_jobq.E006", f"{where} must be a dict."))
            continue
        for key in sorted(set(spec) - SCHEDULE_KEYS, key=repr):
            problems.append(
                (
                    "django_jobq.E006",
                    f"{where} has an unknown key {key!r}; known keys: "
                    f"{', '.join(sorted(SCHEDULE_KEYS))}.",
                )
            )
        for key in sorted({"kind", "cron"} - set(spec)):
            problems.append(("django_jobq.E006", f"{where} lacks the required key {key!r}."))
    return problems


def get_settings() -> JobqSettings:
    """Return the current ``JOBQ`` setting merged over the defaults.

    The result is cached until ``settings.JOBQ`` is replaced (``override_settings`` replaces
    it); a dict changed in place is not noticed.

    Raises:
        ImproperlyConfigured: the setting is invalid (the message is the system check's).
    """
    global _resolved
    raw = _raw_setting()
    cached = _resolved
    if cached is not None and cached[0] is raw:
        return cached[1]
    problems = validate(raw)
    if problems:
        raise ImproperlyConfigured("; ".join(f"{msg} ({check_id})" for check_id, msg in problems))
    values = dict(raw)
    for key in (*_DURATION_KEYS, "UNKNOWN_KIND_GRACE"):
        if values.get(key) is not None:
            values[key] = duration_seconds(values[key])
    resolved = JobqSettings(**values)
    _resolved = (raw, resolved)
    return resolved


#: The ``OPTIONS`` of a ``TASKS`` entry using ``JobqBackend``: defaults for its tasks.
TASKS_OPTION_KEYS = (
    "MAX_ATTEMPTS",
    "VISIBILITY_TIMEOUT",
    "RETRY_BACKOFF_BASE",
    "RETRY_BACKOFF_CAP",
)


def validate_tasks_backend(alias: str, params: Any) -> list[tuple[str, str]]:
    """Return the problems in the ``TASKS[alias]`` entry of a ``JobqBackend`` as
    ``(check id, message)`` pairs (all ``django_jobq.E010``); an empty list means usable.

    ``QUEUES`` (if given) must be a non-empty list of queue names; ``OPTIONS`` may hold the
    keys of :data:`TASKS_OPTION_KEYS`, valued as the ``JOBQ`` keys of the same names.
    """
    where = f"TASKS[{alias!r}]"
    if not isinstance(params, dict):
        return [("django_jobq.E010", f"{where} must be a dict.")]
    problems: list[str] = []
    queues = params.get("QUEUES", ["default"])
    if not isinstance(queues, list | tuple | set) or not queues:
        problems.append(f"{where}['QUEUES'] must be a non-empty list of queue names.")
    else:
        problems.extend(
            f"{where}['QUEUES'] has {queue!r}, not a valid queue name "
            f"(pattern {QUEUE_NAME_RE.pattern})."
            for queue in sorted(queues, key=repr)
            if not isinstance(queue, str) or not QUEUE_NAME_RE.match(queue)
        )
    options = params.get("OPTIONS", {})
    if not isinstance(options, dict):
        problems.append(f"{where}['OPTIONS'] must be a dict.")
        options = {}
    for key in sorted(set(options) - set(TASKS_OPTION_KEYS), key=repr):
        problems.append(
            f"{where}['OPTIONS'] has an unknown key {key!r}; known keys: "
            f"{', '.join(TASKS_OPTION_KEYS)}."
        )
    # The values follow the JOBQ keys' rules (and messages), said of OPTIONS instead.
    known = {key: options[key] for key in TASKS_OPTION_KEYS if key in options}
    problems.extend(
        message.replace("JOBQ[", f"{where}['OPTIONS'][") for _, message in validate(known)
    )
    return [("django_jobq.E010", message) for message in problems]
