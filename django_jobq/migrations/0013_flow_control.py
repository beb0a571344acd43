"""Flow control (docs/flow-control.md): the queues and kinds operators pause and limit at run
time, the rows limited claims lock and the starts rate limits count, and on jobs a lane
(``ordering_key``, with the new status ``waiting``) and an abort request.

New tables, and nullable columns without defaults (recorded in the catalog, no table
rewrite). The check of ``jobq_job.status`` is replaced ``NOT VALID`` (no scan). The lock these
take on ``jobq_job`` and ``jobq_dead_letter`` is held only for a moment, and waited for at
most ``LOCK_TIMEOUT``: a long transaction on the table makes the migration fail, unchanged,
rather than queue every claim behind it (run it again). The lanes' indexes are built in the
next migration, without blocking writes.
"""

import datetime
from typing import Any

import django.db.models.functions.datetime
from django.db import migrations, models

from django_jobq.migrations._operations import (
    AddConstraintNotValid,
    RemoveConstraintOnPostgreSQL,
    wait_briefly_for_locks,
)

RATE_LIMIT_PATTERN = "^([1-9][0-9]{0,3}|10000)/([1-9][0-9]{0,5})?[smhd]$"
QUEUE_NAME_PATTERN = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
KIND_NAME_PATTERN = "^[A-Za-z_][A-Za-z0-9_.:-]{0,199}$"
PAUSE_TIMES = (
    datetime.datetime(1, 1, 2, tzinfo=datetime.UTC),
    datetime.datetime(9999, 12, 30, tzinfo=datetime.UTC),
)


def _wait_briefly_for_locks(apps: Any, schema_editor: Any) -> None:
    wait_briefly_for_locks(schema_editor)


def _limit_constraints(model_name: str, table: str) -> list[migrations.AddConstraint]:
    return [
        migrations.AddConstraint(
            model_name=model_name,
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("concurrency_limit__isnull", True),
                    ("concurrency_limit__gte", 1),
                    _connector="OR",
                ),
                name=f"{table}_concurrency_limit_gte_1",
            ),
        ),
        migrations.AddConstraint(
            model_name=model_name,
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("rate_limit__isnull", True),
                    ("rate_limit__regex", RATE_LIMIT_PATTERN),
                    _connector="OR",
                ),
                name=f"{table}_rate_limit_grammar",
            ),
        ),
    ]


class Migration(migrations.Migration):
    dependencies = [
        ("django_jobq", "0012_trace_context"),
    ]

    operations = [
        migrations.RunPython(_wait_briefly_for_locks, migrations.RunPython.noop, elidable=True),
        migrations.CreateModel(
            name="Queue",
            fields=[
                ("name", models.CharField(max_length=63, primary_key=True, serialize=False)),
                (
                    "paused_at",
                    models.DateTimeField(
                        blank=True, help_text="Paused since then; empty: not paused.", null=True
                    ),
                ),
                (
                    "paused_until",
                    models.DateTimeField(
                        blank=True,
                        help_text="While paused: resumes by itself then; empty: until resumed.",
                        null=True,
                    ),
                ),
                (
                    "concurrency_limit",
                    models.PositiveIntegerField(
                        blank=True,
                        help_text="The most jobs of the queue running at once, fleet-wide; "
                        "empty: the setting's.",
                        null=True,
                    ),
                ),
                (
                    "rate_limit",
                    models.CharField(
                        blank=True,
                        help_text='The most jobs started per window, fleet-wide ("100/s", '
                        '"600/m", "5/10s"); empty: the setting\'s.',
                        max_length=16,
                        null=True,
                    ),
                ),
                (
                    "updated_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
            ],
            options={"db_table": "jobq_queue"},
        ),
        migrations.CreateModel(
            name="KindLimit",
            fields=[
                ("kind", models.CharField(max_length=200, primary_key=True, serialize=False)),
                (
                    "concurrency_limit",
                    models.PositiveIntegerField(
                        blank=True,
                        help_text="The most jobs of the kind running at once, fleet-wide; "
                        "empty: @job's.",
                        null=True,
                    ),
                ),
                (
                    "rate_limit",
                    models.CharField(
                        blank=True,
                        help_text='The most jobs started per window, fleet-wide ("100/s"); '
                        "empty: @job's.",
                        max_length=16,
                        null=True,
                    ),
                ),
                (
                    "updated_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
            ],
            options={"db_table": "jobq_kind_limit"},
        ),
        migrations.CreateModel(
            name="LimitState",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                (
                    "scope",
                    models.CharField(choices=[("queue", "Queue"), ("kind", "Kind")], max_length=5),
                ),
                ("name", models.CharField(max_length=200)),
            ],
            options={"db_table": "jobq_limit_state"},
        ),
        migrations.CreateModel(
            name="LimitStart",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                (
                    "scope",
                    models.CharField(choices=[("queue", "Queue"), ("kind", "Kind")], max_length=5),
                ),
                ("name", models.CharField(max_length=200)),
                ("job_id", models.BigIntegerField()),
                ("attempt", models.IntegerField()),
                ("started_at", models.DateTimeField()),
            ],
            options={
                "db_table": "jobq_limit_start",
                "indexes": [
                    models.Index(
                        fields=["scope", "name", "started_at"], name="jobq_limit_start_idx"
                    )
                ],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("scope", "name", "job_id", "attempt"),
                        name="jobq_limit_start_uniq",
                    )
                ],
            },
        ),
        migrations.AddConstraint(
            model_name="limitstate",
            constraint=models.UniqueConstraint(
                fields=("scope", "name"), name="jobq_limit_state_uniq"
            ),
        ),
        migrations.AddConstraint(
            model_name="queue",
            constraint=models.CheckConstraint(
                condition=models.Q(("name__regex", QUEUE_NAME_PATTERN)),
                name="jobq_queue_name_valid",
            ),
        ),
        *_limit_constraints("queue", "jobq_queue"),
        *(
            migrations.AddConstraint(
                model_name="queue",
                constraint=models.CheckConstraint(
                    condition=models.Q((f"{field}__range", PAUSE_TIMES)),
                    name=f"jobq_queue_{field}_in_range",
                ),
            )
            for field in ("paused_at", "paused_until")
        ),
        migrations.AddConstraint(
            model_name="queue",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("paused_until__isnull", True), ("paused_at__isnull", False), _connector="OR"
                ),
                name="jobq_queue_paused_until_needs_paused_at",
            ),
        ),
        migrations.AddConstraint(
            model_name="kindlimit",
            constraint=models.CheckConstraint(
                condition=models.Q(("kind__regex", KIND_NAME_PATTERN)),
                name="jobq_kind_limit_kind_valid",
            ),
        ),
        *_limit_constraints("kindlimit", "jobq_kind_limit"),
        migrations.AddField(
            model_name="job",
            name="ordering_key",
            field=models.CharField(
                blank=True,
                help_text="Its lane: jobs with the same key run one at a time, in enqueue order.",
                max_length=200,
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="abort_requested_at",
            field=models.DateTimeField(
                blank=True,
                help_text="When an abort of the running attempt was requested "
                "(docs/flow-control.md).",
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="deadletter",
            name="ordering_key",
            field=models.CharField(
                blank=True,
                help_text="The job's lane, kept for its redrive.",
                max_length=200,
                null=True,
            ),
        ),
        migrations.AlterField(
            model_name="job",
            name="status",
            field=models.CharField(
                choices=[
                    ("ready", "ready"),
                    ("running", "running"),
                    ("waiting", "waiting in its lane"),
                ],
                db_default="ready",
                max_length=16,
            ),
        ),
        RemoveConstraintOnPostgreSQL(model_name="job", name="jobq_job_status_is_known"),
        AddConstraintNotValid(
            model_name="job",
            constraint=models.CheckConstraint(
                condition=models.Q(("status__in", ["ready", "running", "waiting"])),
                name="jobq_job_status_is_known",
            ),
        ),
    ]
