"""Connections the worker owns, separate from Django's request-style connections.

Handlers use Django's ORM as usual, and the worker closes Django's connections around every
job (``close_old_connections``), as Django does around every request. The worker's own
queue statements (claim, ack, retry, dead letter, release) run on long-lived psycopg
connections opened here, so ``CONN_MAX_AGE = 0`` does not mean a reconnect per job.
:func:`from_rows` turns raw rows read on Django's connections into model instances.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import psycopg
from django.db import connections
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
