"""CHECK constraints on ``jobq_job`` that refuse, at insert, what ``enqueue`` refuses.

They are added ``NOT VALID``: PostgreSQL checks every row written from now on, but not the
rows already in the table, so the migration holds its lock only for a moment (a plain
``ADD CONSTRAINT`` scans the whole table under an ACCESS EXCLUSIVE lock, and fails if one
old row breaks it). It waits at most ``LOCK_TIMEOUT`` for that lock, then fails without
changing anything. Old rows that break one are quarantined by the workers as poison rows.
Check the old rows later, without blocking the queue, with
``ALTER TABLE jobq_job VALIDATE CONSTRAINT <name>`` (docs/operations.md, "Rows written by
other producers").
"""

from datetime import timedelta

import django.db.models.lookups
from django.db import migrations, models

import django_jobq.models
from django_jobq.migrations._operations import AddConstraintNotValid

_RUNNING = ("status", "running")


class Migration(migrations.Migration):
    dependencies = [
        ("django_jobq", "0007_observability"),
    ]

    operations = [
        AddConstraintNotValid(
            model_name="job",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    _RUNNING, django_jobq.models.IsFinite("run_at"), _connector="OR"
                ),
                name="jobq_job_run_at_is_finite",
            ),
        ),
        AddConstraintNotValid(
            model_name="job",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    _RUNNING,
                    ("expires_at__isnull", True),
                    django_jobq.models.IsFinite("expires_at"),
                    _connector="OR",
                ),
                name="jobq_job_expires_at_is_finite",
            ),
        ),
        AddConstraintNotValid(
            model_name="job",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    _RUNNING, django_jobq.models.IsFinite("created_at"), _connector="OR"
                ),
                name="jobq_job_created_at_is_finite",
            ),
        ),
        AddConstraintNotValid(
            model_name="job",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    _RUNNING,
                    models.Q(
                        ("visibility_timeout__gte", timedelta(microseconds=1000)),
                        ("visibility_timeout__lte", timedelta(days=3650)),
                    ),
                    _connector="OR",
                ),
                name="jobq_job_visibility_timeout_1ms_to_10y",
            ),
        ),
        AddConstraintNotValid(
            model_name="job",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    _RUNNING,
                    django.db.models.lookups.Exact(
                        django_jobq.models.JSONTypeOf("payload"), "object"
                    ),
                    _connector="OR",
                ),
                name="jobq_job_payload_is_object",
            ),
        ),
        AddConstraintNotValid(
            model_name="job",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    _RUNNING, ("attempts__lte", models.F("max_attempts")), _connector="OR"
                ),
                name="jobq_job_ready_attempts_within_max",
            ),
        ),
        AddConstraintNotValid(
            model_name="job",
            constraint=models.CheckConstraint(
                condition=models.Q(("status__in", ["ready", "running"])),
                name="jobq_job_status_is_known",
            ),
        ),
    ]
