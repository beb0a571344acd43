"""Workers say what they can run; claims read only the kinds a worker has.

``jobq_worker_process`` gets ``kinds`` (jsonb list) and ``kinds_fingerprint``: their
defaults are constants, so PostgreSQL adds them without rewriting the table. ``jobq_job``
gets ``jobq_job_kind_claim_idx``, built with ``CREATE INDEX CONCURRENTLY`` (the migration is
not atomic for that): a large queue keeps enqueueing and claiming while it builds. If the
build fails it leaves an INVALID index behind; drop it (``DROP INDEX CONCURRENTLY
jobq_job_kind_claim_idx``) and migrate again.
"""

from typing import Any

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor


class AddIndexConcurrentlyOnPostgreSQL(AddIndexConcurrently):
    """``CREATE INDEX CONCURRENTLY`` on PostgreSQL; a plain ``CREATE INDEX`` on another
    database that merely holds the app's tables (it has no concurrent build)."""

    def database_forwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: Any,
        to_state: Any,
    ) -> None:
        if schema_editor.connection.vendor == "postgresql":
            super().database_forwards(app_label, schema_editor, from_state, to_state)
        else:
            migrations.AddIndex.database_forwards(
                self, app_label, schema_editor, from_state, to_state
            )

    def database_backwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: Any,
        to_state: Any,
    ) -> None:
        if schema_editor.connection.vendor == "postgresql":
            super().database_backwards(app_label, schema_editor, from_state, to_state)
        else:
            migrations.AddIndex.database_backwards(
                self, app_label, schema_editor, from_state, to_state
            )


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
