"""Rate limits count a row per claim, not per start (docs/flow-control.md, "Rate limits"):
``jobq_limit_start`` loses ``job_id`` and ``attempt`` and gains ``starts`` (an existing row
counts one start), and a rate limit may allow up to 1,000,000 starts per window (the
grammar's CHECK on ``jobq_queue`` and ``jobq_kind_limit``, tables of a row per limited queue
or kind).

``jobq_limit_start`` holds at most a window of starts and only workers write it; the lock
these take on it and on the two small tables is waited for at most ``LOCK_TIMEOUT``.
"""

from typing import Any

from django.db import migrations, models

from django_jobq.migrations._operations import wait_briefly_for_locks

RATE_LIMIT_PATTERN = "^([1-9][0-9]{0,5}|1000000)/([1-9][0-9]{0,5})?[smhd]$"


def _wait_briefly_for_locks(apps: Any, schema_editor: Any) -> None:
    wait_briefly_for_locks(schema_editor)


def _grammar(table: str, pattern: str) -> models.CheckConstraint:
    return models.CheckConstraint(
        condition=models.Q(
            ("rate_limit__isnull", True), ("rate_limit__regex", pattern), _connector="OR"
        ),
        name=f"{table}_rate_limit_grammar",
    )


def _new_grammar(model_name: str, table: str) -> list[migrations.operations.base.Operation]:
    return [
        migrations.RemoveConstraint(model_name=model_name, name=f"{table}_rate_limit_grammar"),
        migrations.AddConstraint(
            model_name=model_name, constraint=_grammar(table, RATE_LIMIT_PATTERN)
        ),
    ]


class Migration(migrations.Migration):
    dependencies = [
        ("django_jobq", "0014_lane_indexes"),
    ]

    operations = [
        migrations.RunPython(_wait_briefly_for_locks, migrations.RunPython.noop, elidable=True),
        migrations.RemoveConstraint(model_name="limitstart", name="jobq_limit_start_uniq"),
        migrations.RemoveField(model_name="limitstart", name="job_id"),
        migrations.RemoveField(model_name="limitstart", name="attempt"),
        migrations.AddField(
            model_name="limitstart",
            name="starts",
            field=models.IntegerField(default=1, help_text="How many starts this row counts."),
            preserve_default=False,
        ),
        migrations.AddConstraint(
            model_name="limitstart",
            constraint=models.CheckConstraint(
                condition=models.Q(("starts__gte", 0)), name="jobq_limit_start_starts_gte_0"
            ),
        ),
        *_new_grammar("queue", "jobq_queue"),
        *_new_grammar("kindlimit", "jobq_kind_limit"),
    ]
