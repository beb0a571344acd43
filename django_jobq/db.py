"""Connections the worker owns, separate from Django's request-style connections.

Handlers use Django's ORM as usual, and the worker closes Django's connections around every
job (``close_old_connections``), as Django does around every request. The worker's own
queue statements (claim, ack, retry, dead letter, release) run on long-lived psycopg
connections opened here, so ``CONN_MAX_AGE = 0`` does not mean a reconnect per job.
"""

from __future__ import annotations

from typing import Any

import psycopg
from django.db import connections

from .conf import get_settings


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
