"""Workers say what they can run; claims read only the kinds a worker has.

``jobq_worker_process`` gets ``kinds`` (jsonb list) and ``kinds_fingerprint``: their
defaults are constants, so PostgreSQL adds them without rewriting the table. ``jobq_job``
gets ``jobq_job_kind_claim_idx``, built with ``CREATE INDEX CONCURRENTLY`` (the migration is
not atomic for that): a large queue keeps enqueueing and claiming while it builds. If the
build fails it leaves an INVALID index behind; drop it (``DROP INDEX CONCURRENTLY
jobq_job_kind_claim_idx``) and migrate again.
"""

from django.db import migrations, models

from django_jobq.migrations._operations import AddIndexConcurrentlyOnPostgreSQL


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("django_jobq", "0008_job_insert_constraints"),
    ]

    operations = [
        migrations.AddField(
            model_name="workerprocess",
            name="kinds",
            field=models.JSONField(
                blank=True, default=list, help_text="The kinds it claims (its registry), sorted."
            ),
        ),
        migrations.AddField(
            model_name="workerprocess",
            name="kinds_fingerprint",
            field=models.CharField(
                blank=True,
                default="",
                help_text="Short hash of its kinds: workers with the same registry have the same one.",
                max_length=16,
            ),
        ),
        AddIndexConcurrentlyOnPostgreSQL(
            model_name="job",
            index=models.Index(
                models.F("queue"),
                models.F("kind"),
                models.F("priority").desc(),
                models.F("run_at"),
                models.F("id"),
                condition=models.Q(("status", "ready")),
                name="jobq_job_kind_claim_idx",
            ),
        ),
    ]
