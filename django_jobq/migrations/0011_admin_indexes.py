"""Indexes the dead-letter admin needs with many dead letters.

``jobq_dead_job_id_idx`` serves the search for a job id; ``jobq_dead_reason_idx``
(``varchar_pattern_ops``, so it serves ``LIKE 'prefix%'`` in any collation) serves the reason
filter, which matches a reason and its detailed forms (``failed`` and ``failed: ...``). Dead
letters are written as jobs fail, not as they run, so the indexes cost the queue nothing
measurable. Both are built with ``CREATE INDEX CONCURRENTLY`` (the migration is not atomic
for that): workers keep dead-lettering while they build. If a build fails it leaves an
INVALID index behind; drop it (``DROP INDEX CONCURRENTLY <name>``) and migrate again.
"""

from django.db import migrations, models

from django_jobq.migrations._operations import AddIndexConcurrentlyOnPostgreSQL


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("django_jobq", "0010_dead_letter_fingerprint"),
    ]

    operations = [
        AddIndexConcurrentlyOnPostgreSQL(
            model_name="deadletter",
            index=models.Index(fields=["job_id"], name="jobq_dead_job_id_idx"),
        ),
        AddIndexConcurrentlyOnPostgreSQL(
            model_name="deadletter",
            index=models.Index(
                fields=["reason"], name="jobq_dead_reason_idx", opclasses=["varchar_pattern_ops"]
            ),
        ),
    ]
