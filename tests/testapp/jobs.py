"""Handlers used by the tests (autodiscovered like any app's ``jobs`` module)."""

from django.db import connection

from django_jobq import job

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
