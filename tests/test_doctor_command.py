"""``manage.py jobq_doctor`` (the report, ``--json``, ``--check``'s exit status) and
``jobq_stats --check --max-horizon-age``, against a second session that holds a snapshot.

The test server may run with autovacuum on or off: the tests assert that the report follows
``pg_settings``. Other test runs share the server, so their sessions may hold the horizon
too: the tests look for their own holder by pid and set thresholds the others cannot cross.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from io import StringIO
from typing import Any

import psycopg
import pytest
from django.core.management import CommandError, call_command
from django.core.management.base import OutputWrapper
from django.db import connection

from django_jobq import db, mvcc
from django_jobq.management.commands.jobq_doctor import write_report
from tests.conftest import REPO_ROOT, wait_until
from tests.factories import JobFactory

#: The application name of the session that holds a snapshot in these tests.
APPLICATION = f"jobq doctor test {os.getpid()}"
#: Thresholds no holder of another test run reaches (a day; the xid range), so that a check
#: "under the threshold" depends on this test's holder only.
LENIENT = (
    "--max-horizon-age",
    "86400",
    "--max-horizon-transactions",
    str(2**31),
    "--max-dead-rows",
    str(10**12),
)

OPERATIONS = (REPO_ROOT / "docs" / "operations.md").read_text()

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def holder() -> Iterator[psycopg.Connection[Any]]:
    """A session holding a REPEATABLE READ snapshot, idle in its transaction, as a report
    or a ``psql`` session left open does."""
    session = db.connect(application_name=APPLICATION)
    session.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    session.execute("\n  SELECT count(*)\n  FROM jobq_job")
    yield session
    session.close()


def doctor(*args: str) -> str:
    out = StringIO()
    call_command("jobq_doctor", *args, stdout=out)
    return out.getvalue()


def own(document: dict[str, Any], pid: int) -> dict[str, Any]:
    entries: list[dict[str, Any]] = document["horizon_holders"]
    (entry,) = [h for h in entries if h["pid"] == pid]
    return entry


def test_the_doctor_names_the_session_that_holds_the_horizon(holder):
    pid = holder.info.backend_pid
    entry = own(json.loads(doctor("--json")), pid)
    assert entry["holder"] == "backend"
    assert entry["application_name"] == APPLICATION
    assert entry["user"] == connection.settings_dict["USER"]
    assert entry["database"] == connection.settings_dict["NAME"]
    assert entry["state"] == "idle in transaction"
    assert entry["query"] == "SELECT count(*) …"  # the first line, marked as cut
    assert entry["transaction_age"] > 0 and entry["xmin_age"] >= 0
    assert entry["hidden"] is False

    report = doctor("--max-horizon-age", "0")
    (line,) = [
        line for line in report.splitlines() if line.startswith("PROBLEM") and f"pid {pid} " in line
    ]
    assert repr(APPLICATION) in line and "idle in transaction" in line
    assert f"SELECT pg_terminate_backend({pid})" in line
    assert "idle_in_transaction_session_timeout" in line
    (row,) = [
        line for line in report.splitlines() if line.startswith("backend") and f" {pid} " in line
    ]
    assert APPLICATION in row and "SELECT count(*) …" in row


def test_check_fails_over_the_horizon_threshold_and_passes_under_it(holder):
    pid = holder.info.backend_pid
    with pytest.raises(CommandError) as failed:
        doctor("--check", "--max-horizon-age", "0")
    assert failed.value.returncode == 2
    assert f"pid {pid}" in str(failed.value)

    doctor("--check", *LENIENT)  # under every threshold: no error
    with pytest.raises(CommandError, match=f"pid {pid}"):
        doctor("--check", *LENIENT[2:], "--max-horizon-age", "0")


def test_the_exit_status_of_a_real_process(holder, manage):
    pid = holder.info.backend_pid
    failing = manage("jobq_doctor", "--check", "--max-horizon-age", "0")
    stdout, stderr = failing.communicate(timeout=60)
    assert failing.returncode == 2, stderr
    assert f"pid {pid}" in stderr and APPLICATION in stdout
    passing = manage("jobq_doctor", "--check", *LENIENT)
    _, stderr = passing.communicate(timeout=60)
    assert passing.returncode == 0, stderr


def test_the_tables_and_autovacuum_follow_pg_settings():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT setting = 'on' FROM pg_settings WHERE name IN ('autovacuum', 'track_counts')"
        )
        runs = all(on for (on,) in cursor.fetchall())
        cursor.execute("SELECT current_setting('autovacuum') = 'on'")
        (server_on,) = cursor.fetchone()
    document = json.loads(doctor("--json"))
    assert document["server"]["autovacuum"] is server_on
    assert [table["table"] for table in document["tables"]] == mvcc.jobq_tables()
    assert all(table["autovacuum"] is runs for table in document["tables"])
    server_findings = [
        f
        for f in document["findings"]
        if f["code"] == "autovacuum-off" and f["subject"] == "server"
    ]
    assert len(server_findings) == (0 if server_on else 1)
    assert all(f["severity"] == "warning" for f in server_findings)  # fails no --check
    indexes = {index["index"]: index for index in document["indexes"]}
    assert indexes["jobq_job_pkey"]["table"] == "jobq_job"
    assert indexes["jobq_job_pkey"]["index_bytes"] >= 8192


def test_dead_rows_kept_by_a_held_snapshot_are_a_finding_that_names_the_cause(holder):
    JobFactory.create_batch(30)
    with db.connect(application_name="jobq doctor test deleter") as deleter:
        deleter.execute("DELETE FROM jobq_job")  # its exit sends the statistics at once

    def counted() -> dict[str, Any] | None:
        document = json.loads(doctor("--json", "--max-horizon-age", "0", "--max-dead-rows", "29"))
        job = next(table for table in document["tables"] if table["table"] == "jobq_job")
        return document if job["dead_rows"] >= 30 else None

    document = wait_until(counted, what="the statistics to count the deleted jobs")
    (finding,) = [f for f in document["findings"] if f["code"] == "dead-rows"]
    assert finding["severity"] == "problem" and finding["subject"] == "table jobq_job"
    assert "no live row" in finding["text"]
    assert "A horizon holder (see its finding) keeps vacuum from removing them" in finding["text"]
    job = next(table for table in document["tables"] if table["table"] == "jobq_job")
    assert job["live_rows"] == 0 and job["dead_ratio"] is None  # no live row to divide by


def test_an_index_large_for_its_live_rows_is_a_warning_not_a_failure():
    document = json.loads(
        doctor("--json", "--min-index-bytes", "0", "--max-index-bytes-per-row", "0")
    )
    bloated = {f["subject"]: f for f in document["findings"] if f["code"] == "bloated-index"}
    assert "index jobq_job_pkey" in bloated
    assert "REINDEX INDEX CONCURRENTLY jobq_job_pkey" in bloated["index jobq_job_pkey"]["text"]
    assert {f["severity"] for f in bloated.values()} == {"warning"}
    doctor("--check", *LENIENT, "--min-index-bytes", "0", "--max-index-bytes-per-row", "0")


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--max-horizon-age", "-1"),
        ("--max-horizon-age", "nan"),
        ("--max-horizon-transactions", "-1"),
        ("--max-dead-rows", "1.5"),
        ("--max-dead-ratio", "inf"),
        ("--min-index-bytes", "ten"),
        ("--max-index-bytes-per-row", "-0.5"),
    ],
)
def test_a_threshold_that_cannot_mean_anything_is_a_usage_error(option, value):
    with pytest.raises(CommandError, match=f"argument {option}: expected"):
        doctor(option, value)


def test_jobq_stats_check_fails_on_a_transaction_that_holds_the_horizon_too_long(holder, settings):
    pid = holder.info.backend_pid
    with pytest.raises(CommandError) as failed:
        call_command("jobq_stats", "--check", "--max-horizon-age", "0", stdout=StringIO())
    assert failed.value.returncode == 2
    assert f"pid {pid} ({APPLICATION!r}" in str(failed.value)
    call_command("jobq_stats", "--check", "--max-horizon-age", "86400", stdout=StringIO())

    settings.JOBQ = {**settings.JOBQ, "ALERT_HORIZON_AGE": 0.001}  # the default threshold
    with pytest.raises(CommandError, match=f"pid {pid} "):
        call_command("jobq_stats", "--check", stdout=StringIO())
    settings.JOBQ = {**settings.JOBQ, "ALERT_HORIZON_AGE": None}  # not checked
    call_command("jobq_stats", "--check", stdout=StringIO())
    call_command("jobq_stats", "--max-horizon-age", "0", stdout=StringIO())  # no --check


def documented_health() -> mvcc.Health:
    """The example of docs/operations.md: a report left idle in its transaction for 38
    minutes while the workers drained a backlog."""
    taken_at = datetime(2026, 12, 1, 9, 30, tzinfo=UTC)
    tables = [
        mvcc.TableHealth(
            table=name,
            live_rows=live,
            dead_rows=dead,
            last_vacuum=None,
            last_autovacuum=None if vacuumed is None else taken_at - timedelta(seconds=vacuumed),
            last_analyze=None,
            last_autoanalyze=None if vacuumed is None else taken_at - timedelta(seconds=vacuumed),
            autovacuum_enabled=None,
            autovacuum=True,
            table_bytes=size,
        )
        for name, live, dead, vacuumed, size in [
            ("jobq_dead_letter", 12, 0, None, 49152),
            ("jobq_dedup_key", 0, 0, None, 0),
            ("jobq_job", 1200, 2_350_000, 45, 431_000_000),
            ("jobq_outcome_rollup", 8640, 310, 2400, 2_260_000),
            ("jobq_queue_sample", 4320, 0, None, 450_000),
            ("jobq_schedule", 3, 58, 5000, 16384),
            ("jobq_task_result", 0, 0, None, 8192),
            ("jobq_worker_process", 4, 990, 600, 16384),
        ]
    ]
    live = {table.table: table.live_rows for table in tables}
    sizes = {
        ("jobq_job_kind_claim_idx", "jobq_job"): 168_000_000,
        ("jobq_job_claim_idx", "jobq_job"): 96_000_000,
        ("jobq_job_claim_all_idx", "jobq_job"): 79_000_000,
        ("jobq_job_pkey", "jobq_job"): 54_000_000,
        ("jobq_outcome_rollup_uniq", "jobq_outcome_rollup"): 1_130_000,
    }
    indexes = [
        mvcc.IndexHealth(index, table, size, live[table])
        for (index, table), size in sorted(sizes.items(), key=lambda item: item[0][1::-1])
    ]
    indexes += [mvcc.IndexHealth(f"small_{n}", "jobq_schedule", 16384, 3) for n in range(21)]
    report = mvcc.Holder(
        holder="backend",
        pid=48211,
        name=None,
        application_name="nightly-report",
        client_addr="10.0.2.15",
        user_name="reports",
        database="shop",
        state="idle in transaction",
        wait_event="Client: ClientRead",
        query="SELECT customer_id, sum(total) FROM orders JOIN order_lines USING (order_id) …",
        transaction_age=2280.0,
        xmin_age=41230,
        catalog_xmin_age=None,
        hidden=False,
    )
    return mvcc.Health(taken_at, "shop", True, True, True, [report], tables, indexes)


def test_the_documented_report_is_the_commands():
    health = documented_health()
    out = StringIO()
    write_report(OutputWrapper(out), health, mvcc.findings(health, mvcc.Thresholds()))
    documented = OPERATIONS.split("$ python manage.py jobq_doctor\n", 1)[1].split("```", 1)[0]
    assert out.getvalue() == documented
