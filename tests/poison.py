"""Rows no ``enqueue`` wrote (another producer, a hand-written SQL fix), for the tests.

:func:`insert_row` writes a job by SQL as if it predated migration 0008: the constraints
that would refuse it are dropped for the insert and added back ``NOT VALID``, exactly the
state of a table migrated with such rows in it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection, transaction
from django.db.backends.utils import CursorWrapper

from django_jobq.models import JOB_INSERT_CONSTRAINTS
from tests.testapp.jobs import record

RECORD_KIND = record.kind

# name: (columns set by SQL, what the dead letter's reason must contain)
CLAIMED_POISON = {
    "deep object payload": (
        {"payload": "(repeat('{\"a\": ', 10000) || '1' || repeat('}', 10000))::jsonb"},
        "poison row: payload could not be decoded: RecursionError",
    ),
    "deep array payload": (
        {"payload": "(repeat('[', 10000) || repeat(']', 10000))::jsonb"},
        "poison row: payload could not be decoded: RecursionError",
    ),
    "array payload": ({"payload": "'[\"poison\"]'"}, "poison row: payload is an array"),
    "string payload": ({"payload": "'\"poison\"'"}, "poison row: payload is a string"),
    "null payload": ({"payload": "'null'"}, "poison row: payload is null"),
    "number payload": ({"payload": "'7'"}, "poison row: payload is a number"),
    "run_at -infinity": ({"run_at": "'-infinity'"}, "poison row: run_at is -infinity"),
    "run_at and created_at -infinity": (
        {"run_at": "'-infinity'", "created_at": "'-infinity'"},
        "poison row: run_at is -infinity",
    ),
    "created_at infinity": ({"created_at": "'infinity'"}, "poison row: created_at is infinity"),
    "expires_at infinity": ({"expires_at": "'infinity'"}, "poison row: expires_at is infinity"),
    "visibility timeout 300000 years": (
        {"visibility_timeout": "'300000 years'"},
        "poison row: visibility_timeout is 300000 years, not 1 ms to 10 years",
    ),
    "visibility timeout beyond timedelta": (
        {"visibility_timeout": "'100000000 years'"},
        "poison row: visibility_timeout is 100000000 years",
    ),
    "negative visibility timeout": (
        {"visibility_timeout": "'-5 seconds'"},
        "poison row: visibility_timeout is -00:00:05",
    ),
    "attempts above max_attempts": (
        {"attempts": "7", "max_attempts": "5"},
        "max attempts exceeded: it was ready with attempts 7 of max_attempts 5",
    ),
    "attempts at the integer maximum": (
        {"attempts": "2147483647", "max_attempts": "5"},
        "max attempts exceeded: it was ready with attempts",
    ),
    "attempts and max_attempts at the integer maximum": (
        {"attempts": "2147483647", "max_attempts": "2147483647"},
        "poison row: attempts is 2147483647, the integer maximum",
    ),
}

# Rows a claim does not take (never due, or a status no worker knows).
UNCLAIMED_POISON = {
    "run_at infinity": {"run_at": "'infinity'"},
    "unknown status": {"status": "'done'"},
}
# Odd rows that run like any job: a running row whose lease lapsed at '-infinity' (a
# reclaim), a run_at before Python's year 1 (claimed with its run_at clamped).
RUN_LIKE_ANY_JOB = {
    "lease lapsed at -infinity": {
        "status": "'running'",
        "lease_deadline": "'-infinity'",
        "worker_id": "'gone'",
    },
    "run_at 4000 BC": {"run_at": "'4000-01-01 00:00:00+00 BC'"},
}
ALL_ODD_ROWS = {
    **{case: columns for case, (columns, _) in CLAIMED_POISON.items()},
    **UNCLAIMED_POISON,
    **RUN_LIKE_ANY_JOB,
}


@contextmanager
def _older_than_the_constraints() -> Iterator[CursorWrapper]:
    """A cursor in a transaction where the constraints of migration 0008 are dropped; they
    are added back ``NOT VALID`` at its end, so what it wrote predates them."""
    names = [constraint.name for constraint in JOB_INSERT_CONSTRAINTS]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conrelid = 'jobq_job'::regclass AND conname = ANY(%(names)s)",
            {"names": names},
        )
        definitions = cursor.fetchall()
        assert len(definitions) == len(names)
        for name, _ in definitions:
            cursor.execute(f"ALTER TABLE jobq_job DROP CONSTRAINT {name}")
        yield cursor
        for name, definition in definitions:
            definition = definition.removesuffix(" NOT VALID")
            cursor.execute(f"ALTER TABLE jobq_job ADD CONSTRAINT {name} {definition} NOT VALID")


def insert_row(columns: dict[str, str], *, label: str = "poison", kind: str = RECORD_KIND) -> int:
    """Insert a job of ``kind`` (payload ``{"label": label}`` unless ``columns`` sets it)
    with ``columns`` (SQL expressions) as a row older than the constraints; returns its id."""
    values = {
        "queue": "'default'",
        "kind": "%(kind)s",
        "payload": "jsonb_build_object('label', %(label)s::text)",
        "visibility_timeout": "interval '30 seconds'",
        "max_attempts": "3",
        **columns,
    }
    with _older_than_the_constraints() as cursor:
        cursor.execute(  # the test's own SQL expressions, not user input
            f"INSERT INTO jobq_job ({', '.join(values)}) "  # noqa: S608
            f"VALUES ({', '.join(values.values())}) RETURNING id",
            {"kind": kind, "label": label},
        )
        ((job_id,),) = cursor.fetchall()
    return int(job_id)


def update_row(job_id: int, columns: dict[str, str]) -> None:
    """Set ``columns`` (SQL expressions) of job ``job_id`` as before the constraints."""
    assignments = ", ".join(f"{column} = {value}" for column, value in columns.items())
    with _older_than_the_constraints() as cursor:
        cursor.execute(
            f"UPDATE jobq_job SET {assignments} WHERE id = %(id)s",  # noqa: S608
            {"id": job_id},
        )
