"""MVCC health (django_jobq.mvcc): who holds the xmin horizon back, as the system checks,
the metrics and the dashboard report it, against the test server; and the holders only a
server of the test's own can have (prepared transactions, replication slots, a standby with
hot_standby_feedback, a role without pg_read_all_stats), on a throwaway cluster.

The shared test server runs with autovacuum off and a throwaway cluster with it on: the
tests assert that what is reported follows ``pg_settings``, never a value of their own."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.core import checks
from django.db import connection
from django.urls import reverse
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from django_jobq import db, mvcc, sql
from django_jobq.checks import check_mvcc_health
from django_jobq.metrics import collector
from tests import cluster
from tests.conftest import wait_until
from tests.factories import JobFactory

#: The application name of the session that holds a snapshot in these tests.
HOLDER_APPLICATION = f"jobq mvcc test {os.getpid()}"
#: A comment in the holder's statement: the dashboard must not show queries.
SECRET = "not-for-the-dashboard"
HOLDER_QUERY = "SELECT count(*) FROM jobq_job /* not-for-the-dashboard */"
#: The statement of the session that holds a snapshot on the throwaway cluster.
REPORT_QUERY = "SELECT 1 /* not-for-the-dashboard */"


def server_settings() -> tuple[bool, bool]:
    """``(autovacuum, track_counts)`` as ``pg_settings`` has them."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT name, setting = 'on' FROM pg_settings "
            "WHERE name IN ('autovacuum', 'track_counts')"
        )
        values = dict(cursor.fetchall())
    return values["autovacuum"], values["track_counts"]


@pytest.fixture
def holder(transactional_db: None) -> Iterator[psycopg.Connection[Any]]:
    """A second session holding a REPEATABLE READ snapshot, idle in its transaction (as a
    report or a forgotten psql session does), until the test ends."""
    session = db.connect(application_name=HOLDER_APPLICATION)
    session.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    session.execute(HOLDER_QUERY)
    yield session
    session.close()


def held_by(pid: int, health: mvcc.Health) -> mvcc.Holder | None:
    return next((h for h in health.holders if h.holder == "backend" and h.pid == pid), None)


# -- system checks -------------------------------------------------------------------------


def mvcc_messages(**kwargs: Any) -> list[checks.CheckMessage]:
    return [
        message
        for message in checks.run_checks(**kwargs)
        if message.id in ("django_jobq.W004", "django_jobq.W005", "django_jobq.W006")
    ]


@pytest.mark.django_db
def test_w004_names_a_jobq_table_whose_autovacuum_is_off():
    """In the test's transaction: rolled back, so the table's setting is restored."""
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE jobq_job SET (autovacuum_enabled = false)")
    messages = mvcc_messages(databases=["default"])
    table = [m for m in messages if m.id == "django_jobq.W004" and "table jobq_job" in m.msg]
    assert len(table) == 1
    assert "ALTER TABLE jobq_job RESET (autovacuum_enabled)" in table[0].msg
    assert table[0].hint is not None and "jobq_doctor" in table[0].hint
    autovacuum, track_counts = server_settings()
    server = [m for m in messages if "whole server" in m.msg]
    assert len(server) == (0 if autovacuum else 1)  # what pg_settings says
    assert any("track_counts is off" in m.msg for m in messages) == (not track_counts)

    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE jobq_job RESET (autovacuum_enabled)")
    assert not [m for m in mvcc_messages(databases=["default"]) if "table jobq_job" in m.msg]


@pytest.mark.django_db
def test_the_mvcc_checks_run_only_with_the_database_checks():
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE jobq_job SET (autovacuum_enabled = false)")
    (registered,) = [
        check
        for check in checks.registry.registry.get_checks()
        if check is check_mvcc_health  # type: ignore[comparison-overlap]  # stubs: a wrapper
    ]
    assert checks.Tags.database in registered.tags  # Django runs it only with databases
    assert check_mvcc_health() == []  # manage.py check without --database
    assert check_mvcc_health(databases=["other"]) == []  # not the queue's alias
    assert check_mvcc_health(databases=["default"])


def test_w005_names_a_transaction_older_than_the_alert_threshold(holder, settings):
    pid = holder.info.backend_pid
    settings.JOBQ = {**settings.JOBQ, "ALERT_HORIZON_AGE": 0.001}

    def w005() -> list[checks.CheckMessage]:
        return [
            m
            for m in mvcc_messages(databases=["default"])
            if m.id == "django_jobq.W005" and f"pid {pid} " in m.msg
        ]

    (message,) = wait_until(w005, what="W005 for the holder")
    assert repr(HOLDER_APPLICATION) in message.msg
    assert f"pg_terminate_backend({pid})" in message.msg  # it is idle in its transaction
    assert "idle_in_transaction_session_timeout" in message.msg

    settings.JOBQ = {**settings.JOBQ, "ALERT_HORIZON_AGE": None}  # not checked
    assert w005() == []


def test_w006_says_when_the_queue_database_cannot_be_read(manage):
    process = manage("check", "--database", "default", DATABASE_URL="postgres://u@127.0.0.1:1/x")
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr  # a warning, not an error
    assert "django_jobq.W006" in stderr and "could not be read" in stderr


# -- metrics -------------------------------------------------------------------------------


def scrape() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(collector.database_registry(cache_timeout=0)).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def delete_jobs() -> None:
    """Delete every job from a session that then ends: its exit sends its statistics at
    once (an idle session sends them within seconds). While a snapshot older than the
    delete is held, the deleted rows stay, dead."""
    with db.connect(application_name="jobq mvcc test deleter") as deleter:
        deleter.execute("DELETE FROM jobq_job")


def test_the_gauges_report_the_horizon_dead_rows_autovacuum_and_indexes(holder):
    JobFactory.create_batch(20)
    delete_jobs()

    def dead_rows_counted() -> dict[Any, float] | None:
        samples = scrape()
        dead = samples[("jobq_table_dead_rows", (("table", "jobq_job"),))]
        return samples if dead >= 20 else None

    samples = wait_until(dead_rows_counted, what="the statistics to count the deleted jobs")
    assert samples[("jobq_xmin_horizon_age_seconds", ())] > 0
    for kind in mvcc.HOLDERS:
        assert samples[("jobq_xmin_horizon_age_transactions", (("holder", kind),))] >= 0
    # The deleting statement's transaction began after the holder's snapshot.
    assert samples[("jobq_xmin_horizon_age_transactions", (("holder", "backend"),))] >= 1
    assert samples[("jobq_table_live_rows", (("table", "jobq_job"),))] == 0
    autovacuum, track_counts = server_settings()
    for table in mvcc.jobq_tables():
        enabled = samples[("jobq_table_autovacuum_enabled", (("table", table),))]
        assert enabled == float(autovacuum and track_counts)
    index = (("index", "jobq_job_pkey"), ("table", "jobq_job"))
    assert samples[("jobq_index_size_bytes", index)] >= 8192


# -- dashboard -----------------------------------------------------------------------------


def test_the_dashboard_shows_the_holder_and_the_tables_but_no_query(holder, admin_client, settings):
    pid = holder.info.backend_pid
    settings.JOBQ = {**settings.JOBQ, "ALERT_HORIZON_AGE": 0.001}
    html = admin_client.get(reverse("admin:django_jobq_dashboard")).content.decode()
    section = html.split('<div class="module" id="jobq-horizon">', 1)[1].split("</div>", 1)[0]
    row = section.split(f'<tr data-pid="{pid}"', 1)[1].split("</tr>", 1)[0]
    assert 'class="jobq-alert"' in row  # above ALERT_HORIZON_AGE
    assert HOLDER_APPLICATION in row and "idle in transaction" in row
    assert f"pid {pid} (" in section  # its finding
    assert SECRET not in html  # queries stay in jobq_doctor
    tables = html.split('<div class="module" id="jobq-tables">', 1)[1].split("</div>", 1)[0]
    for table in mvcc.jobq_tables():
        assert f'data-table="{table}"' in tables
    autovacuum, track_counts = server_settings()
    assert (">off</td>" in tables) == (not (autovacuum and track_counts))


# -- holders only a server of the test's own can have --------------------------------------


@pytest.fixture(scope="module")
def primary() -> Iterator[cluster.Cluster]:
    """A throwaway cluster that allows prepared transactions and logical replication slots,
    with a database ``doctor`` and a role ``doctor_reader`` with no privileges."""
    reason = cluster.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    own = cluster.Cluster()
    try:
        own.start(wal_level="logical", max_prepared_transactions="4")
        own.create_database("doctor")
        with psycopg.connect(own.url("doctor"), autocommit=True) as admin:
            admin.execute("CREATE ROLE doctor_reader LOGIN")
        yield own
    finally:
        own.remove()


def session(primary: cluster.Cluster, user: str = "postgres", **options: Any) -> Any:
    url = primary.url("doctor").replace("postgres@", f"{user}@", 1)
    return psycopg.connect(url, autocommit=True, **options)


def new_transactions(primary: cluster.Cluster, count: int = 3) -> None:
    """Assign ``count`` transaction ids, so that every held xmin ages by as many."""
    with session(primary) as writer:
        for _ in range(count):
            writer.execute("SELECT pg_current_xact_id()")


def test_prepared_transactions_and_replication_slots_hold_the_horizon(primary):
    with session(primary) as admin:
        # The slot first: creating one waits for every transaction in progress to end.
        admin.execute("SELECT pg_create_logical_replication_slot('doctor_slot', 'test_decoding')")
        admin.execute("BEGIN")
        admin.execute("CREATE TABLE prepared_one (id int)")
        admin.execute("PREPARE TRANSACTION 'doctor-test''s'")
        try:
            new_transactions(primary)
            health = mvcc.read(admin.cursor())
            by_kind = {h.holder: h for h in health.holders}
            prepared = by_kind["prepared_transaction"]
            assert (prepared.name, prepared.user_name, prepared.database) == (
                "doctor-test's",
                "postgres",
                "doctor",
            )
            assert prepared.transaction_age is not None and prepared.transaction_age > 0
            assert prepared.xmin_age is not None and prepared.xmin_age >= 3
            slot = by_kind["replication_slot"]
            assert (slot.name, slot.state, slot.pid, slot.xmin_age) == (
                "doctor_slot",
                "inactive",
                None,
                None,
            )
            assert slot.catalog_xmin_age is not None and slot.catalog_xmin_age >= 3

            found = mvcc.findings(health, mvcc.Thresholds(horizon_age=0, horizon_transactions=0))
            codes = {(f.code, f.severity): f for f in found}
            text = codes[("prepared-transaction", mvcc.PROBLEM)].text
            assert "ROLLBACK PREPARED 'doctor-test''s'" in text  # a literal that works
            assert (
                "pg_drop_replication_slot('doctor_slot')"
                in codes[
                    ("replication-slot", mvcc.WARNING)  # catalog_xmin: catalogs, not jobq tables
                ].text
            )
        finally:
            admin.execute("ROLLBACK PREPARED 'doctor-test''s'")
            admin.execute("SELECT pg_drop_replication_slot('doctor_slot')")
        assert {h.holder for h in mvcc.read(admin.cursor()).holders} <= {"backend"}


def test_a_role_without_pg_read_all_stats_sees_holders_without_details(primary):
    with session(primary, application_name="nightly report") as report:
        report.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        report.execute(REPORT_QUERY)
        pid = report.info.backend_pid
        new_transactions(primary)
        with session(primary, "doctor_reader") as reader:
            health = mvcc.read(reader.cursor())
            assert (health.role, health.sees_all_sessions) == ("doctor_reader", False)
            seen = held_by(pid, health)
            assert seen is not None and seen.hidden
            assert (seen.application_name, seen.user_name) == ("nightly report", "postgres")
            assert (seen.transaction_age, seen.state, seen.query) == (None, None, None)
            assert seen.xmin_age is not None and seen.xmin_age >= 3  # judged by transactions

            found = mvcc.findings(health, mvcc.Thresholds(horizon_age=0, horizon_transactions=0))
            (hidden,) = [f for f in found if f.code == "hidden-sessions"]
            assert 'GRANT pg_read_all_stats TO "doctor_reader"' in hidden.text
            (long,) = [f for f in found if f.subject == f"pid {pid}"]
            assert long.problem and "hidden from role doctor_reader" in long.text

            with session(primary) as admin:  # the grant the finding names
                admin.execute('GRANT pg_read_all_stats TO "doctor_reader"')
            shown = held_by(pid, mvcc.read(reader.cursor()))
            assert shown is not None and not shown.hidden
            assert shown.state == "idle in transaction" and SECRET in (shown.query or "")
            assert shown.transaction_age is not None


def test_a_standby_with_hot_standby_feedback_holds_the_horizon(primary):
    standby = cluster.Cluster()
    try:
        standby.start_as_standby(
            primary,
            max_prepared_transactions="4",  # a standby needs at least the primary's
            hot_standby_feedback="on",
            wal_receiver_status_interval="1",
        )
        with psycopg.connect(standby.url("doctor"), autocommit=True) as query:
            query.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            query.execute("SELECT 1")  # a long query on the standby, as far as vacuum knows
            with session(primary) as admin:

                def fed_back() -> mvcc.Holder | None:
                    new_transactions(primary, 1)
                    holders = mvcc.read_holders(admin.cursor())
                    found = [h for h in holders if h.holder == "standby" and h.xmin_age]
                    return found[0] if found else None

                fed = wait_until(fed_back, timeout=60, what="the standby's feedback")
                assert fed.client_addr == "127.0.0.1" and fed.state == "streaming"
                assert fed.transaction_age is None  # unknown: the query runs elsewhere
                found = mvcc.horizon_findings([fed], "postgres", max_age=None, max_transactions=0)
                (finding,) = found
                assert finding.code == "standby-feedback" and finding.problem
                assert "hot_standby_feedback" in finding.text
    finally:
        standby.remove()


@pytest.mark.django_db
def test_a_partitioned_table_is_read_as_its_partitions():
    """Should a jobq table be partitioned, its partitions hold the rows and the statistics:
    the statements read them (the partitioned parent holds none), and skip a name that
    names no table."""
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE jobq_test_parted (id int) PARTITION BY RANGE (id)")
        cursor.execute(
            "CREATE TABLE jobq_test_parted_low PARTITION OF jobq_test_parted FOR VALUES "
            "FROM (0) TO (10)"
        )
        cursor.execute("CREATE INDEX ON jobq_test_parted (id)")
        names = {"tables": ["jobq_test_parted", "jobq_job", "jobq_no_such_table"]}
        cursor.execute(sql.mvcc.MVCC_TABLES, names)
        assert [row[0] for row in cursor.fetchall()] == ["jobq_job", "jobq_test_parted_low"]
        cursor.execute(sql.mvcc.MVCC_INDEXES, names)
        tables = {row[1] for row in cursor.fetchall()}
    assert tables == {"jobq_job", "jobq_test_parted_low"}


def test_names_and_queries_of_other_sessions_cannot_drive_a_terminal(transactional_db):
    session = db.connect(application_name="jobq mvcc test escapes")
    pid = session.info.backend_pid
    try:
        session.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        session.execute("SELECT '\x1b[2J\u202eforged\tline' AS x\r\nFROM jobq_job")
        health = mvcc.read()
    finally:
        session.close()
    seen = held_by(pid, health)
    assert seen is not None
    assert seen.query == "SELECT '?[2J?forged line' AS x …"  # escape, bidi mark, tab
