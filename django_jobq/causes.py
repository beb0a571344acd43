"""Dead letters grouped by cause: an operator fixes one cause, then redrives (or deletes)
every dead letter it killed. A cause is a fingerprint (:mod:`django_jobq.fingerprints`);
the admin's "Dead letters by cause" page, ``jobq_deadletters --groups`` and ``jobq_redrive
--group`` use what is here::

    from django_jobq import causes

    page = causes.page(limit=50, offset=0)    # -> CausePage: the biggest causes first
    cause = causes.get("ValueError: order <n> uses the expired coupon <str>")  # or None
    causes.redrive(cause.fingerprint)         # -> Redriven(selected=120, created=120)
    causes.delete(cause.fingerprint)          # -> dead letters deleted

Reads and writes go to the queue's database (``JOBQ['DATABASE']``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from django.db import connections
from psycopg.rows import dict_row

from . import operations, sql
from .conf import get_settings
from .models import DeadLetter

#: Kinds listed per cause; a cause with more says so (``Cause.more_kinds``).
KINDS_SHOWN = 5


@dataclass(frozen=True)
class Cause:
    """The dead letters sharing one fingerprint: how many, when the first and the last
    died, their first :data:`KINDS_SHOWN` kinds in order (``more_kinds``: it has others),
    and the newest one (the highest id) as an example, with its reason and the first line
    of its error (at most 300 characters)."""

    fingerprint: str
    dead_letters: int
    first_died: datetime
    last_died: datetime
    kinds: list[str]
    more_kinds: bool
    example_id: int
    example_reason: str
    example_error: str


@dataclass(frozen=True)
class CausePage:
    """Some causes, the most dead letters first (then the most recent, then by
    fingerprint), with the number of causes and of dead letters in all."""

    causes: list[Cause]
    cause_count: int
    dead_letter_count: int


def _read(statement: str, params: dict[str, int | str]) -> CausePage:
    with connections[get_settings().DATABASE].cursor() as cursor:
        cursor.cursor.row_factory = dict_row  # the psycopg cursor Django wraps
        cursor.execute(statement, {**params, "kinds": KINDS_SHOWN + 1})
        rows: list[dict[str, Any]] = cursor.fetchall()
    found = [
        Cause(
            fingerprint=row["fingerprint"],
            dead_letters=row["dead_letters"],
            first_died=row["first_died"],
            last_died=row["last_died"],
            kinds=row["kinds"][:KINDS_SHOWN],
            more_kinds=len(row["kinds"]) > KINDS_SHOWN,
            example_id=row["example_id"],
            example_reason=row["example_reason"],
            example_error=row["example_error"],
        )
        for row in rows
        if row["dead_letters"] is not None
    ]
    # Every row carries the totals (one row, its cause columns NULL, when the page is empty).
    return CausePage(
        causes=found, cause_count=rows[0]["causes"], dead_letter_count=rows[0]["total"]
    )


def page(*, limit: int, offset: int = 0) -> CausePage:
    """The causes from the ``offset``-th (0: the biggest), at most ``limit`` of them (both
    whole numbers, ``limit`` at least 1). One statement (``sql.causes.DEAD_LETTER_CAUSES``)."""
    return _read(sql.causes.DEAD_LETTER_CAUSES, {"limit": limit, "offset": offset})


def get(fingerprint: str) -> Cause | None:
    """The cause ``fingerprint`` (exactly as stored), or ``None`` if no dead letter has it."""
    found = _read(
        sql.causes.DEAD_LETTER_CAUSE, {"fingerprint": fingerprint, "limit": 1, "offset": 0}
    )
    return found.causes[0] if found.causes else None


class Redriven(NamedTuple):
    """What :func:`redrive` did: ``created`` jobs from ``selected`` dead letters (the
    others were left in place: :data:`django_jobq.operations.LEFT_IN_PLACE_BECAUSE`)."""

    selected: int
    created: int


def redrive(fingerprint: str) -> Redriven:
    """Redrive every dead letter of the cause ``fingerprint`` with
    :func:`django_jobq.operations.redrive` (batches of 10,000, each one statement; the same
    refusals: a dead letter whose idempotency key a live job holds, or that cannot become a
    job, stays)."""
    dead_letters = DeadLetter.objects.using(get_settings().DATABASE)
    ids = list(
        dead_letters.filter(fingerprint=fingerprint).order_by("id").values_list("id", flat=True)
    )
    return Redriven(selected=len(ids), created=operations.redrive(ids))


def delete(fingerprint: str) -> int:
    """Delete every dead letter of the cause ``fingerprint``, in one statement
    (``sql.causes.DELETE_DEAD_LETTERS_OF_CAUSE``). Returns how many were deleted."""
    with connections[get_settings().DATABASE].cursor() as cursor:
        cursor.execute(sql.causes.DELETE_DEAD_LETTERS_OF_CAUSE, {"fingerprint": fingerprint})
        return int(cursor.rowcount)
