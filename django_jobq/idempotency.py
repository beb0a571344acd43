"""Exactly one business effect per job, although a job may be delivered more than once.

Two helpers, used inside a handler (see docs/idempotency.md for when to use which):

**Complete in the handler's transaction** — for jobs whose effect is a database write::

    @job(takes_context=True)
    def generate_invoice(ctx: JobContext, order_id: int) -> None:
        with ctx.atomic():                       # raises LeaseLost if the lease was lost
            Invoice.objects.create(order_id=order_id, ...)
        # committed together: the invoice, and the job's ack

The block is a ``transaction.atomic()`` on the queue's database whose last statement is the
job's fenced ack. If the ack matches nothing (another attempt holds the job now), the block
raises :class:`LeaseLost` and everything in it rolls back: a stale attempt's writes never
land. A redelivery after a crash cannot happen once the block committed: the job is gone.

**Dedup keys** — record that an effect happened, in the effect's own transaction::

    with transaction.atomic():
        with idempotent(f"invoice-{order_id}", kind="shop.invoice") as first_time:
            if first_time:
                Invoice.objects.create(order_id=order_id, ...)

The key is inserted into ``jobq_dedup_key`` (unique per kind and key) in the caller's
transaction. The first transaction to commit it gets ``first_time=True``; any other, even a
concurrent one, waits for it and gets ``False``. If the transaction rolls back, the key goes
with it. Keys are kept for ``JOBQ["DEDUP_RETENTION"]`` (default 30 days).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connections

from . import sql
from .conf import get_settings


class LeaseLost(Exception):
    """The job's lease was lost before its transaction committed: another attempt holds the
    job, so this attempt's writes were rolled back. Let it propagate; the worker records
    nothing for this attempt."""


def _queue_connection_in_transaction(what: str) -> str:
    alias = get_settings().DATABASE
    if not connections[alias].in_atomic_block:
        raise RuntimeError(
            f"{what} must run inside transaction.atomic(using={alias!r}) (or ctx.atomic()), "
            f"so the key commits or rolls back with the effect it records."
        )
    return alias


@contextmanager
def idempotent(key: str, *, kind: str, job_id: int | None = None) -> Iterator[bool]:
    """Record ``(kind, key)`` in the current transaction; yield whether it is new.

    Args:
        key: the effect's natural key, e.g. ``f"invoice-{order_id}"`` (at most 200 chars).
        kind: a namespace for keys, e.g. the job kind (at most 200 chars).
        job_id: stored with the key, for inspection.

    Yields:
        ``True`` the first time this key commits; ``False`` when it already exists (the
        effect happened in an earlier delivery: skip it).

    Raises:
        RuntimeError: not inside a transaction on the queue's database.
        ValueError: an empty or over-long key or kind.
    """
    for name, value in (("key", key), ("kind", kind)):
        if not isinstance(value, str) or not 0 < len(value) <= 200 or "\x00" in value:
            raise ValueError(
                f"{name} must be a non-empty str of at most 200 characters, without NUL."
            )
    alias = _queue_connection_in_transaction("idempotent()")
    with connections[alias].cursor() as cursor:
        cursor.execute(sql.enqueue.INSERT_DEDUP_KEY, {"kind": kind, "key": key, "job_id": job_id})
        first_time = cursor.fetchone() is not None
    yield first_time
