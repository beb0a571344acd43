"""Connections the worker owns, separate from Django's request-style connections.

Handlers use Django's ORM as usual, and the worker closes Django's connections around every
job (``close_old_connections``), as Django does around every request. The worker's own
queue statements (claim, ack, retry, dead letter, release) run on long-lived psycopg
connections opened here, so ``CONN_MAX_AGE = 0`` does not mean a reconnect per job. They
are opened with a connect timeout, TCP keepalives and server-side statement and lock
timeouts (:func:`connect`), and track the statement in flight, so the worker's watchdog can
cut one that hangs
(:class:`WatchedConnection`, :mod:`django_jobq.worker.watchdog`); statements too long for
psycopg to keep parsed run on a :class:`LongStatementCursor`.
:func:`close_unusable_connections` checks the handlers' pooled Django connections.
:func:`server_binding_cursor` opens a cursor on Django's own connection that sends
parameters apart from the statement, and :func:`from_rows` turns raw rows read on Django's
connections into model instances.
"""

from __future__ import annotations

import functools
import math
import re
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar, cast

import psycopg
from django.db import close_old_connections, connections
from django.db.backends.utils import CursorWrapper
from django.db.models import Model
from psycopg.rows import Row

from .conf import get_settings, statement_timeout

M = TypeVar("M", bound=Model)


#: A statement in flight this many times the statement timeout is cut by the watchdog: the
#: server's own timeout fires first when the server can still be reached.
CUT_AFTER_STATEMENT_TIMEOUTS = 2.0
#: TCP keepalive probes sent before an unanswered connection counts as dead.
KEEPALIVE_COUNT = 3


class Cursor(Protocol):
    """The part of a DB-API cursor (psycopg's or Django's) that plain statement runners use."""

    def execute(self, query: Any, params: Any = ..., /) -> Any: ...
    def fetchall(self) -> list[Any]: ...
    @property
    def description(self) -> Any: ...


class WatchedConnection(psycopg.Connection[Any]):
    """A psycopg connection that records since when it waits on the server
    (:attr:`in_flight_since`, ``time.monotonic()`` seconds, ``None`` when idle) and can be
    cut (:meth:`cut`) from another thread. Every network wait of psycopg (a statement, a
    commit, notifications) goes through :meth:`wait`, so recording costs two attribute
    writes per statement."""

    in_flight_since: float | None = None
    #: What the claims on this connection read of the size of ``jobq_job`` since
    #: :meth:`take_job_table_sizes`: the smallest and the latest, in bytes (``None``: no
    #: claim yet). Written by :mod:`django_jobq.claims`, read by the worker's
    #: :mod:`~django_jobq.worker.plans`: this connection's prepared statements' plans.
    _job_table_sizes: tuple[int, int] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._cut_lock = threading.Lock()  # the socket is not closed while being cut
        # kept_cursor()'s cursors by purpose, each with the function that made it.
        self._kept_cursors: dict[str, tuple[Callable[..., Any], psycopg.Cursor[Any]]] = {}

    def saw_job_table_size(self, size: int) -> None:
        """Record the size of ``jobq_job`` (bytes) a claim on this connection read."""
        seen = self._job_table_sizes
        self._job_table_sizes = (size if seen is None else min(seen[0], size), size)

    def take_job_table_sizes(self) -> tuple[int, int] | None:
        """The smallest and the latest size of ``jobq_job`` (bytes) the claims on this
        connection read since the last call; ``None`` if none did."""
        seen, self._job_table_sizes = self._job_table_sizes, None
        return seen

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        self.in_flight_since = time.monotonic()
        try:
            return super().wait(*args, **kwargs)
        finally:
            self.in_flight_since = None

    def cut(self) -> bool:
        """Shut the socket down if a statement is still in flight: the waiting thread's
        statement then fails with ``psycopg.OperationalError`` (a connection fault). Return
        whether it was cut."""
        with self._cut_lock:
            if self.closed or self.in_flight_since is None:
                return False
            return shut_down(self)

    def close(self) -> None:
        with self._cut_lock:
            super().close()


C = TypeVar("C", bound=psycopg.Cursor[Any])


def kept_cursor(
    connection: psycopg.Connection[Any],
    purpose: str,
    make: Callable[[psycopg.Connection[Any]], C],
) -> C:
    """The cursor ``make(connection)`` makes, for the statements of ``purpose``
    (``"claims"``, ``"outcomes"``, the worker's ``"loop"``): a :class:`WatchedConnection` (a
    worker's, used by one thread) makes it once and keeps it, any other connection gets a
    new one. psycopg looks up how to send each parameter and read each column (its dumpers
    and loaders) once per cursor: a cursor made for each claim looked them up at every
    claim, 0.06 ms of the claimer's CPU (docs/performance.md, "The claim's client side").

    A kept cursor holds one statement's rows at a time: each user reads them before it
    sends the next statement on it (so never two of its statements in one pipeline), sets
    its ``row_factory`` when it wants other rows than tuples, and never closes it. It holds
    the last rows read until its next statement (a claim's: the payloads its jobs hold
    anyway while they run).

    Raises:
        TypeError: ``purpose`` was kept with another ``make``.
    """
    if not isinstance(connection, WatchedConnection):
        return make(connection)
    kept = connection._kept_cursors.get(purpose)
    if kept is None:
        kept = connection._kept_cursors[purpose] = (make, make(connection))
    elif kept[0] is not make:
        raise TypeError(f"the kept {purpose!r} cursor was made by {kept[0]!r}, not {make!r}")
    return cast(C, kept[1])


def shut_down(connection: psycopg.Connection[Any]) -> bool:
    """Shut ``connection``'s socket down (both ways) from any thread: a statement waiting on
    it fails at once with ``psycopg.OperationalError``, as if the server had gone. Returns
    whether a socket was shut down (``False``: already closed)."""
    try:
        fd = connection.pgconn.socket
    except psycopg.OperationalError:
        return False
    # A duplicate of the descriptor: shutting it down shuts the connection down, closing it
    # leaves psycopg's descriptor to psycopg.
    with socket.fromfd(fd, socket.AF_INET, socket.SOCK_STREAM) as duplicate:
        try:
            duplicate.shutdown(socket.SHUT_RDWR)
        except OSError:
            return False
    return True


def connection_timeouts() -> dict[str, Any]:
    """The libpq parameters that make a hung connection a fault, from ``JOBQ``:
    ``connect_timeout`` (``CONNECT_TIMEOUT``), TCP keepalives (idle for the statement
    timeout, then :data:`KEEPALIVE_COUNT` probes a third of it apart), ``tcp_user_timeout``
    (unacknowledged data for :data:`CUT_AFTER_STATEMENT_TIMEOUTS` statement timeouts), and
    the server's ``statement_timeout`` and ``lock_timeout`` (half of it), in ``options``.
    Seconds are rounded up to what libpq takes (whole seconds, milliseconds)."""
    config = get_settings()
    statement = statement_timeout(config)
    return {
        "connect_timeout": math.ceil(config.CONNECT_TIMEOUT),
        "keepalives": 1,
        "keepalives_idle": math.ceil(statement),
        "keepalives_interval": math.ceil(statement / 3),
        "keepalives_count": KEEPALIVE_COUNT,
        "tcp_user_timeout": math.ceil(statement * CUT_AFTER_STATEMENT_TIMEOUTS * 1000),
        "options": f"-c statement_timeout={math.ceil(statement * 1000)} "
        f"-c lock_timeout={math.ceil(statement * 500)}",
    }


#: Appended to the error of a pooler that refuses the startup parameter ``options``, which
#: carries the worker's server-side timeouts (PgBouncer without ``ignore_startup_parameters =
#: options``): what the error alone does not say.
OPTIONS_REFUSED_HINT = (
    " -- django-jobq's worker connections send statement_timeout and lock_timeout in the "
    "startup parameter 'options'; behind PgBouncer, add 'options' to its "
    "ignore_startup_parameters, or connect the workers to PostgreSQL directly "
    "(docs/pgbouncer.md)"
)

#: How a pooler's refusal of ``options`` reads: PgBouncer 1.18's "unsupported startup
#: parameter: options", and the versions that parse ``options`` (1.20 on): "unsupported
#: startup parameter in options: statement_timeout", "unsupported options startup parameter:
#: ...".
OPTIONS_REFUSED = re.compile(
    r"unsupported startup parameter(: options| in options)|unsupported options startup parameter"
)


#: A placeholder of psycopg's: ``%(name)s`` (group 1 the name, group 2 the format) or
#: ``%%`` (a literal percent sign); any other is refused by :func:`_numbered`.
_PLACEHOLDER = re.compile(r"%(?:\(([^)]+)\))?(.)", re.DOTALL)


@functools.cache
def _numbered(statement: str) -> tuple[str, tuple[str, ...]]:
    """``statement`` as psycopg sends it, and the names of its parameters in order: each
    ``%(name)s`` becomes ``$n``, numbered by first appearance (a name used again keeps its
    number), ``%%`` becomes ``%``. Made once per statement text.

    Raises:
        ValueError: a placeholder other than ``%(name)s`` (a binary one, a positional
            ``%s``): a :class:`LongStatementCursor` statement uses none.
    """
    names: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        name, format_ = match.groups()
        if name is None and format_ == "%":
            return "%"
        if name is None or format_ != "s":
            raise ValueError(f"a placeholder psycopg's numbering here does not take: {match[0]}")
        return f"${names.setdefault(name, len(names) + 1)}"

    return _PLACEHOLDER.sub(number, statement), tuple(names)


class LongStatementCursor(psycopg.RawCursor[Row]):
    """A cursor for statements longer than psycopg keeps parsed between runs: 4,096 bytes
    (``MAX_CACHED_STATEMENT_LENGTH`` in psycopg 3.2 and 3.3). psycopg parses a longer
    statement's placeholders again at every run; the claim statements (7.6 to 9.4 kB) cost
    0.05 to 0.13 ms of CPU a claim that way (a loop of ``claims.claim``, docs/performance.md,
    "Where the time goes"). :meth:`execute_named` numbers a statement's placeholders once,
    as psycopg would, and sends the text with ``$n`` placeholders, which psycopg's raw
    cursor passes on unparsed: the server receives the same statement as from a
    ``psycopg.Cursor`` (same text, same parameter types), so it shares its prepared
    statements."""

    def execute_named(self, statement: str, params: Mapping[str, Any]) -> None:
        """Run ``statement``, whose placeholders are ``%(name)s``, with ``params``.

        Raises:
            KeyError: a name of the statement is missing from ``params``.
            ValueError: the statement has another kind of placeholder.
            psycopg.Error: the statement failed.
        """
        text, names = _numbered(statement)
        self.execute(text, [params[name] for name in names])


def connect(
    *,
    application_name: str = "django-jobq",
    connect_timeout: float | None = None,
    alias: str | None = None,
) -> WatchedConnection:
    """Open an autocommit psycopg connection to the queue database: Django's alias ``alias``,
    by default ``JOBQ['DATABASE']`` (the listener passes ``JOBQ['LISTEN_DATABASE']``).

    Uses the same connection parameters as Django's connection for that alias (including
    ``OPTIONS``), minus Django's own adapters, so ``jsonb`` arrives as Python objects; adds
    :func:`connection_timeouts` (``OPTIONS`` win for the keepalive and connect parameters;
    the timeouts are appended to an ``options`` they give). ``connect_timeout`` (seconds,
    libpq waits at least 2) shortens ``JOBQ['CONNECT_TIMEOUT']``, e.g. near a shutdown
    deadline.

    Raises:
        psycopg.OperationalError: the database cannot be reached in time, or refuses the
            connection; a pooler's refusal of the startup parameter ``options`` ends with
            :data:`OPTIONS_REFUSED_HINT`.
    """
    params = connections[alias or get_settings().DATABASE].get_connection_params()
    params.pop("context", None)
    params.pop("cursor_factory", None)
    params.setdefault("application_name", application_name)
    timeouts = connection_timeouts()
    if params.get("options"):
        timeouts["options"] = f"{params.pop('options')} {timeouts['options']}"
    for key, value in timeouts.items():
        params.setdefault(key, value)
    if connect_timeout is not None:
        longest = float(params["connect_timeout"])
        params["connect_timeout"] = max(2, math.ceil(min(longest, connect_timeout)))
    try:
        return WatchedConnection.connect(**params, autocommit=True)
    except psycopg.OperationalError as exc:
        if OPTIONS_REFUSED.search(str(exc)):
            raise psycopg.OperationalError(str(exc).rstrip() + OPTIONS_REFUSED_HINT) from exc
        raise


def close_unusable_connections() -> None:
    """Before a job, on its handler thread: ``close_old_connections()``, then close each of
    the thread's open Django connections that kept from an earlier job and no longer works
    (e.g. its server process was terminated while idle), so the handler gets a fresh one
    instead of an error that would cost an attempt. Only where Django checks nothing itself:
    ``CONN_MAX_AGE`` above 0 (0 closes every connection between jobs) and
    ``CONN_HEALTH_CHECKS`` off.

    An idle connection's socket has nothing to read: the server sends nothing unasked
    outside a ``LISTEN``. A terminated server process sends its error and closes, which makes
    the socket readable; only then does the check cost a round trip (``SELECT 1``, Django's
    ``is_usable()``). So a healthy connection costs a ``select()``, not a statement, per job."""
    close_old_connections()
    for connection in connections.all(initialized_only=True):
        settings = connection.settings_dict
        if (
            connection.connection is None
            or settings.get("CONN_MAX_AGE") == 0
            or settings.get("CONN_HEALTH_CHECKS")
        ):
            continue
        if _has_input(connection.connection) and not connection.is_usable():
            connection.close()


def _has_input(driver_connection: Any) -> bool:
    """Whether the socket of a driver connection (psycopg 3 or psycopg2, both have
    ``fileno()``) has something to read, or has no socket to look at."""
    try:
        descriptor = driver_connection.fileno()
        readable, _, _ = select.select([descriptor], [], [], 0)
    except Exception:  # a closed connection (each driver raises its own): is_usable() says
        return True
    return bool(readable)


def prepares_by_choice(alias: str | None = None) -> bool:
    """Whether ``DATABASES[alias]['OPTIONS']`` sets ``prepare_threshold`` (by default
    ``JOBQ['DATABASE']``): the user chose whether statements are prepared, and
    :func:`connect` keeps that choice."""
    options = connections[alias or get_settings().DATABASE].settings_dict.get("OPTIONS") or {}
    return "prepare_threshold" in options


def is_connection_fault(exc: psycopg.Error) -> bool:
    """Whether ``exc`` is a failure of the moment rather than of a job's data: the connection
    was lost, or the statement was cancelled (``statement_timeout``, ``lock_timeout``),
    deadlocked or hit a serialization failure (psycopg raises all of them as
    ``OperationalError``), or a prepared statement was made stale by a migration
    (:func:`plan_changed_result_type`): it did not run. The worker reconnects, and runs
    the statement again."""
    return isinstance(exc, psycopg.OperationalError) or plan_changed_result_type(exc)


def plan_changed_result_type(exc: BaseException) -> bool:
    """Whether ``exc`` is PostgreSQL's refusal to run a prepared statement whose result
    columns changed since it was prepared ("cached plan must not change result type",
    SQLSTATE 0A000): a migration added or altered a column of a table the statement returns
    whole (``RETURNING job.*``) while a worker kept it prepared. The statement did not run;
    on a new connection (no statement prepared yet) it runs again."""
    return isinstance(exc, psycopg.errors.FeatureNotSupported) and "cached plan" in str(exc)


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
