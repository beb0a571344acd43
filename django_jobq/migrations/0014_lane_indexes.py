"""The lanes' indexes (docs/flow-control.md, "Ordered lanes"), built without blocking writes.

``jobq_job_lane_idx`` holds the jobs in a lane, in enqueue order: a lane's next job, and
whether it has one live, are one index seek. ``jobq_job_one_running_per_lane`` is a partial
unique index: PostgreSQL refuses a second running job in a lane, whatever the claims saw.
Both are built with ``CONCURRENTLY`` (the migration is not atomic for that) and cover only
rows with an ``ordering_key``, which no job has before this release: they build in moments.
A failed build leaves an INVALID index: drop it (``DROP INDEX CONCURRENTLY <name>``) and
migrate again.
"""

from django.db import migrations, models

from django_jobq.migrations._operations import (
    AddIndexConcurrentlyOnPostgreSQL,
    AddUniqueConstraintConcurrently,
)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("django_jobq", "0013_flow_control"),
    ]

    operations = [
        AddIndexConcurrentlyOnPostgreSQL(
            model_name="job",
            index=models.Index(
                condition=models.Q(("ordering_key__isnull", False)),
                fields=["ordering_key", "id"],
                name="jobq_job_lane_idx",
            ),
        ),
        AddUniqueConstraintConcurrently(
            model_name="job",
            constraint=models.UniqueConstraint(
                condition=models.Q(("ordering_key__isnull", False), ("status", "running")),
                fields=("ordering_key",),
                name="jobq_job_one_running_per_lane",
            ),
        ),
    ]
