"""Operations the app's migrations share (a module Django's migration loader skips: its name
starts with an underscore)."""

from typing import Any

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations
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


#: The longest a migration adding a constraint waits for its table's lock (held by a long
#: transaction).
LOCK_TIMEOUT = "10s"


def wait_briefly_for_locks(schema_editor: BaseDatabaseSchemaEditor) -> None:
    """Make the rest of the migration's transaction wait at most ``LOCK_TIMEOUT`` for a
    table's lock: waiting longer would queue every claim and enqueue behind the migration's
    statement; giving up rolls the migration back (run it again). PostgreSQL only."""
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'", params=None)


class AddConstraintNotValid(migrations.AddConstraint):
    """``AddConstraint`` for a check constraint, added ``NOT VALID`` (existing rows are not
    checked). The SQL is Django's own for the constraint, plus ``NOT VALID``. Only on
    PostgreSQL: the queue lives there (check ``django_jobq.E001``), and another database
    that merely holds the app's tables has no ``isfinite()`` or ``jsonb_typeof()``."""

    def database_forwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: Any,
        to_state: Any,
    ) -> None:
        model = to_state.apps.get_model(app_label, self.model_name)
        if schema_editor.connection.vendor != "postgresql":
            return
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            wait_briefly_for_locks(schema_editor)
            statement = self.constraint.create_sql(model, schema_editor)
            schema_editor.execute(f"{statement} NOT VALID", params=None)

    def database_backwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: Any,
        to_state: Any,
    ) -> None:
        if schema_editor.connection.vendor == "postgresql":
            super().database_backwards(app_label, schema_editor, from_state, to_state)

    def describe(self) -> str:
        return f"{super().describe()} (NOT VALID)"


class AddUniqueConstraintConcurrently(migrations.AddConstraint):
    """``AddConstraint`` for a partial unique constraint (a unique index), built with
    ``CREATE UNIQUE INDEX CONCURRENTLY`` on PostgreSQL: writes go on while it builds (the
    migration must not be atomic). Elsewhere, a plain ``AddConstraint``. A failed build
    leaves an INVALID index: drop it (``DROP INDEX CONCURRENTLY <name>``) and migrate again."""

    def database_forwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: Any,
        to_state: Any,
    ) -> None:
        if schema_editor.connection.vendor != "postgresql":
            super().database_forwards(app_label, schema_editor, from_state, to_state)
            return
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            statement = str(self.constraint.create_sql(model, schema_editor))
            schema_editor.execute(
                statement.replace("CREATE UNIQUE INDEX", "CREATE UNIQUE INDEX CONCURRENTLY", 1),
                params=None,
            )

    def describe(self) -> str:
        return f"{super().describe()} (concurrently)"


class RemoveConstraintOnPostgreSQL(migrations.RemoveConstraint):
    """``RemoveConstraint`` of a check constraint that only PostgreSQL was given (one added by
    :class:`AddConstraintNotValid`); elsewhere, nothing to remove in the database."""

    def database_forwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: Any,
        to_state: Any,
    ) -> None:
        if schema_editor.connection.vendor == "postgresql":
            super().database_forwards(app_label, schema_editor, from_state, to_state)

    def database_backwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: Any,
        to_state: Any,
    ) -> None:
        if schema_editor.connection.vendor == "postgresql":
            super().database_backwards(app_label, schema_editor, from_state, to_state)
