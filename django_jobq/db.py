"""Connections the worker owns, separate from Django's request-style connections.

Handlers use Django's ORM as usual, and the worker closes Django's connections around every
job (``close_old_connections``), as Django does around every request. The worker's own
queue statements (claim, ack, retry, dead letter, release) run on long-lived psycopg
connections opened here, so ``CONN_MAX_AGE = 0`` does not mean a reconnect per job.
:func:`server_binding_cursor` opens a cursor on Django's own connection that sends
parameters apart from the statement, and :func:`from_rows` turns raw rows read on Django's
connections into model instances.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg
from django.db import connections
from django.db.backends.utils import CursorWrapper
from django.db.models import Model

from .conf import get_settings

M = TypeVar("M", bound=Model)


def connect(*, application_name: str = "django-jobq") -> psycopg.Connection[Any]:
    """Open an autocommit psycopg connection to the queue database (``JOBQ['DATABASE']``).

    Uses the same connection parameters as Django's connection for that alias (including
    ``OPTIONS``), minus Django's own adapters, so ``jsonb`` arrives as Python objects.

    Raises:
        psycopg.OperationalError: the database cannot be reached.
    """
    params = connections[get_settings().DATABASE].get_connection_params()
    params.pop("context", None)
    params.pop("cursor_factory", None)
    params.setdefault("application_name", application_name)
    return psycopg.connect(**params, autocommit=True)


@contextmanager
def server_binding_cursor(alias: str, *, binary_results: bool = False) -> Iterator[CursorWrapper]:
    """A cursor on Django's connection ``alias`` (so in the caller's transaction) that sends
    the parameters apart from the statement, as values, instead of quoting them into its
    text as Django's default cursor does: psycopg's binary ``%(name)b`` placeholders then
    skip the text conversion of every value. Django's wrapping is kept: database errors
    arrive as ``django.db`` exceptions, ``execute_wrapper()`` hooks run, queries are logged
    under ``DEBUG`` (with ``$1`` placeholders, not the values). Statements are not prepared
    unless ``OPTIONS['prepare_threshold']`` says so (Django's default, which keeps
    PgBouncer's transaction mode working).

    With ``binary_results`` the rows arrive in binary too and are loaded by psycopg's own
    loaders, not Django's: a ``timestamptz`` is an aware datetime in the session's time
    zone (UTC when ``USE_TZ``), about 20 times faster than Django's text loader; a ``jsonb``
    would arrive decoded, which Django's ``JSONField`` does not expect. For enqueue's
    figures see docs/performance.md.

    Raises:
        django.db.OperationalError: the database cannot be reached.
    """
    connection = connections[alias]
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    connection.validate_thread_sharing()
    cursor = psycopg.Cursor(connection.connection)
    if binary_results:
        cursor.format = psycopg.pq.Format.BINARY
    # django-stubs types the argument as Django's wrapper; Django passes the driver's cursor.
    wrap = connection.make_debug_cursor if connection.queries_logged else connection.make_cursor
    wrapped = wrap(cursor)  # type: ignore[arg-type]
    with wrapped:
        yield wrapped


def from_rows(
    model: type[M], alias: str, names: Sequence[str], rows: Sequence[Sequence[Any]]
) -> list[M]:
    """Build ``model`` instances from raw rows read on Django's connection ``alias``
    (``RETURNING *``, say), converting values as the ORM does: each column's
    ``from_db_value``, looked up once for all rows. ``names`` are the columns' names.

    Columns are matched to fields by name: ``RETURNING *`` yields the table's physical
    column order, which differs from the model's once a migration has added a column
    (``Model.from_db`` would otherwise assign all-column rows by position).
    """
    connection = connections[alias]
    index = {name: position for position, name in enumerate(names)}
    fields = [field for field in model._meta.concrete_fields if field.attname in index]
    positions = [index[field.attname] for field in fields]
    converters = [getattr(field, "from_db_value", None) for field in fields]
    attnames = [field.attname for field in fields]
    return [
        model.from_db(
            alias,
            attnames,
            [
                convert(row[position], None, connection) if convert else row[position]
                for convert, position in zip(converters, positions, strict=True)
            ],
        )
        for row in rows
    ]
