"""MVCC health of the queue database: what keeps vacuum from cleaning the jobq tables.

Every claim and every ack leaves a dead row version behind in ``jobq_job`` and its indexes.
Vacuum removes one only when no transaction can still see it, that is once it died before
the **xmin horizon**: the oldest snapshot or transaction id anything in the cluster still
holds. A ``pg_dump``, a report, a session left idle in a transaction, a prepared transaction
nobody finished, a replication slot or a standby's ``hot_standby_feedback`` holds it back;
with autovacuum off nothing removes even what could go. This module reads who holds the
horizon, the dead rows of every jobq table, their last vacuums, whether autovacuum may run
on them and how large their indexes are, and turns that into findings, each one line that
says what it means and what to do (docs/operations.md, "MVCC health")::

    from django_jobq import mvcc

    health = mvcc.read()                       # -> Health (four statements, catalogs only)
    oldest = health.holders[0]                 # Holder: the oldest xmin first
    oldest.pid, oldest.application_name, oldest.transaction_age   # seconds, or None
    for finding in mvcc.findings(health, mvcc.Thresholds(horizon_age=600.0)):
        print(finding.severity, finding.text)  # "problem" (over a threshold) or "warning"

Who reads it: ``manage.py jobq_doctor`` (all of it), ``jobq_stats --check`` (the horizon),
the system checks ``django_jobq.W004``-``W006`` (``manage.py check --database default``), the
MVCC gauges of :class:`django_jobq.metrics.collector.DatabaseCollector` and the dashboard's
panel. The statements (``sql.mvcc``) read statistics views and catalogs, never a table's
rows: bounded by the sessions, slots and prepared transactions of the server and the jobq
tables' indexes.

Privileges: a role that is neither a superuser nor a member of ``pg_read_all_stats`` sees
other roles' sessions' pid, user, application and xmin, but not their transaction start,
state, client or query, nor a standby's feedback. Such a holder comes with ``hidden=True``
and no age in seconds (its age in transactions is known); a finding says so and names the
grant.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.apps import apps
from django.db import connections

from . import sql
from .conf import JobqSettings, get_settings
from .stats import format_seconds
from .text import first_line, printable

#: The kinds of horizon holder, as ``Holder.holder`` and the metrics' ``holder`` label name
#: them: a session (``backend``), a two-phase transaction, a replication slot, a standby's
#: ``hot_standby_feedback``.
HOLDERS = ("backend", "prepared_transaction", "replication_slot", "standby")
#: A holder's query is its first line, cut to this many characters.
QUERY_LENGTH = 200
#: ``Finding.severity`` of a finding over a threshold: ``jobq_doctor --check`` fails on it.
PROBLEM = "problem"
#: ``Finding.severity`` of a finding worth knowing that fails no check.
WARNING = "warning"


@dataclass(frozen=True)
class Holder:
    """Something that holds the xmin horizon back (``sql.mvcc.MVCC_HORIZON_HOLDERS`` says which
    sessions count). ``holder`` is one of :data:`HOLDERS`; ``pid`` the session's (a slot's:
    its consumer's walsender, ``None`` when inactive); ``name`` a prepared transaction's gid
    or a slot's name. ``state`` is the session's (``active``, ``idle in transaction``, ...) or
    a slot's (``active``, ``inactive``). ``query`` is the first line of the session's current
    or last statement, at most :data:`QUERY_LENGTH` characters. Names and queries come from
    other sessions: their control and invisible characters are replaced by ``?``.
    ``transaction_age`` is seconds since the transaction began (or was prepared): ``None`` for
    slots, standbys and hidden sessions. ``xmin_age`` and ``catalog_xmin_age`` are how many
    transactions began since the xmin it holds (``catalog_xmin``: a slot's, which holds back
    the system catalogs only); ``None`` when it holds none. ``hidden``: this role may not see
    the session's start, state, client and query."""

    holder: str
    pid: int | None
    name: str | None
    application_name: str | None
    client_addr: str | None
    user_name: str | None
    database: str | None
    state: str | None
    wait_event: str | None
    query: str | None
    transaction_age: float | None
    xmin_age: int | None
    catalog_xmin_age: int | None
    hidden: bool

    @property
    def subject(self) -> str:
        """What the holder is, in a few words: ``"pid 4711"``, ``"replication slot s1"``."""
        if self.holder == "prepared_transaction":
            return f"prepared transaction {self.name!r}"
        if self.holder == "replication_slot":
            return f"replication slot {self.name}"
        if self.holder == "standby":
            return f"standby {self.application_name or '?'} (walsender pid {self.pid})"
        return f"pid {self.pid}"


@dataclass(frozen=True)
class TableHealth:
    """A jobq table (or a partition of one) by its statistics (``sql.mvcc.MVCC_TABLES``): live and
    dead row versions (estimates); the last vacuum, autovacuum, analyze and autoanalyze
    (``None``: never); ``autovacuum_enabled``, its reloption (``None``: not set); ``autovacuum``
    whether autovacuum may vacuum it at all (the server's ``autovacuum`` and ``track_counts``
    on, the reloption not false); its size in bytes."""

    table: str
    live_rows: int
    dead_rows: int
    last_vacuum: datetime | None
    last_autovacuum: datetime | None
    last_analyze: datetime | None
    last_autoanalyze: datetime | None
    autovacuum_enabled: bool | None
    autovacuum: bool
    table_bytes: int

    @property
    def dead_ratio(self) -> float | None:
        """Dead row versions per live row (``None`` without live rows)."""
        return self.dead_rows / self.live_rows if self.live_rows else None

    @property
    def vacuumed_at(self) -> datetime | None:
        """The last vacuum, manual or automatic (``None``: never)."""
        moments = [moment for moment in (self.last_vacuum, self.last_autovacuum) if moment]
        return max(moments, default=None)


@dataclass(frozen=True)
class IndexHealth:
    """An index of a jobq table (``sql.mvcc.MVCC_INDEXES``): its size in bytes against its
    table's live rows."""

    index: str
    table: str
    index_bytes: int
    live_rows: int

    @property
    def bytes_per_live_row(self) -> float | None:
        """Bytes of index per live row of its table (``None`` without live rows)."""
        return self.index_bytes / self.live_rows if self.live_rows else None


@dataclass(frozen=True)
class Health:
    """Everything :func:`read` read. ``taken_at`` is the database's clock; ``role`` the role
    that read it and ``sees_all_sessions`` whether it sees every session's details;
    ``autovacuum`` and ``track_counts`` the server's settings; ``holders`` the oldest xmin
    first; ``tables`` and ``indexes`` by name."""

    taken_at: datetime
    role: str
    sees_all_sessions: bool
    autovacuum: bool
    track_counts: bool
    holders: list[Holder]
    tables: list[TableHealth]
    indexes: list[IndexHealth]

    @property
    def oldest_transaction_age(self) -> float:
        """Seconds the oldest transaction holding the horizon has been open (a session's or
        a prepared transaction's, those this role can see); 0.0 when there is none."""
        return max((h.transaction_age or 0.0 for h in self.holders), default=0.0)

    def oldest_xmin_age(self, holder: str) -> int:
        """How many transactions the holders of kind ``holder`` (one of :data:`HOLDERS`)
        hold the horizon back by, at most (their ``xmin_age``); 0 when none holds it."""
        return max((h.xmin_age or 0 for h in self.holders if h.holder == holder), default=0)


@dataclass(frozen=True)
class Thresholds:
    """When a reading becomes a finding. ``horizon_age``: seconds a holder's transaction
    may stay open (default: ``JOBQ['ALERT_HORIZON_AGE']``'s default); ``horizon_transactions``:
    transactions a holder may hold the horizon back by (what judges slots, standbys and
    hidden sessions, whose age in seconds is unknown); ``None`` judges neither. A table's
    dead rows are a finding above ``dead_rows`` and above ``dead_ratio`` times its live rows;
    an index of at least ``index_bytes`` bytes, above ``index_bytes_per_row`` bytes per live
    row (a healthy ``jobq_job`` index takes 20 to 90)."""

    horizon_age: float | None = JobqSettings.ALERT_HORIZON_AGE
    horizon_transactions: int | None = 1_000_000
    dead_rows: int = 100_000
    dead_ratio: float = 1.0
    index_bytes: int = 16 * 1024 * 1024
    index_bytes_per_row: float = 1024.0


@dataclass(frozen=True)
class Finding:
    """One line of diagnosis. ``code`` names the kind (docs/operations.md explains each):
    ``long-transaction``, ``prepared-transaction``, ``replication-slot``, ``standby-feedback``,
    ``hidden-sessions``, ``dead-rows``, ``autovacuum-off``, ``track-counts-off``,
    ``bloated-index``. ``severity`` is :data:`PROBLEM` (over a threshold) or :data:`WARNING`;
    ``subject`` what it is about (``"pid 4711"``, ``"table jobq_job"``, ``"server"``);
    ``text`` what it means and what to do."""

    code: str
    severity: str
    subject: str
    text: str

    @property
    def problem(self) -> bool:
        return self.severity == PROBLEM


# -- reading -------------------------------------------------------------------------------


def jobq_tables() -> list[str]:
    """The names of django-jobq's tables (its models' ``db_table``), sorted."""
    config = apps.get_app_config("django_jobq")
    return sorted({model._meta.db_table for model in config.get_models()})


def _named(cursor: Any) -> list[dict[str, Any]]:
    names = [column.name for column in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def _printable(text: str | None) -> str | None:
    return None if text is None else printable(text.replace("\t", " "))


#: The holder's columns that carry names other sessions chose (made printable).
_NAMES = ("name", "application_name", "user_name", "database")


def read_holders(cursor: Any) -> list[Holder]:
    """Who holds the xmin horizon back, the oldest xmin first, read on ``cursor`` (a Django
    or psycopg cursor on the queue database; one statement, ``sql.mvcc.MVCC_HORIZON_HOLDERS``).
    Names and queries are :func:`django_jobq.text.printable`; a query is its first line, at
    most :data:`QUERY_LENGTH` characters (``None`` when hidden)."""
    cursor.execute(sql.mvcc.MVCC_HORIZON_HOLDERS)
    holders = []
    for row in _named(cursor):
        hidden = bool(row["hidden"])
        statement = None if hidden else row["query"]
        if statement is not None:
            statement = first_line(statement.replace("\r\n", "\n"), QUERY_LENGTH)
        row.update({name: _printable(row[name]) for name in _NAMES})
        row.update(hidden=hidden, query=_printable(statement))
        holders.append(Holder(**row))
    return holders


def read(cursor: Any = None) -> Health:
    """Read the queue database's MVCC health: the server's autovacuum settings, every
    horizon holder, every jobq table's statistics and every index's size (four statements,
    ``sql.mvcc``), on ``cursor`` (a Django or psycopg cursor on the queue database;
    default: one of Django's connection ``JOBQ['DATABASE']``).

    Raises:
        django.db.DatabaseError (psycopg.Error on a psycopg cursor): the database cannot be
        read.
    """
    if cursor is None:
        with connections[get_settings().DATABASE].cursor() as own:
            return read(own)
    cursor.execute(sql.mvcc.MVCC_SERVER)
    (server,) = _named(cursor)
    holders = read_holders(cursor)
    tables = {"tables": jobq_tables()}
    cursor.execute(sql.mvcc.MVCC_TABLES, tables)
    runs = server["autovacuum"] and server["track_counts"]
    table_rows = [
        TableHealth(
            table=row["table_name"],
            live_rows=row["live_rows"],
            dead_rows=row["dead_rows"],
            last_vacuum=row["last_vacuum"],
            last_autovacuum=row["last_autovacuum"],
            last_analyze=row["last_analyze"],
            last_autoanalyze=row["last_autoanalyze"],
            autovacuum_enabled=row["autovacuum_enabled"],
            autovacuum=runs and row["autovacuum_enabled"] is not False,
            table_bytes=row["table_bytes"],
        )
        for row in _named(cursor)
    ]
    cursor.execute(sql.mvcc.MVCC_INDEXES, tables)
    index_rows = [
        IndexHealth(row["index_name"], row["table_name"], row["index_bytes"], row["live_rows"])
        for row in _named(cursor)
    ]
    return Health(
        taken_at=server["taken_at"],
        role=server["role_name"],
        sees_all_sessions=server["sees_all_sessions"],
        autovacuum=server["autovacuum"],
        track_counts=server["track_counts"],
        holders=holders,
        tables=table_rows,
        indexes=index_rows,
    )


# -- findings ------------------------------------------------------------------------------


def format_bytes(count: float) -> str:
    """A size for people: ``"512 B"``, ``"8.0 kB"``, ``"86 MB"``, ``"1.2 GB"`` (powers of 1024,
    PostgreSQL's ``pg_size_pretty`` units)."""
    for unit in ("B", "kB", "MB", "GB"):
        if count < 1024 or unit == "GB":
            break
        count /= 1024
    if unit == "B":
        return f"{count:.0f} B"
    return f"{count:.1f} {unit}" if count < 10 else f"{count:.0f} {unit}"


def _quoted_role(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _who(holder: Holder) -> str:
    """``"pg_dump, user backup from 10.0.0.5, database shop, idle in transaction"``."""
    parts = []
    if holder.application_name:
        parts.append(repr(holder.application_name))
    if holder.user_name:
        client = f" from {holder.client_addr}" if holder.client_addr else ""
        parts.append(f"user {holder.user_name}{client}")
    if holder.database:
        parts.append(f"database {holder.database}")
    if holder.state:
        parts.append(holder.state)
    return ", ".join(parts)


def _backend_remedy(holder: Holder, role: str) -> str:
    pid = holder.pid
    if holder.hidden:
        return (
            f"Its start, state and query are hidden from role {role}: GRANT pg_read_all_stats "
            f"TO {_quoted_role(role)} to see them, or ask user {holder.user_name}."
        )
    who = _quoted_role(holder.user_name) if holder.user_name else "its role"
    if (holder.application_name or "").startswith("pg_dump"):
        return (
            "A pg_dump holds one snapshot for its whole run: dump a replica (or a hot "
            "standby) instead of the primary."
        )
    if (holder.state or "").startswith("idle in transaction"):
        return (
            f"It is idle in its transaction: end it (SELECT pg_terminate_backend({pid})) and "
            f"ALTER ROLE {who} SET idle_in_transaction_session_timeout = '5min' so that "
            f"sessions like it end by themselves."
        )
    if holder.state == "active":
        return (
            f"Cancel its statement if it can go (SELECT pg_cancel_backend({pid})); give "
            f"reports a statement_timeout (ALTER ROLE {who} SET statement_timeout = '5min')."
        )
    return f"End its transaction, or the session (SELECT pg_terminate_backend({pid}))."


def _transactions(count: int | None) -> str:
    return "1 transaction" if count == 1 else f"{count} transactions"


def _age(holder: Holder) -> str:
    """``"has held the xmin horizon back for 2.1 h (1523 transactions)"``, or by the
    transactions alone when the age in seconds is unknown."""
    transactions = _transactions(holder.xmin_age)
    if holder.transaction_age is None:
        return f"holds the xmin horizon back by {transactions}"
    seconds = format_seconds(holder.transaction_age)
    return f"has held the xmin horizon back for {seconds} ({transactions})"


def _horizon_finding(holder: Holder, role: str, severity: str) -> Finding:
    subject = holder.subject
    if holder.holder == "backend":
        text = (
            f"{subject} ({_who(holder)}) {_age(holder)}: vacuum can remove no row version "
            f"that died since, in the jobq tables or any other. "
            f"{_backend_remedy(holder, role)}"
        )
        return Finding("long-transaction", severity, subject, text)
    if holder.holder == "prepared_transaction":
        gid = _literal(holder.name or "")
        text = (
            f"{subject} (owner {holder.user_name}, database {holder.database}) {_age(holder)}, "
            f"waiting for COMMIT PREPARED or ROLLBACK PREPARED, and holds its locks until one "
            f"comes. Let its transaction "
            f"manager finish it, or in database {holder.database}: COMMIT PREPARED {gid} "
            f"(or ROLLBACK PREPARED {gid})."
        )
        return Finding("prepared-transaction", severity, subject, text)
    if holder.holder == "replication_slot":
        text = (
            f"{subject} ({holder.state}) holds the xmin horizon back by "
            f"{_transactions(holder.xmin_age)} for its standby's hot_standby_feedback: vacuum "
            f"can remove no row version that died since, in any database. If the standby is "
            f"gone for good, drop "
            f"the slot: SELECT pg_drop_replication_slot({_literal(holder.name or '')}); if it "
            f"is alive, end its long query (a statement_timeout there)."
        )
        return Finding("replication-slot", severity, subject, text)
    text = (
        f"{subject} ({holder.client_addr or 'client hidden'}) holds the xmin horizon back by "
        f"{_transactions(holder.xmin_age)} through hot_standby_feedback: a long query on the "
        f"standby keeps the primary's dead rows. Give queries there a statement_timeout, or turn "
        f"hot_standby_feedback off and let the standby cancel them (max_standby_streaming_delay)."
    )
    return Finding("standby-feedback", severity, subject, text)


def _catalog_finding(holder: Holder) -> Finding:
    subject = holder.subject
    text = (
        f"{subject} ({holder.state}, database {holder.database}) holds catalog_xmin back by "
        f"{_transactions(holder.catalog_xmin_age)}: the system catalogs bloat (not the jobq "
        f"tables) and the server keeps WAL for it. If its consumer is gone for good, drop it: "
        f"SELECT pg_drop_replication_slot({_literal(holder.name or '')})."
    )
    return Finding("replication-slot", WARNING, subject, text)


def _over(value: float | None, threshold: float | None) -> bool:
    return value is not None and threshold is not None and value > threshold


def horizon_findings(
    holders: Sequence[Holder],
    role: str,
    *,
    max_age: float | None,
    max_transactions: int | None,
) -> list[Finding]:
    """A :data:`PROBLEM` for each holder whose transaction has been open longer than
    ``max_age`` seconds, or that holds the horizon back by more than ``max_transactions``
    transactions (``None``: that threshold is not applied); a :data:`WARNING` for a slot's
    ``catalog_xmin`` past ``max_transactions``, and one naming the grant when some holders'
    details are hidden from ``role`` (the role that read them)."""
    found = []
    for holder in holders:
        if _over(holder.transaction_age, max_age) or _over(holder.xmin_age, max_transactions):
            found.append(_horizon_finding(holder, role, PROBLEM))
        elif _over(holder.catalog_xmin_age, max_transactions):
            found.append(_catalog_finding(holder))
    hidden = sum(holder.hidden for holder in holders)
    if hidden:
        found.append(
            Finding(
                "hidden-sessions",
                WARNING,
                f"role {role}",
                f"{hidden} horizon holder(s) belong to other roles whose transaction start, "
                f"state, client and query role {role} may not see, so their age in seconds is "
                f"unknown: GRANT pg_read_all_stats TO {_quoted_role(role)}.",
            )
        )
    return found


def _dead_rows_finding(table: TableHealth, horizon_held: bool) -> Finding:
    live = f"{table.live_rows} live ones" if table.live_rows else "no live row"
    if horizon_held:
        cause = (
            f"A horizon holder (see its finding) keeps vacuum from removing them: end it, then "
            f"VACUUM (VERBOSE) {table.table}."
        )
    elif not table.autovacuum:
        cause = (
            f"Autovacuum does not run on it (see the autovacuum finding): VACUUM (VERBOSE) "
            f"{table.table} now, then turn autovacuum on."
        )
    else:
        last = table.last_autovacuum
        when = "never" if last is None else f"last at {last.isoformat(timespec='seconds')}"
        cause = (
            f"Autovacuum has not caught up (it ran {when}): VACUUM (VERBOSE) {table.table}; its "
            f"output says how many row versions it could not remove yet."
        )
    return Finding(
        "dead-rows",
        PROBLEM,
        f"table {table.table}",
        f"table {table.table} has {table.dead_rows} dead row versions for {live}: claims and "
        f"scans read past them. {cause}",
    )


def autovacuum_findings(health: Health) -> list[Finding]:
    """The :data:`WARNING` findings about autovacuum itself: off for the server
    (``autovacuum``), blind (``track_counts`` off), or off for a jobq table (its
    ``autovacuum_enabled`` reloption). What system check W004 reports."""
    found = []
    if not health.track_counts:
        found.append(
            Finding(
                "track-counts-off",
                WARNING,
                "server",
                "track_counts is off: autovacuum cannot tell which tables need it and the "
                "dead-row counts read 0. Turn it on: ALTER SYSTEM SET track_counts = on; "
                "SELECT pg_reload_conf();",
            )
        )
    if not health.autovacuum:
        found.append(
            Finding(
                "autovacuum-off",
                WARNING,
                "server",
                "autovacuum is off for the whole server: dead row versions stay until a manual "
                "VACUUM (only anti-wraparound vacuums still run). Turn it on: ALTER SYSTEM SET "
                "autovacuum = on; SELECT pg_reload_conf(); or VACUUM the jobq tables from cron.",
            )
        )
    for table in health.tables:
        if table.autovacuum_enabled is False:
            found.append(
                Finding(
                    "autovacuum-off",
                    WARNING,
                    f"table {table.table}",
                    f"autovacuum is off for table {table.table} (its autovacuum_enabled "
                    f"reloption): its dead row versions stay until a manual VACUUM. Turn it "
                    f"back on: ALTER TABLE {table.table} RESET (autovacuum_enabled);",
                )
            )
    return found


def _index_finding(index: IndexHealth) -> Finding:
    per_row = index.bytes_per_live_row
    rows = (
        f"{index.live_rows} live rows ({per_row:.0f} bytes per live row)"
        if per_row is not None
        else "no live row"
    )
    return Finding(
        "bloated-index",
        WARNING,
        f"index {index.index}",
        f"index {index.index} of {index.table} takes {format_bytes(index.index_bytes)} for "
        f"{rows}: mostly empty pages or dead entries, which scans and the cache carry. If it "
        f"stays so while the queue stays small, rebuild it without blocking writes: REINDEX "
        f"INDEX CONCURRENTLY {index.index};",
    )


def findings(health: Health, thresholds: Thresholds) -> list[Finding]:
    """Every finding in ``health`` by ``thresholds``, problems first: the horizon holders
    (:func:`horizon_findings`), the tables with too many dead rows, autovacuum off or blind
    (:func:`autovacuum_findings`), the indexes too large for their live rows."""
    horizon = horizon_findings(
        health.holders,
        health.role,
        max_age=thresholds.horizon_age,
        max_transactions=thresholds.horizon_transactions,
    )
    held = any(finding.problem for finding in horizon)
    dead = [
        _dead_rows_finding(table, held)
        for table in health.tables
        if table.dead_rows > thresholds.dead_rows
        and (table.dead_ratio is None or table.dead_ratio > thresholds.dead_ratio)
    ]
    bloated = [
        _index_finding(index)
        for index in health.indexes
        if index.index_bytes >= thresholds.index_bytes
        and _over(index.bytes_per_live_row or float("inf"), thresholds.index_bytes_per_row)
    ]
    found = [*horizon, *dead, *autovacuum_findings(health), *bloated]
    return sorted(found, key=lambda finding: not finding.problem)
