"""Handlers used by the tests (autodiscovered like any app's ``jobs`` module)."""

from django.db import connection

from django_jobq import job
from django_jobq.context import JobContext

from .models import Effect


@job
def record(label: str) -> None:
    """Write one Effect row."""
    Effect.objects.create(label=label)


@job(max_attempts=2)
def always_fails(reason: str = "boom") -> None:
    raise RuntimeError(reason)


@job(queue="slow")
def wait_for_lock(lock_id: int, label: str) -> None:
    """Block until the test releases PostgreSQL advisory lock ``lock_id``, then record."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s)", [lock_id])
        cursor.execute("SELECT pg_advisory_unlock(%s)", [lock_id])
    Effect.objects.create(label=label)


@job(queue="leases", takes_context=True)
def hold_lock(ctx: JobContext, lock_id: int, label: str) -> None:
    """Block until the test releases advisory lock ``lock_id``, then record the attempt."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s)", [lock_id])
        cursor.execute("SELECT pg_advisory_unlock(%s)", [lock_id])
    Effect.objects.create(label=f"{label} attempt {ctx.attempt}")


@job(queue="leases", takes_context=True, max_runtime=0.5)
def overrun(ctx: JobContext, lock_id: int) -> None:
    hold_lock.func(ctx, lock_id, "overran")


@job(takes_context=True)
def inspect_context(ctx: JobContext) -> None:
    before = ctx.deadline
    extended = ctx.heartbeat()
    Effect.objects.create(
        label=f"job {ctx.job_id} attempt {ctx.attempt} {ctx.kind} {ctx.queue} "
        f"extended={extended} moved={ctx.deadline >= before} lost={ctx.lease_lost}"
    )
