"""What operators do to the queue: cancel, run now, redrive. Used by the admin and the
``jobq_redrive`` command; each is a set-based statement, never a loop over rows.

::

    from django_jobq.operations import cancel, redrive

    cancel(job_id)                                            # -> bool
    redrive(DeadLetter.objects.filter(kind="shop.jobs.x"))    # -> number of new jobs
    redrive([12, 13, 14])
    redrive_one(12)                                           # -> the new job's id, or None
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import islice

from django.db import IntegrityError, connections, transaction
from django.db.models import QuerySet

from . import sql
from .conf import get_settings
from .models import DeadLetter

#: Dead letters redriven per statement: bounds the time each statement takes and the rows
#: it locks, however many dead letters are selected.
REDRIVE_BATCH_SIZE = 10_000
#: Why a redrive leaves a dead letter in place, as the admin and ``jobq_redrive`` say it:
#: its idempotency key is taken, or it is not a job (see ``sql.operations.REDRIVE_DEAD_LETTERS``),
#: or either.
KEY_HELD = "a live job of the same kind holds its idempotency key"
NOT_A_JOB = (
    "it cannot become a job as it is (the dead letter of a poison row: a payload that is not "
    "a JSON object, a visibility timeout outside 1 ms to 10 years)"
)
LEFT_IN_PLACE_BECAUSE = f"{KEY_HELD}, or {NOT_A_JOB}"


def _execute_returning_ids(statement: str, params: dict[str, list[int]]) -> list[int]:
    with connections[get_settings().DATABASE].cursor() as cursor:
        cursor.execute(statement, params)
        return [row[0] for row in cursor.fetchall()]


def cancel(job_id: int) -> bool:
    """Delete a ready job (or one waiting in its lane). Returns ``False`` if the job is
    running (its worker holds a lease: it cannot be cancelled this way) or no longer exists
    (finished, dead, cancelled)."""
    return bool(cancel_many([job_id]))


def cancel_many(job_ids: Iterable[int]) -> int:
    """Delete the ready jobs (and jobs waiting in their lane) among ``job_ids`` in one
    statement; return how many. The next job of each lane that lost its first job is made
    ready, in the same transaction."""
    alias = get_settings().DATABASE
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        cursor.execute(sql.operations.CANCEL_JOBS, {"ids": list(job_ids)})
        cancelled = cursor.fetchall()
        lanes = sorted({lane for _, lane in cancelled if lane is not None})
        if lanes:
            cursor.execute(
                sql.lanes.PROMOTE_LANES, {"lanes": lanes, "channel": sql.wake.WAKE_CHANNEL}
            )
    return len(cancelled)


def run_now(job_ids: Iterable[int]) -> int:
    """Make the scheduled or backing-off ready jobs among ``job_ids`` due now; return how
    many changed. Attempts are kept."""
    return len(_execute_returning_ids(sql.operations.RUN_JOBS_NOW, {"ids": list(job_ids)}))


def redrive_one(dead_letter_id: int) -> int | None:
    """Redrive one dead letter as :func:`redrive` does; return the new job's id, or ``None``
    if it was left in place (:data:`LEFT_IN_PLACE_BECAUSE`) or no longer exists."""
    ids = _redrive_batch([dead_letter_id])
    return ids[0] if ids else None


def _batches(ids: Iterable[int], size: int) -> Iterator[list[int]]:
    iterator = iter(ids)
    while batch := list(islice(iterator, size)):
        yield batch


def redrive(
    dead_letters: QuerySet[DeadLetter] | Iterable[int], *, batch_size: int = REDRIVE_BATCH_SIZE
) -> int:
    """Turn dead letters back into fresh jobs: same kind, queue, payload, priority,
    max_attempts, visibility timeout and idempotency key; attempts 0; due now; no expiry.

    Args:
        dead_letters: a ``DeadLetter`` queryset (e.g. the admin's filtered list) or ids.
        batch_size: dead letters per statement; each batch is one statement (insert the
            jobs and delete the dead letters together), so a crash never loses or doubles one.

    Returns:
        The number of jobs created. Dead letters whose idempotency key belongs to a live job
        of their kind (or to an older dead letter in the same call) are left in place, and so
        are those the jobs table's constraints would refuse (the dead letter of a poison row,
        see ``sql.operations.REDRIVE_DEAD_LETTERS``), so one of them never fails the others.
    """
    if isinstance(dead_letters, QuerySet):
        ids: Iterable[int] = list(dead_letters.order_by("id").values_list("id", flat=True))
    else:
        ids = dead_letters
    return sum(len(_redrive_batch(batch)) for batch in _batches(ids, batch_size))


#: Tries per batch: a retry happens only if a live job takes a redriven idempotency key
#: between the statement's check and its insert (see ``sql.operations.REDRIVE_DEAD_LETTERS``).
_REDRIVE_TRIES = 3


def _redrive_batch(ids: list[int]) -> list[int]:
    """Run ``REDRIVE_DEAD_LETTERS`` for one batch in a savepoint, retrying the rare race
    above (the retry's check then sees the new live job and leaves that dead letter)."""
    alias = get_settings().DATABASE
    tries = 1
    while True:
        try:
            with transaction.atomic(using=alias):
                return _execute_returning_ids(sql.operations.REDRIVE_DEAD_LETTERS, {"ids": ids})
        except IntegrityError:
            if tries == _REDRIVE_TRIES:
                raise
            tries += 1
