"""Dead letters get ``fingerprint``, their cause (``django_jobq.fingerprints``): a stored
generated column, so PostgreSQL computes it in every insert, whoever writes the row.

Adding it rewrites ``jobq_dead_letter`` under an ACCESS EXCLUSIVE lock, computing every
existing row's fingerprint, then builds the two indexes in the same transaction (the
figures for 200,000 dead letters are in docs/performance.md). Meanwhile a worker's retry
or dead letter of a job waits at most 100 ms for the table (``sql.SET_SHORT_LOCK_TIMEOUT``)
and is written again later, the unknown-kind sweep and the admin's dead-letter pages wait;
claims and acks go on. The expression below is a frozen copy of
``fingerprints.expression()``: a change of the rules is a new migration that removes the
column and adds it again. Another database that merely holds the app's tables (the queue
lives on PostgreSQL, check ``django_jobq.E001``) has no ``regexp_replace()``: it gets a
plain nullable ``fingerprint`` column, which nothing fills.
"""

from __future__ import annotations

from typing import Any

import django.db.models.functions.comparison
import django.db.models.functions.text
from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor


class AddGeneratedFieldOnPostgreSQL(migrations.AddField):
    """``AddField`` of a generated column on PostgreSQL; elsewhere, a plain nullable text
    column of the same name (the same table shape, for a database that holds the tables
    without running the queue)."""

    def _plain(self, model: Any) -> models.Field[Any, Any]:
        column = models.TextField(null=True)
        column.set_attributes_from_name(self.name)
        column.model = model
        return column

    def database_forwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: Any,
        to_state: Any,
    ) -> None:
        if schema_editor.connection.vendor == "postgresql":
            super().database_forwards(app_label, schema_editor, from_state, to_state)
            return
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            schema_editor.add_field(model, self._plain(model))

    def database_backwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: Any,
        to_state: Any,
    ) -> None:
        if schema_editor.connection.vendor == "postgresql":
            super().database_backwards(app_label, schema_editor, from_state, to_state)
            return
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            schema_editor.remove_field(model, self._plain(model))


class Migration(migrations.Migration):
    dependencies = [
        ("django_jobq", "0009_worker_kinds"),
    ]

    operations = [
        AddGeneratedFieldOnPostgreSQL(
            model_name="deadletter",
            name="fingerprint",
            field=models.GeneratedField(
                db_persist=True,
                expression=django.db.models.functions.text.Left(
                    models.Func(
                        models.Func(
                            models.Func(
                                models.Func(
                                    models.Func(
                                        models.Func(
                                            models.Func(
                                                models.Func(
                                                    django.db.models.functions.text.Left(
                                                        django.db.models.functions.comparison.Coalesce(
                                                            django.db.models.functions.comparison.NullIf(
                                                                models.Func(
                                                                    models.Func(
                                                                        models.F("last_error"),
                                                                        models.Value(" \t\r\n"),
                                                                        function="ltrim",
                                                                        output_field=models.TextField(),
                                                                    ),
                                                                    models.Value("\n"),
                                                                    models.Value(1),
                                                                    function="split_part",
                                                                    output_field=models.TextField(),
                                                                ),
                                                                models.Value(""),
                                                            ),
                                                            models.Func(
                                                                models.Func(
                                                                    models.F("reason"),
                                                                    models.Value(" \t\r\n"),
                                                                    function="ltrim",
                                                                    output_field=models.TextField(),
                                                                ),
                                                                models.Value("\n"),
                                                                models.Value(1),
                                                                function="split_part",
                                                                output_field=models.TextField(),
                                                            ),
                                                        ),
                                                        1000,
                                                    ),
                                                    models.Value(
                                                        "[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}"
                                                    ),
                                                    models.Value("<uuid>"),
                                                    models.Value("g"),
                                                    function="regexp_replace",
                                                    output_field=models.TextField(),
                                                ),
                                                models.Value(
                                                    "[0-9]{4}-[0-9]{2}-[0-9]{2}([T ][0-9]{2}:[0-9]{2}(:[0-9]{2}([.,][0-9]+)?)?)?(Z|[+-][0-9]{2}(:?[0-9]{2})?)?"
                                                ),
                                                models.Value("<time>"),
                                                models.Value("g"),
                                                function="regexp_replace",
                                                output_field=models.TextField(),
                                            ),
                                            models.Value(
                                                "[^ \\t@'\"<>()\\[\\]{},;:]+@[^ \\t@'\"<>()\\[\\]{},;:]+"
                                            ),
                                            models.Value("<email>"),
                                            models.Value("g"),
                                            function="regexp_replace",
                                            output_field=models.TextField(),
                                        ),
                                        models.Value(
                                            "(?<![A-Za-z0-9])[bBrRuUfF]?('[^']*'|\"[^\"]*\")"
                                        ),
                                        models.Value("<str>"),
                                        models.Value("g"),
                                        function="regexp_replace",
                                        output_field=models.TextField(),
                                    ),
                                    models.Value(
                                        "(?<![A-Za-z0-9])(0x[0-9A-Fa-f]+|(?=[0-9A-Fa-f]*[0-9])(?=[0-9A-Fa-f]*[A-Fa-f])[0-9A-Fa-f]{8,})(?![A-Za-z0-9])"
                                    ),
                                    models.Value("<hex>"),
                                    models.Value("g"),
                                    function="regexp_replace",
                                    output_field=models.TextField(),
                                ),
                                models.Value("(?<![A-Za-z0-9])[0-9]+([.,][0-9]+)*(?![A-Za-z0-9])"),
                                models.Value("<n>"),
                                models.Value("g"),
                                function="regexp_replace",
                                output_field=models.TextField(),
                            ),
                            models.Value("[ \\t\\r\\f\\v]{2,}|[\\t\\r\\f\\v]"),
                            models.Value(" "),
                            models.Value("g"),
                            function="regexp_replace",
                            output_field=models.TextField(),
                        ),
                        models.Value(" \t\r\n"),
                        function="btrim",
                        output_field=models.TextField(),
                    ),
                    200,
                ),
                help_text="The error's first line, its values replaced: dead letters of one cause.",
                output_field=models.TextField(),
            ),
        ),
        migrations.AddIndex(
            model_name="deadletter",
            index=models.Index(
                fields=["fingerprint", "died_at", "id"], name="jobq_dead_fingerprint_idx"
            ),
        ),
        migrations.AddIndex(
            model_name="deadletter",
            index=models.Index(
                fields=["fingerprint", "kind"], name="jobq_dead_fingerprint_kind_idx"
            ),
        ),
    ]
