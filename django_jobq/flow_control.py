"""Flow control for operators: pause and resume queues, change the fleet-wide limits of
queues and kinds at run time, and read them back.

::

    from datetime import timedelta
    from django_jobq import flow_control

    flow_control.pause_queue("emails")                             # until resumed
    flow_control.pause_queue("emails", until=timedelta(minutes=30))  # or seconds: 1800.0
    flow_control.resume_queue("emails")                            # -> True: it was paused
    flow_control.set_queue_limits("emails", concurrency_limit=3, rate_limit="100/s")
    flow_control.set_queue_limits("emails")                        # back to JOBQ['QUEUES']'s
    flow_control.set_kind_limits("shop.jobs.charge", rate_limit="600/m")
    for queue in flow_control.queue_states():                      # -> [QueueControl]
        print(queue.name, queue.paused, queue.concurrency_limit, queue.concurrency_limit_source)

What a pause does (docs/flow-control.md): from the first claim after the pause
commits, no worker claims the queue's jobs; jobs already running finish (and their retries
wait for the resume); enqueue still works, the jobs wait; the pause is a row in
``jobq_queue``, so it survives worker restarts and deploys. ``until`` ends it by itself at
that time on the database clock.

Limits: a limit an operator sets here (stored in ``jobq_queue`` / ``jobq_kind_limit``)
overrides the code's (``JOBQ['QUEUES']`` for a queue, ``@job(concurrency_limit=...,
rate_limit=...)`` for a kind); ``None`` removes the override, and the code's applies again.
Rate limits are written ``<count>/<window>`` (:mod:`django_jobq.rates`: ``"100/s"``,
``"600/m"``, ``"5/10s"``).

Workers read these rows at each claim, so a change needs no restart. Each write is one
statement (:mod:`django_jobq.sql.flow_control`) on the queue database
(``JOBQ['DATABASE']``); called inside ``transaction.atomic()`` it commits with the caller's
transaction. A resume or a limit change also wakes the idle workers of each queue concerned
at commit (``pg_notify``): for a kind, the kind's queue in this process's registry and every
queue that holds ready jobs of the kind.

Which queues exist: :func:`known_queues` (the code's and the database's), which
:func:`pause_queue` and :func:`set_queue_limits` check their queue against, so a typo fails
with :class:`~django_jobq.exceptions.UnknownQueue` instead of pausing nothing.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum
from typing import Any, Final, Literal

from django.db import connections
from django.utils import timezone
from psycopg.rows import dict_row

from . import registry, sql, task_results
from .conf import KIND_NAME_RE, MAX_DURATION, QUEUE_NAME_RE, concurrency_limit_problem, get_settings
from .exceptions import UnknownQueue
from .flow_state import operator_limits
from .models import PAUSE_TIMES, WORKER_STALE_AFTER, KindLimit
from .rates import parse_rate


class _Unchanged(Enum):
    UNCHANGED = "UNCHANGED"

    def __repr__(self) -> str:
        return "flow_control.UNCHANGED"


#: Pass as a limit to :func:`set_queue_limits` or :func:`set_kind_limits` to keep the
#: operators' value stored for it (``None`` removes it).
UNCHANGED: Final = _Unchanged.UNCHANGED

#: Where an effective limit comes from: ``"operator"`` (set at run time, this module or
#: the Queues admin page), ``"setting"`` (``JOBQ['QUEUES']``, for a queue), ``"code"``
#: (``@job(concurrency_limit=..., rate_limit=...)``, for a kind), or ``None`` when there is
#: no limit.
LimitSource = Literal["operator", "setting", "code"] | None


@dataclass(frozen=True)
class Pause:
    """A queue's pause as stored: paused since ``paused_at``, until ``paused_until``
    (``None``: until resumed); database-clock times."""

    queue: str
    paused_at: datetime
    paused_until: datetime | None


@dataclass(frozen=True)
class QueueControl:
    """What flow control says of one known queue now.

    ``paused`` is whether its pause is in effect (on the database clock), ``paused_at`` and
    ``paused_until`` the pause's times (``None`` when not paused, and where a row written by
    hand holds a time no datetime holds: since an unknown time, until resumed).
    ``concurrency_limit`` (jobs running at once, fleet-wide) and ``rate_limit`` (jobs
    started per window) are the effective limits, those workers apply, ``None`` for none;
    each ``*_source`` says where it comes from (:data:`LimitSource`).
    ``operator_concurrency_limit`` and ``operator_rate_limit`` are the run-time overrides
    stored (``None``: none; one that is not a limit is stored but does not apply, see
    :func:`~django_jobq.flow_state.operator_limits`), ``setting_*`` the ``JOBQ['QUEUES']``
    values.
    ``has_row``: the queue has a ``jobq_queue`` row (it was paused or limited once).
    """

    name: str
    paused: bool
    paused_at: datetime | None
    paused_until: datetime | None
    concurrency_limit: int | None
    concurrency_limit_source: LimitSource
    rate_limit: str | None
    rate_limit_source: LimitSource
    operator_concurrency_limit: int | None
    operator_rate_limit: str | None
    setting_concurrency_limit: int | None
    setting_rate_limit: str | None
    has_row: bool


@dataclass(frozen=True)
class KindControl:
    """A kind's fleet-wide limits now, as :class:`QueueControl` has a queue's: the
    effective ``concurrency_limit`` and ``rate_limit`` with their sources, the operators'
    overrides (``operator_*``) and ``@job``'s values (``setting_*``). ``registered``: this
    process's registry has the kind."""

    kind: str
    concurrency_limit: int | None
    concurrency_limit_source: LimitSource
    rate_limit: str | None
    rate_limit_source: LimitSource
    operator_concurrency_limit: int | None
    operator_rate_limit: str | None
    setting_concurrency_limit: int | None
    setting_rate_limit: str | None
    registered: bool


def _effective(
    operator: Any, code: Any, code_source: Literal["setting", "code"]
) -> tuple[Any, LimitSource]:
    """The limit in effect and its source: the operator's override wins over the code's
    (``code_source``: the setting's, for a queue; ``@job``'s, for a kind)."""
    if operator is not None:
        return operator, "operator"
    if code is not None:
        return code, code_source
    return None, None


# -- validation ------------------------------------------------------------------------------


def check_queue_name(queue: object) -> str:
    """``queue`` if it is a queue name (:data:`~django_jobq.conf.QUEUE_NAME_RE`).

    Raises:
        TypeError: not a str. ValueError: not a queue name; both name the field ``queue``.
    """
    return _check_name(
        "queue",
        queue,
        QUEUE_NAME_RE,
        "a letter or digit, then letters, digits, '_', '.' or '-', at most 63 characters",
    )


def check_kind_name(kind: object) -> str:
    """``kind`` if it is a kind name (:data:`~django_jobq.conf.KIND_NAME_RE`).

    Raises:
        TypeError: not a str. ValueError: not a kind name; both name the field ``kind``.
    """
    return _check_name(
        "kind",
        kind,
        KIND_NAME_RE,
        "a letter or '_', then letters, digits or '_', '.', ':', '-', at most 200 characters",
    )


def _check_name(field: str, value: object, pattern: re.Pattern[str], rule: str) -> str:
    """``value`` if it is a str that ``pattern`` matches; else the error naming ``field``."""
    if not isinstance(value, str):
        raise TypeError(f"{field} must be a {field} name (str), not {value!r}")
    if not pattern.match(value):
        raise ValueError(f"{field} {value!r} is not a {field} name: {rule}")
    return value


def check_concurrency_limit(value: object) -> int | None:
    """``value`` if it is a concurrency limit: an int from 1 to
    :data:`~django_jobq.conf.MAX_CONCURRENCY_LIMIT`, or ``None`` for none.

    Raises:
        TypeError: not an int (a bool is not). ValueError: out of range. Both name the field
        ``concurrency_limit``.
    """
    problem = concurrency_limit_problem(value)
    if problem is None:
        return value  # type: ignore[return-value]  # an int or None, as checked
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"concurrency_limit {problem}")
    raise ValueError(f"concurrency_limit {problem}")


def check_rate_limit(value: object) -> str | None:
    """``value`` if it is a rate limit in the grammar of :mod:`django_jobq.rates`
    (``"100/s"``), or ``None`` for none.

    Raises:
        TypeError: not a str. ValueError: not in the grammar. Both name the field
        ``rate_limit``.
    """
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"rate_limit must be a str such as '100/s', or None, not {value!r}")
    try:
        parse_rate(value)
    except ValueError as exc:
        raise ValueError(f"rate_limit: {exc}") from None
    return value


def _pause_end(until: object) -> tuple[datetime | None, float | None]:
    """``until`` as ``PAUSE_QUEUES`` takes it: an absolute time, or seconds from now.

    Raises:
        TypeError: not a datetime, timedelta, number or None. ValueError: a naive datetime
        or one after ``models.PAUSE_TIMES``, or a duration not more than 0 and at most 10
        years. Both name the field ``until``.
    """
    if until is None:
        return None, None
    if isinstance(until, datetime):
        if timezone.is_naive(until):
            raise ValueError(
                f"until must be an aware datetime (with a time zone, e.g. "
                f"django.utils.timezone.now() + ...), not the naive {until.isoformat()}"
            )
        if until > PAUSE_TIMES[1]:
            raise ValueError(
                f"until must be before {PAUSE_TIMES[1].date().isoformat()} (the pauses' "
                f"CHECK constraint), not {until.isoformat()}"
            )
        return until, None
    if isinstance(until, timedelta):
        seconds = until.total_seconds()
    elif isinstance(until, int | float) and not isinstance(until, bool):
        seconds = float(until)
    else:
        raise TypeError(
            f"until must be an aware datetime, a timedelta, seconds (a number) or None, "
            f"not {until!r}"
        )
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_DURATION):
        raise ValueError(
            f"until: a pause's duration must be more than 0 s and at most 10 years, not {until!r}"
        )
    return None, seconds


# -- which queues exist ----------------------------------------------------------------------


def configured_queues() -> list[str]:
    """The queues this project's code names, sorted: ``JOBQ['DEFAULT_QUEUE']``, the keys of
    ``JOBQ['QUEUES']``, each registered kind's queue, and the ``QUEUES`` of each ``TASKS``
    entry on ``JobqBackend``. Reads no database."""
    config = get_settings()
    default = config.DEFAULT_QUEUE
    queues = {default, *config.QUEUES}
    queues.update(definition.queue or default for definition in registry.definitions())
    try:
        backends = task_results.jobq_backends()
    except ImportError:  # the system check django_jobq.E011 says why
        backends = {}
    for params in backends.values():
        named = params.get("QUEUES", ["default"])  # Django's default; E010 reports bad ones
        if isinstance(named, list | tuple | set):
            queues.update(queue for queue in named if isinstance(queue, str))
    return sorted(queues)


def _controls_rows() -> list[dict[str, Any]]:
    """``QUEUE_CONTROLS``' rows of queues: not those whose name is none (a row written by
    hand past the table's CHECK constraint; nothing can enqueue into it)."""
    with connections[get_settings().DATABASE].cursor() as cursor:
        cursor.cursor.row_factory = dict_row  # the psycopg cursor Django wraps
        cursor.execute(
            sql.flow_control.QUEUE_CONTROLS,
            {"named": configured_queues(), "stale_after": WORKER_STALE_AFTER},
        )
        rows: list[dict[str, Any]] = cursor.fetchall()
    return [row for row in rows if QUEUE_NAME_RE.match(row["name"])]


def queue_states() -> list[QueueControl]:
    """Every known queue's pause and limits now, sorted by name (one statement,
    ``sql.flow_control.QUEUE_CONTROLS``; its cost does not grow with the backlog).

    Known queues: those the code names (:func:`configured_queues`), those with a
    ``jobq_queue`` row (paused or limited once), those holding ready jobs, and those live
    workers serve. Queue depths are :func:`django_jobq.stats.queue_states`'s business.

    Raises:
        django.db.DatabaseError: the queue database cannot be read.
    """
    settings_limits = get_settings().QUEUES
    controls = []
    for row in _controls_rows():
        setting = settings_limits.get(row["name"], {})
        setting_concurrency = setting.get("CONCURRENCY_LIMIT")
        setting_rate = setting.get("RATE_LIMIT")
        applied_concurrency, applied_rate = operator_limits(
            "queue", row["name"], row["concurrency_limit"], row["rate_limit"]
        )
        concurrency, concurrency_source = _effective(
            applied_concurrency, setting_concurrency, "setting"
        )
        rate, rate_source = _effective(applied_rate, setting_rate, "setting")
        controls.append(
            QueueControl(
                name=row["name"],
                paused=row["paused"],
                paused_at=row["paused_at"] if row["paused"] else None,
                paused_until=row["paused_until"] if row["paused"] else None,
                concurrency_limit=concurrency,
                concurrency_limit_source=concurrency_source,
                rate_limit=rate,
                rate_limit_source=rate_source,
                operator_concurrency_limit=row["concurrency_limit"],
                operator_rate_limit=row["rate_limit"],
                setting_concurrency_limit=setting_concurrency,  # type: ignore[arg-type]
                setting_rate_limit=setting_rate,  # type: ignore[arg-type]
                has_row=row["has_row"],
            )
        )
    return controls


def known_queues() -> list[str]:
    """The names of :func:`queue_states`' queues, sorted (one statement)."""
    return [row["name"] for row in _controls_rows()]


def queue_state(queue: str) -> QueueControl | None:
    """:func:`queue_states`' entry for ``queue``, or ``None`` if it is not a known queue."""
    return next((control for control in queue_states() if control.name == queue), None)


def _check_known(queues: list[str]) -> None:
    """Raise :class:`UnknownQueue` for the first of ``queues`` that is not known."""
    known = known_queues()
    for queue in queues:
        if queue not in known:
            close = difflib.get_close_matches(queue, known, n=1)
            raise UnknownQueue(queue, close[0] if close else None)


def kind_limits() -> list[KindControl]:
    """Every kind with a limit, effective or stored, sorted by kind: the registered kinds
    with ``@job(concurrency_limit=..., rate_limit=...)``, and the kinds with a
    ``jobq_kind_limit`` row (one query of that small table).

    Raises:
        django.db.DatabaseError: the queue database cannot be read.
    """
    stored = KindLimit.objects.using(get_settings().DATABASE)
    rows = {
        row.kind: row
        for row in stored.only("kind", "concurrency_limit", "rate_limit")
        if KIND_NAME_RE.match(row.kind)  # not a row written by hand past the CHECK constraint
    }
    definitions = {
        definition.kind: definition
        for definition in registry.definitions()
        if definition.concurrency_limit is not None or definition.rate_limit is not None
    }
    controls = []
    for kind in sorted({*rows, *definitions}):
        row = rows.get(kind)
        definition = registry.get(kind)
        if definition is not None and definition.kind != kind:
            definition = None  # an alias: its jobs are stored under its own name
        operator_concurrency = row.concurrency_limit if row else None
        operator_rate = row.rate_limit if row else None
        setting_concurrency = definition.concurrency_limit if definition else None
        setting_rate = definition.rate_limit if definition else None
        applied_concurrency, applied_rate = operator_limits(
            "kind", kind, operator_concurrency, operator_rate
        )
        concurrency, concurrency_source = _effective(
            applied_concurrency, setting_concurrency, "code"
        )
        rate, rate_source = _effective(applied_rate, setting_rate, "code")
        controls.append(
            KindControl(
                kind=kind,
                concurrency_limit=concurrency,
                concurrency_limit_source=concurrency_source,
                rate_limit=rate,
                rate_limit_source=rate_source,
                operator_concurrency_limit=operator_concurrency,
                operator_rate_limit=operator_rate,
                setting_concurrency_limit=setting_concurrency,
                setting_rate_limit=setting_rate,
                registered=definition is not None,
            )
        )
    return controls


# -- pausing and resuming --------------------------------------------------------------------


def _names(queues: Iterable[str]) -> list[str]:
    if isinstance(queues, str):
        raise TypeError(f"queues must be an iterable of queue names, not the str {queues!r}")
    return sorted({check_queue_name(queue) for queue in queues})


def pause_queues(
    queues: Iterable[str],
    *,
    until: datetime | timedelta | float | None = None,
    allow_unknown: bool = False,
) -> list[Pause]:
    """Pause ``queues`` in one statement (``sql.flow_control.PAUSE_QUEUES``); see
    :func:`pause_queue`. Returns their pauses, sorted by queue."""
    names = _names(queues)
    at, seconds = _pause_end(until)
    if not names:
        return []
    if not allow_unknown:
        _check_known(names)
    with connections[get_settings().DATABASE].cursor() as cursor:
        cursor.execute(
            sql.flow_control.PAUSE_QUEUES, {"names": names, "until": at, "seconds": seconds}
        )
        rows = cursor.fetchall()
    if not rows:  # the statement writes nothing for an end that is not in the future
        assert at is not None
        raise ValueError(
            f"until must be in the future (on the database clock), not {at.isoformat()}"
        )
    return [Pause(queue, paused_at, paused_until) for queue, paused_at, paused_until in rows]


def pause_queue(
    queue: str,
    *,
    until: datetime | timedelta | float | None = None,
    allow_unknown: bool = False,
) -> Pause:
    """Pause ``queue``: from the first claim after this commits, no worker claims its jobs.

    Jobs already running finish (their outcomes are recorded as usual); enqueue still
    works; the pause survives worker restarts. Pausing a paused queue keeps its
    ``paused_at`` and replaces its end.

    Args:
        queue: a known queue (:func:`known_queues`).
        until: when the pause ends by itself: an aware ``datetime``, or a ``timedelta`` or
            seconds (float) from now, counted on the database clock; ``None``: until
            :func:`resume_queue`.
        allow_unknown: pause a queue that nothing names yet (a queue of a service that is
            not deployed yet), instead of raising ``UnknownQueue``.

    Returns:
        The :class:`Pause` as stored (database-clock times).

    Raises:
        UnknownQueue: ``queue`` is not known (the message suggests the closest known one).
        TypeError, ValueError: an invalid ``queue`` or ``until`` (a naive datetime, a time
            not in the future or after 9999-12-30, a duration not more than 0 or over 10
            years); the message names the field.
    """
    (pause,) = pause_queues([queue], until=until, allow_unknown=allow_unknown)
    return pause


def resume_queues(queues: Iterable[str]) -> list[str]:
    """Resume ``queues`` in one statement (``sql.flow_control.RESUME_QUEUES``) and wake their
    workers at commit; return those whose pause was in effect, sorted."""
    names = _names(queues)
    if not names:
        return []
    with connections[get_settings().DATABASE].cursor() as cursor:
        cursor.execute(
            sql.flow_control.RESUME_QUEUES,
            {"names": names, "channel": sql.wake.WAKE_CHANNEL},
        )
        return [name for name, was_paused, _ in cursor.fetchall() if was_paused]


def resume_queue(queue: str) -> bool:
    """Resume ``queue``: its jobs are claimed again from the first claim after this
    commits, and its idle workers are woken then.

    Args:
        queue: a queue name (an unknown one is simply not paused).

    Returns:
        Whether it was paused (a pause whose ``until`` had passed was not; its times are
        cleared all the same).

    Raises:
        TypeError, ValueError: ``queue`` is not a queue name.
    """
    return bool(resume_queues([queue]))


# -- limits ----------------------------------------------------------------------------------


def _limit_params(concurrency_limit: object, rate_limit: object) -> dict[str, Any]:
    keep_concurrency = concurrency_limit is UNCHANGED
    keep_rate = rate_limit is UNCHANGED
    return {
        "concurrency_limit": None
        if keep_concurrency
        else check_concurrency_limit(concurrency_limit),
        "rate_limit": None if keep_rate else check_rate_limit(rate_limit),
        "keep_concurrency": keep_concurrency,
        "keep_rate": keep_rate,
        "channel": sql.wake.WAKE_CHANNEL,
    }


def set_queue_limits(
    queue: str,
    *,
    concurrency_limit: int | _Unchanged | None = None,
    rate_limit: str | _Unchanged | None = None,
    allow_unknown: bool = False,
) -> None:
    """Replace the operators' limits of ``queue`` (one statement), and wake its idle
    workers at commit. Workers apply them from their next claim.

    Args:
        queue: a known queue (:func:`known_queues`).
        concurrency_limit: the most jobs of the queue running at once across the fleet, an
            int from 1 to 2**31 - 1; ``None``: no override, ``JOBQ['QUEUES']``'s applies;
            :data:`UNCHANGED`: keep the override stored.
        rate_limit: the most jobs of the queue started per window across the fleet, e.g.
            ``"100/s"`` (:mod:`django_jobq.rates`); ``None`` and :data:`UNCHANGED` as above.
        allow_unknown: limit a queue that nothing names yet, instead of raising.

    Raises:
        UnknownQueue: ``queue`` is not known.
        TypeError, ValueError: an invalid ``queue``, ``concurrency_limit`` or
            ``rate_limit``; the message names the field.
    """
    check_queue_name(queue)
    params = {"name": queue, **_limit_params(concurrency_limit, rate_limit)}
    if not allow_unknown:
        _check_known([queue])
    with connections[get_settings().DATABASE].cursor() as cursor:
        cursor.execute(sql.flow_control.SET_QUEUE_LIMITS, params)


def set_kind_limits(
    kind: str,
    *,
    concurrency_limit: int | _Unchanged | None = None,
    rate_limit: str | _Unchanged | None = None,
) -> list[str]:
    """Replace the operators' limits of job kind ``kind`` (one statement), overriding
    ``@job(concurrency_limit=..., rate_limit=...)``; ``None`` removes an override,
    :data:`UNCHANGED` keeps it. The kind need not be registered in this process (another
    service's kind); the limit applies to jobs stored under exactly this kind.

    Returns:
        The queues whose idle workers are woken at commit: the kind's queue in this
        process's registry, and every queue holding ready jobs of the kind, sorted.

    Raises:
        TypeError, ValueError: an invalid ``kind``, ``concurrency_limit`` or
            ``rate_limit``; the message names the field.
    """
    check_kind_name(kind)
    params = {"kind": kind, **_limit_params(concurrency_limit, rate_limit)}
    definition = registry.get(kind)
    queues = []
    if definition is not None:
        queues.append(definition.queue or get_settings().DEFAULT_QUEUE)
    with connections[get_settings().DATABASE].cursor() as cursor:
        cursor.execute(sql.flow_control.SET_KIND_LIMITS, {**params, "queues": queues})
        return [queue for queue, _ in cursor.fetchall()]
