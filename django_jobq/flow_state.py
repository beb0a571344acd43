"""What a worker knows of flow control: which queues are paused and which queues and kinds
have a fleet-wide limit (docs/flow-control.md).

Operators pause queues and override limits in the database (:mod:`django_jobq.flow_control`);
code declares limits in ``JOBQ['QUEUES']`` (queues) and ``@job(concurrency_limit=...,
rate_limit=...)`` (kinds). :func:`load` reads the database's part (``sql.flow.FLOW_STATE``)
and merges it over the code's: a value an operator set wins, a NULL falls back to the code.
A worker claims by what it loaded, and every claim checks that the database still agrees
(the digest, ``sql.flow.FLOW_DIGEST``): when it does not, the claim leases nothing and the
worker loads again.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from . import registry, sql
from .claim_positions import ClaimPositions
from .claims import FlowGuard
from .conf import get_settings
from .rates import Rate, parse_rate

logger = logging.getLogger("django_jobq.flow_control")

#: Per scope, the table of the operators' limits and whose limit applies without them.
_OPERATOR_TABLES = {"queue": ("jobq_queue", "JOBQ['QUEUES']"), "kind": ("jobq_kind_limit", "@job")}


@dataclass(frozen=True)
class Limits:
    """A queue's or kind's fleet-wide limits: ``concurrency`` (the most jobs running at once)
    and ``rate`` (the most jobs started per window); ``None`` where there is none."""

    concurrency: int | None = None
    rate: Rate | None = None

    def __bool__(self) -> bool:
        return self.concurrency is not None or self.rate is not None


@dataclass
class FlowState:
    """Flow control as one worker loaded it.

    ``paused`` are the queues paused now; ``queue_limits`` and ``kind_limits`` the queues and
    kinds with a limit, effective values (an operator's over the code's). ``guard`` carries
    the digest that claims check. ``reload_at`` is the ``time.monotonic()`` moment the state
    stops being true by itself (the first "pause until" ends), or ``math.inf``.
    ``stuck_until``: per limit's ``(scope, name)``, the ``time.monotonic()`` until which its
    row, held elsewhere past the lock timeout, is not waited for
    (:mod:`django_jobq.limited_claims`). ``positions``: per set of limits a limited claim
    claims under (its ``(scope, name)`` keys), where its claims start reading
    (:mod:`django_jobq.claim_positions`); loading the state again starts them afresh.
    ``claim_first``: the last limited claim's count found every limit far from binding
    (:func:`django_jobq.limited_claims.far_from_binding`), so the next one claims before it
    locks and counts. ``walk_next``: the sets of limits (as in ``positions``) whose last
    claim, made in one round trip, found jobs its first statement could not reach: the
    next claim under them runs every statement a claim may need.
    """

    guard: FlowGuard
    paused: frozenset[str] = frozenset()
    queue_limits: dict[str, Limits] = field(default_factory=dict)
    kind_limits: dict[str, Limits] = field(default_factory=dict)
    reload_at: float = math.inf
    stuck_until: dict[tuple[str, str], float] = field(default_factory=dict)
    positions: dict[tuple[tuple[str, str], ...], ClaimPositions] = field(default_factory=dict)
    claim_first: bool = False
    walk_next: set[tuple[tuple[str, str], ...]] = field(default_factory=set)

    @property
    def stale(self) -> bool:
        """Whether to load again: a claim saw the digest change, or a pause ran out."""
        return self.guard.changed or time.monotonic() >= self.reload_at

    def excluded_queues(self) -> frozenset[str]:
        """The queues a plain claim must leave out: paused, or with a limit of their own."""
        return self.paused | frozenset(self.queue_limits)

    def unlimited_kinds(self, kinds: Iterable[str]) -> list[str]:
        """``kinds`` without those that have a limit of their own."""
        return [kind for kind in kinds if kind not in self.kind_limits]


def load(cursor: psycopg.Cursor[Any]) -> FlowState:
    """Read the pauses and limits (one statement, ``sql.flow.FLOW_STATE``), merge them over
    the code's, and make sure each limited queue and kind has the row its limited claims
    lock (``sql.flow.ENSURE_LIMIT_STATES``, a second statement only when there is a limit).

    Args:
        cursor: an autocommit psycopg cursor on the queue database.

    Returns:
        The :class:`FlowState`.

    Raises:
        psycopg.Error: a statement failed.

    A limit a row holds that Python refuses is ignored for the code's value, with a warning
    (:func:`operator_limits`).
    """
    cursor.execute(sql.flow.FLOW_STATE)
    row = cursor.fetchone()
    assert row is not None
    digest, queue_rows, kind_rows = row
    queue_rows = json.loads(queue_rows) if isinstance(queue_rows, str) else queue_rows
    kind_rows = json.loads(kind_rows) if isinstance(kind_rows, str) else kind_rows
    paused: set[str] = set()
    resumes_in = math.inf
    operator_queue_limits: dict[str, tuple[Any, Any]] = {}
    for name, is_paused, seconds_until_resume, concurrency, rate in queue_rows:
        if is_paused:
            paused.add(name)
            if seconds_until_resume is not None:
                resumes_in = min(resumes_in, max(0.0, seconds_until_resume))
        operator_queue_limits[name] = operator_limits("queue", name, concurrency, rate)
    settings_limits = {
        name: (limits.get("CONCURRENCY_LIMIT"), limits.get("RATE_LIMIT"))
        for name, limits in get_settings().QUEUES.items()
    }
    queue_limits = _merged(settings_limits, operator_queue_limits)
    code_kind_limits = {
        definition.kind: (definition.concurrency_limit, definition.rate_limit)
        for definition in registry.definitions()
        if definition.concurrency_limit is not None or definition.rate_limit is not None
    }
    operator_kind_limits = {
        kind: operator_limits("kind", kind, concurrency, rate)
        for kind, concurrency, rate in kind_rows
    }
    kind_limits = _merged(code_kind_limits, operator_kind_limits)
    ensure_limit_states(
        cursor,
        [("queue", name) for name in queue_limits] + [("kind", name) for name in kind_limits],
    )
    return FlowState(
        guard=FlowGuard(digest),
        paused=frozenset(paused),
        queue_limits=queue_limits,
        kind_limits=kind_limits,
        reload_at=time.monotonic() + resumes_in,
    )


def ensure_limit_states(cursor: psycopg.Cursor[Any], keys: Sequence[tuple[str, str]]) -> None:
    """Make sure each limited queue and kind of ``keys`` (``(scope, name)`` pairs) has the row
    its limited claims lock (``sql.flow.ENSURE_LIMIT_STATES``: no statement for no key; it
    writes nothing for the rows that exist, and waits for no row lock).

    Raises:
        psycopg.Error: the statement failed.
    """
    if keys:
        cursor.execute(
            sql.flow.ENSURE_LIMIT_STATES,
            {"scopes": [scope for scope, _ in keys], "names": [name for _, name in keys]},
        )


def operator_limits(
    scope: str, name: str, concurrency: object, rate: object
) -> tuple[int | None, str | None]:
    """The limits an operator stored for queue or kind ``name`` (``scope``: ``"queue"``,
    ``"kind"``) that apply: ``(concurrency, rate)`` as stored, each ``None`` where the row
    holds none or one that is not a limit (not an int of at least 1, not in the grammar of
    :mod:`django_jobq.rates`), then the code's applies. The table's CHECK constraints refuse
    those; a row written past them (the constraints dropped) gets a warning per such value
    on the logger ``django_jobq.flow_control``, each time it is read."""
    table, code = _OPERATOR_TABLES[scope]
    usable = (
        _concurrency(concurrency),
        rate if isinstance(rate, str) and _rate(rate) is not None else None,
    )
    for column, stored, value in zip(
        ("concurrency_limit", "rate_limit"), (concurrency, rate), usable, strict=True
    ):
        if stored is not None and value is None:
            logger.warning(
                "%s row of %s %r: %s %r ignored, it is not a limit (the table's CHECK "
                "constraints refuse it: were they dropped?); %s's applies. Set it again "
                "(flow_control, jobq_queues, the admin).",
                table,
                scope,
                name,
                column,
                stored,
                code,
            )
    return usable


def _merged(
    code: dict[str, tuple[Any, Any]], operator: dict[str, tuple[Any, Any]]
) -> dict[str, Limits]:
    """Effective limits per name: the operator's value where set, else the code's; only
    names with some limit."""
    merged = {}
    for name in code.keys() | operator.keys():
        code_concurrency, code_rate = code.get(name, (None, None))
        operator_concurrency, operator_rate = operator.get(name, (None, None))
        limits = Limits(
            concurrency=_concurrency(operator_concurrency) or _concurrency(code_concurrency),
            rate=_rate(operator_rate) or _rate(code_rate),
        )
        if limits:
            merged[name] = limits
    return merged


def _concurrency(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def _rate(value: object) -> Rate | None:
    if value is None:
        return None
    try:
        return parse_rate(value)
    except ValueError:
        return None


def digest_changed(cursor: psycopg.Cursor[Any], state: FlowState) -> bool:
    """Whether the pauses and limits changed since ``state`` was loaded
    (``sql.flow.SELECT_FLOW_DIGEST``): for a worker that had nothing to claim with."""
    cursor.execute(sql.flow.SELECT_FLOW_DIGEST)
    row = cursor.fetchone()
    changed = row is None or row[0] != state.guard.digest
    state.guard.changed = state.guard.changed or changed
    return changed


def served_limited_queues(state: FlowState, queues: Collection[str] | None) -> list[str]:
    """The limited queues among ``queues`` (``None``: every queue), not paused."""
    return sorted(
        name
        for name in state.queue_limits
        if name not in state.paused and (queues is None or name in queues)
    )
