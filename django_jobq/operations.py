"""What operators do to the queue: cancel, run now, abort, redrive. Used by the admin and
the ``jobq_redrive`` command; each is a set-based statement, never a loop over rows.

::

    from django_jobq.operations import abort, cancel, redrive

    cancel(job_id)                                            # -> bool (a ready job)
    abort(job_id)                                             # -> bool (a running job)
    redrive(DeadLetter.objects.filter(kind="shop.jobs.x"))    # -> number of new jobs
    redrive([12, 13, 14])
    redrive_one(12)                                           # -> the new job's id, or None
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Any

from django.db import IntegrityError, connections, transaction
from django.db.models import QuerySet

from . import lanes, sql
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


def _execute_returning_ids(statement: str, params: dict[str, Any]) -> list[int]:
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
    ready once the deletion commits (:func:`django_jobq.lanes.promote_at_commit`: after the
    caller's transaction, if there is one)."""
    alias = get_settings().DATABASE
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        cursor.execute(sql.operations.CANCEL_JOBS, {"ids": list(job_ids)})
        cancelled = cursor.fetchall()
        lanes.promote_at_commit(alias, (lane for _, lane in cancelled if lane is not None))
    return len(cancelled)


#: The largest job id (``jobq_job.id`` is a ``bigint``).
_MAX_JOB_ID = 2**63 - 1


def _job_ids(job_ids: Iterable[int], argument: str) -> list[int]:
    """``job_ids`` as a list, each an ``int`` (not a ``bool``) a ``bigint`` holds.

    Raises:
        TypeError: ``job_ids`` is a ``str``/``bytes`` or not iterable, or an id is not an int.
        ValueError: an id is out of a bigint's range.
    """
    if isinstance(job_ids, str | bytes) or not isinstance(job_ids, Iterable):
        raise TypeError(f"{argument} must be an iterable of job ids (int), not {job_ids!r}.")
    ids = list(job_ids)
    for position, job_id in enumerate(ids):
        _check_job_id(job_id, f"{argument}[{position}]")
    return ids


def _check_job_id(job_id: object, argument: str) -> None:
    if not isinstance(job_id, int) or isinstance(job_id, bool):
        raise TypeError(f"{argument} must be a job id (int), not {job_id!r}.")
    if not -_MAX_JOB_ID - 1 <= job_id <= _MAX_JOB_ID:
        raise ValueError(f"{argument} must be a job id (a 64-bit integer), not {job_id}.")


def abort(job_id: int) -> bool:
    """Ask a running job to stop (docs/flow-control.md, "Aborting a running job").

    Sets the job's ``abort_requested_at`` (the first request's time is kept). The worker
    that holds its lease sees the request within half a heartbeat interval (a sixth of the
    visibility timeout); its handler sees ``JobContext.abort_requested`` and should stop
    (``ctx.raise_if_aborted()``), and the attempt then becomes a dead letter with reason
    "aborted", never retried. An async handler's task is cancelled. A handler that ignores
    the request and returns is acked as usual.

    Args:
        job_id: the job's id (``int``).

    Returns:
        ``True`` if the job is running and now has an abort requested (also when it already
        had one); ``False`` if it is ready or waiting (use :func:`cancel` for a ready job) or
        no longer exists.

    Raises:
        TypeError: ``job_id`` is not an ``int`` (a ``bool`` is refused too).
        ValueError: ``job_id`` is outside a 64-bit integer's range.
    """
    _check_job_id(job_id, "job_id")
    return bool(abort_many([job_id]))


def abort_many(job_ids: Iterable[int]) -> int:
    """Ask the running jobs among ``job_ids`` to stop, as :func:`abort` does, in one
    statement (``sql.aborts.REQUEST_ABORTS``).

    Returns:
        How many of them are running and now have an abort requested; the others (ready,
        waiting, gone, unknown) are left as they are.

    Raises:
        TypeError: ``job_ids`` is not an iterable of ``int`` (or is a ``str``), or one of
            them is a ``bool``; the message names the position (``job_ids[2]``).
        ValueError: an id is outside a 64-bit integer's range.
    """
    ids = _job_ids(job_ids, "job_ids")
    if not ids:
        return 0
    return len(_execute_returning_ids(sql.aborts.REQUEST_ABORTS, {"ids": ids}))


def run_now(job_ids: Iterable[int]) -> int:
    """Make the scheduled or backing-off ready jobs among ``job_ids`` due now; return how
    many changed. Attempts are kept. The workers of their queues are woken at the commit
    (a ``NOTIFY``, as enqueue sends)."""
    return len(
        _execute_returning_ids(
            sql.operations.RUN_JOBS_NOW,
            {"ids": list(job_ids), "channel": sql.wake.WAKE_CHANNEL},
        )
    )


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
    The workers of their queues are woken at the commit (a ``NOTIFY``, as enqueue sends).

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
    above (the retry's check then sees the new live job and leaves that dead letter). A job
    that joined its lane waiting gets its lane promoted at commit, as a new enqueue's does
    (:mod:`django_jobq.lanes`)."""
    alias = get_settings().DATABASE
    tries = 1
    while True:
        try:
            with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
                cursor.execute(
                    sql.operations.REDRIVE_DEAD_LETTERS,
                    {"ids": ids, "channel": sql.wake.WAKE_CHANNEL},
                )
                redriven = cursor.fetchall()
                lanes.promote_at_commit(alias, (lane for _, lane in redriven if lane is not None))
                return [job_id for job_id, _ in redriven]
        except IntegrityError:
            if tries == _REDRIVE_TRIES:
                raise
            tries += 1
