"""The worker's prepared statements are planned again once the job table has grown.

PostgreSQL keeps a prepared statement's generic plan until the table's statistics change.
One made while ``jobq_job`` was empty reads the whole table, and stays however large the
table grows. Each claim reads the table's size, and the worker discards its plans once the
table has grown (:mod:`django_jobq.worker.plans`). The plans each statement runs with are read
from PostgreSQL itself: ``auto_explain`` sends them to the test's connection as notices.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction

from django_jobq import claims, db, enqueue_many, sql
from django_jobq.models import Job
from django_jobq.worker import statistics
from django_jobq.worker.plans import PlanRefresh
from django_jobq.worker.statistics import StatisticsCheck
from tests.conftest import wait_until
from tests.test_wake import Running
from tests.testapp.jobs import record

pytestmark = pytest.mark.django_db(transaction=True)

#: Claims run before the backlog arrives: PostgreSQL plans a prepared statement for its
#: parameters five times, then keeps a generic plan if it costs no more.
CLAIMS_TO_SETTLE = 8
#: Jobs in the backlog: a table of several hundred kilobytes, well past ``MIN_GROWTH``.
BACKLOG = 2000


class Explained:
    """A worker's connection that prepares every statement on its first run (as the main
    loop's does) and collects the plan of each statement it runs, sent by ``auto_explain``."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        assert isinstance(conn, db.WatchedConnection)
        self.conn = conn
        self.plans: list[str] = []
        try:
            conn.execute("LOAD 'auto_explain'")
        except psycopg.Error as exc:
            pytest.skip(f"auto_explain cannot be loaded here: {exc}")
        for setting, value in (
            ("auto_explain.log_min_duration", "0"),
            ("auto_explain.log_level", "notice"),
            ("client_min_messages", "notice"),
        ):
            conn.execute("SELECT set_config(%s, %s, false)", [setting, value])
        conn.add_notice_handler(self._notice)
        conn.prepare_threshold = 0

    def _notice(self, diagnostic: psycopg.errors.Diagnostic) -> None:
        if diagnostic.message_primary and "plan:" in diagnostic.message_primary:
            self.plans.append(diagnostic.message_primary)

    def claim(self) -> list[claims.ClaimedJob]:
        return claims.claim(self.conn.cursor(), worker_id="plans", limit=4)

    def claim_uses_the_claim_index(self) -> bool:
        """Whether a claim run now reads the ready jobs at the front of the claim order
        through ``jobq_job_claim_all_idx``. A plan made while the table was empty reads
        them by a sequential scan of the whole table instead."""
        self.plans.clear()
        self.claim()
        assert self.plans, "auto_explain sent no plan"
        return any("Index Scan using jobq_job_claim_all_idx" in plan for plan in self.plans)


@pytest.fixture
def explained(
    connect: Callable[..., psycopg.Connection[Any]], without_autovacuum: None
) -> Explained:
    return Explained(connect())


@pytest.fixture
def without_autovacuum(connect: Callable[..., psycopg.Connection[Any]]) -> Iterator[None]:
    """Autovacuum off for ``jobq_job`` during the test: its ANALYZE would make the plans
    again whenever it came by."""
    conn = connect()
    conn.execute("ALTER TABLE jobq_job SET (autovacuum_enabled = off)")
    yield
    conn.execute("ALTER TABLE jobq_job RESET (autovacuum_enabled)")


def empty_and_analysed(conn: psycopg.Connection[Any]) -> None:
    """The job table as autovacuum leaves an idle queue: empty, its statistics saying so.
    ANALYZE of an empty table keeps the columns' statistics of the last one that sampled
    rows (a worker's in an earlier test analysed a backlog), which change the plans made
    next: they are cleared first, which takes a superuser."""
    row = conn.execute("SELECT current_setting('is_superuser') = 'on'").fetchone()
    if not (row and row[0]):
        pytest.skip("clearing the table's statistics takes a superuser")
    conn.execute("TRUNCATE jobq_job CASCADE")
    send_activity_counters(conn.cursor())  # before any row inserted after it is counted
    conn.execute("DELETE FROM pg_statistic WHERE starelid = 'jobq_job'::regclass")
    conn.execute("ANALYZE jobq_job")


def backlog(count: int = BACKLOG) -> None:
    enqueue_many([record.prepare(label=f"backlog {n}") for n in range(count)])


def claims_then_refresh(explained: Explained, refresh: PlanRefresh, count: int = 1) -> bool:
    """``count`` claims, then the refresh, as a worker's turns run them; whether it
    discarded the plans."""
    for _ in range(count):
        explained.claim()
    return refresh.refresh(explained.conn)


def test_plans_made_for_an_empty_table_are_made_again_once_it_has_grown(explained):
    empty_and_analysed(explained.conn)
    refresh = PlanRefresh(worker_id="plans")
    assert claims_then_refresh(explained, refresh, CLAIMS_TO_SETTLE) is False
    backlog()
    # What PostgreSQL does by itself: the plan it kept reads every row of the grown table.
    assert not explained.claim_uses_the_claim_index()

    assert refresh.refresh(explained.conn) is True  # the claim read the grown table's size

    assert explained.claim_uses_the_claim_index()
    assert len(explained.claim()) == 4
    assert refresh.refresh(explained.conn) is False  # planned for this size already


def test_a_table_emptied_while_the_worker_idles_then_filled_again_is_planned_again(explained):
    empty_and_analysed(explained.conn)
    backlog()
    refresh = PlanRefresh(worker_id="plans")
    assert claims_then_refresh(explained, refresh, CLAIMS_TO_SETTLE) is False
    # The backlog drains; VACUUM cuts the table to nothing and ANALYZE says it is empty:
    # PostgreSQL plans the idle worker's next claims for an empty table.
    Job.objects.all().delete()
    explained.conn.execute("VACUUM ANALYZE jobq_job")
    assert claims_then_refresh(explained, refresh, CLAIMS_TO_SETTLE) is False
    backlog()  # no larger than the first
    assert not explained.claim_uses_the_claim_index()

    assert refresh.refresh(explained.conn) is True
    assert explained.claim_uses_the_claim_index()


def test_growth_of_less_than_twice_or_of_a_few_pages_keeps_the_plans(explained):
    empty_and_analysed(explained.conn)
    refresh = PlanRefresh(worker_id="plans")
    assert claims_then_refresh(explained, refresh) is False
    backlog(20)  # from nothing to a few pages: less than MIN_GROWTH
    assert claims_then_refresh(explained, refresh) is False
    backlog()
    assert claims_then_refresh(explained, refresh) is True
    backlog(BACKLOG // 2)  # half as much again
    assert claims_then_refresh(explained, refresh) is False
    assert refresh.refresh(explained.conn) is False  # no claim since: nothing to go by


def test_a_new_connection_counts_from_what_its_own_claims_read(explained, connect):
    empty_and_analysed(explained.conn)
    refresh = PlanRefresh(worker_id="plans")
    assert claims_then_refresh(explained, refresh) is False
    backlog()
    # The worker reconnects: the new connection's plans are made for the grown table, and
    # the old connection's empty-table sizes say nothing of them.
    reconnected = Explained(connect())
    assert claims_then_refresh(reconnected, refresh, CLAIMS_TO_SETTLE) is False
    assert reconnected.claim_uses_the_claim_index()


def test_a_worker_that_waited_on_an_empty_queue_plans_again_when_a_backlog_arrives(caplog, connect):
    caplog.set_level(logging.DEBUG, logger="django_jobq.worker")
    empty_and_analysed(connect())
    with Running(worker_id="plans-worker", concurrency=4) as running:
        assert running.worker._listener is not None
        wait_until(running.worker._listener.keeps_session_state.is_set, what="the check")
        for n in range(CLAIMS_TO_SETTLE):  # one job at a time: its statements settle
            record.enqueue(f"alone {n}")
            wait_until(lambda: not Job.objects.exists(), what="the job to be acked")
        backlog()
        wait_until(lambda: not Job.objects.exists(), timeout=60, what="the backlog to drain")
    planned_again = [r for r in caplog.records if "planned again" in r.getMessage()]
    assert planned_again, "the worker kept the plans it made for an empty table"
    assert "plans-worker" in planned_again[0].getMessage()


def test_a_worker_that_prepares_nothing_discards_nothing(caplog, connect):
    caplog.set_level(logging.DEBUG, logger="django_jobq.worker")
    empty_and_analysed(connect())
    running = Running(listen=False, poll_interval=0.05, worker_id="plans-unprepared")
    running.thread.start()  # not ``with``: that waits for a listener
    try:
        for n in range(CLAIMS_TO_SETTLE):
            record.enqueue(f"alone {n}")
            wait_until(lambda: not Job.objects.exists(), what="the job to be acked")
        backlog()
        # One thread, a batch of one, planning every statement: slow on a loaded host.
        wait_until(lambda: not Job.objects.exists(), timeout=300, what="the backlog to drain")
    finally:
        running.__exit__(None, None, None)
    assert not [r for r in caplog.records if "planned again" in r.getMessage()]


# A backlog the statistics do not know (django_jobq.worker.statistics): plans of every
# connection, prepared or not, are made from statistics that may count no row.

#: Jobs in a backlog the statistics do not know: past ``statistics.MIN_GROWTH_ROWS`` and
#: ``statistics.MIN_GROWTH_BYTES``.
UNKNOWN_BACKLOG = 5000


def counts(conn: psycopg.Connection[Any]) -> statistics.TableCounts:
    row = conn.execute(sql.plans.READ_JOB_TABLE_COUNTS).fetchone()
    assert row is not None
    return statistics.TableCounts(*row)


def counted_by_the_claim_index(conn: psycopg.Connection[Any]) -> float:
    """The rows the statistics of ``jobq_job_claim_all_idx`` (the ready jobs) count: what
    PostgreSQL plans a claim's read of them with."""
    row = conn.execute(
        "SELECT reltuples FROM pg_class WHERE oid = 'jobq_job_claim_all_idx'::regclass"
    ).fetchone()
    assert row is not None
    return float(row[0])


def send_activity_counters(cursor: Any) -> None:
    """Make the session of ``cursor`` send its activity counters (inserts, deletes, a
    TRUNCATE) as its statement ends (PostgreSQL 15 and newer), not up to 10 s later: a
    late TRUNCATE's would set the table's live rows to none, after rows inserted since."""
    cursor.execute(
        "SELECT pg_stat_force_next_flush() FROM pg_proc WHERE proname = 'pg_stat_force_next_flush'"
    )


def counted_backlog(conn: psycopg.Connection[Any], count: int) -> None:
    """``count`` more jobs, once the activity counters hold them (this process's Django
    connection sends its counts now: :func:`send_activity_counters`)."""
    before = counts(conn).live_rows
    backlog(count)
    with connection.cursor() as cursor:
        send_activity_counters(cursor)
    wait_until(lambda: counts(conn).live_rows >= before + count, what="the activity counters")


def unknown_backlog(conn: psycopg.Connection[Any], count: int = UNKNOWN_BACKLOG) -> None:
    """``count`` jobs enqueued after the table was analysed empty."""
    empty_and_analysed(conn)
    counted_backlog(conn, count)


def test_a_backlog_the_statistics_do_not_know_is_analysed(explained):
    unknown_backlog(explained.conn)
    assert counted_by_the_claim_index(explained.conn) == 0  # what claims are planned with
    check = StatisticsCheck(worker_id="statistics")

    assert check.run(explained.conn) is True

    assert counted_by_the_claim_index(explained.conn) >= UNKNOWN_BACKLOG * 0.9
    assert explained.claim_uses_the_claim_index()
    assert check.run(explained.conn) is False  # the statistics know the backlog now


def test_prepared_plans_of_every_connection_are_made_again(explained, connect):
    empty_and_analysed(explained.conn)
    assert claims_then_refresh(explained, PlanRefresh(worker_id="plans"), CLAIMS_TO_SETTLE) is False
    counted_backlog(explained.conn, UNKNOWN_BACKLOG)
    assert not explained.claim_uses_the_claim_index()  # the generic plan of an empty table

    assert StatisticsCheck(worker_id="another worker").run(connect()) is True

    assert explained.claim_uses_the_claim_index()


def test_a_backlog_that_fills_the_pages_of_an_emptied_table_is_analysed_too(explained):
    backlog(UNKNOWN_BACKLOG)
    Job.objects.all().delete()
    # Autovacuum's VACUUM of the emptied table, when its cut of the empty pages gave way to
    # the workers' locks: its statistics count no row, in pages the table keeps.
    explained.conn.execute("VACUUM (TRUNCATE false) jobq_job")
    assert counts(explained.conn).counted_bytes > 0
    counted_backlog(explained.conn, UNKNOWN_BACKLOG)  # in those pages
    assert counts(explained.conn).bytes < 2 * counts(explained.conn).counted_bytes

    assert StatisticsCheck(worker_id="statistics").run(explained.conn) is True
    assert counted_by_the_claim_index(explained.conn) >= UNKNOWN_BACKLOG * 0.9


def test_a_table_within_twice_what_its_statistics_count_is_not_analysed(explained):
    check = StatisticsCheck(worker_id="statistics")
    empty_and_analysed(explained.conn)
    counted_backlog(explained.conn, 20)  # from nothing to a few pages: less than the least
    assert check.run(explained.conn) is False
    counted_backlog(explained.conn, UNKNOWN_BACKLOG)
    assert check.run(explained.conn) is True
    counted_backlog(explained.conn, UNKNOWN_BACKLOG // 2)  # half as much again
    assert check.run(explained.conn) is False
    counted_backlog(explained.conn, UNKNOWN_BACKLOG)  # past twice what they count
    assert check.run(explained.conn) is True


def test_rows_of_an_insert_still_open_are_not_analysed_as_none(explained):
    empty_and_analysed(explained.conn)
    check = StatisticsCheck(worker_id="statistics")
    with transaction.atomic():
        backlog(UNKNOWN_BACKLOG)  # the table grows on disk; its rows are not committed
        assert counts(explained.conn).bytes >= statistics.MIN_GROWTH_BYTES
        # An ANALYZE now would count them as none, in the pages they fill.
        assert check.run(explained.conn) is False
    with connection.cursor() as cursor:
        send_activity_counters(cursor)
    wait_until(lambda: counts(explained.conn).live_rows >= UNKNOWN_BACKLOG)
    assert check.run(explained.conn) is True
    assert counted_by_the_claim_index(explained.conn) >= UNKNOWN_BACKLOG * 0.9


def test_a_user_that_may_not_analyse_the_table_does_not_try_and_says_so_once(
    explained, connect, caplog
):
    caplog.set_level(logging.INFO, logger="django_jobq.worker")
    unknown_backlog(explained.conn)
    conn = connect()
    conn.execute("DROP ROLE IF EXISTS jobq_not_owner")
    conn.execute("CREATE ROLE jobq_not_owner")
    conn.execute("GRANT SELECT ON jobq_job TO jobq_not_owner")
    try:
        conn.execute("SET ROLE jobq_not_owner")
        check = StatisticsCheck(worker_id="not the owner")
        assert counts(conn).may_analyse is False
        assert check.run(conn) is False
        assert check.run(conn) is False
    finally:
        conn.execute("RESET ROLE")
        conn.execute("DROP OWNED BY jobq_not_owner")
        conn.execute("DROP ROLE jobq_not_owner")
    warnings = [r for r in caplog.records if "may not analyse" in r.getMessage()]
    assert len(warnings) == 1
    assert counts(explained.conn).counted_rows == 0  # nothing analysed the table
    assert counts(explained.conn).may_analyse is True  # the owner may


def test_an_analyze_another_session_holds_off_is_tried_again_at_the_next_check(explained, connect):
    unknown_backlog(explained.conn)
    holder = connect(autocommit=False)
    holder.execute("LOCK TABLE jobq_job IN SHARE UPDATE EXCLUSIVE MODE")  # as a VACUUM does
    check = StatisticsCheck(worker_id="statistics")
    assert check.run(explained.conn) is False  # skipped, not waited for
    assert counts(explained.conn).counted_rows == 0
    holder.rollback()
    assert check.run(explained.conn) is True


def test_an_analyze_the_statement_timeout_cancels_is_tried_again_later(explained, connect, caplog):
    caplog.set_level(logging.WARNING, logger="django_jobq.worker")
    unknown_backlog(explained.conn)
    now = [0.0]
    check = StatisticsCheck(worker_id="statistics", clock=lambda: now[0])
    # SKIP_LOCKED skips a lock on the table only: the ANALYZE waits for one on an index
    # (as a migration's ALTER INDEX takes it), until the statement timeout cancels it.
    holder = connect(autocommit=False)
    holder.execute("ALTER INDEX jobq_job_lease_idx SET TABLESPACE pg_default")
    explained.conn.execute("SET statement_timeout = 100")  # milliseconds
    assert check.run(explained.conn) is False  # cancelled: the connection goes on
    assert [r for r in caplog.records if "cancelled" in r.getMessage()]
    holder.rollback()
    explained.conn.execute("RESET statement_timeout")
    assert check.run(explained.conn) is False  # not before the wait
    now[0] += statistics.CANCELLED_RETRY
    assert check.run(explained.conn) is True


def test_the_check_reads_the_counts_at_most_once_a_second(explained, monkeypatch):
    # Counted by the reads of the counts: the ANALYZEs are the other tests' business.
    reads: list[statistics.TableCounts] = []
    read = StatisticsCheck._read

    def counted_read(connection: psycopg.Connection[Any]) -> statistics.TableCounts:
        reads.append(read(connection))
        return reads[-1]

    monkeypatch.setattr(StatisticsCheck, "_read", staticmethod(counted_read))
    empty_and_analysed(explained.conn)  # nothing to analyse: one read a run
    now = [0.0]
    check = StatisticsCheck(worker_id="statistics", clock=lambda: now[0])
    check.run_if_due(explained.conn)
    assert len(reads) == 1
    now[0] += statistics.CHECK_INTERVAL / 2
    check.run_if_due(explained.conn)
    assert len(reads) == 1
    now[0] += statistics.CHECK_INTERVAL / 2
    check.run_if_due(explained.conn)
    assert len(reads) == 2


def test_a_worker_started_on_a_backlog_its_statistics_do_not_know_analyses_the_table(
    caplog, connect, without_autovacuum
):
    caplog.set_level(logging.INFO, logger="django_jobq.worker")
    conn = connect()
    unknown_backlog(conn)
    with Running(worker_id="statistics-worker", concurrency=4):
        wait_until(lambda: not Job.objects.exists(), timeout=60, what="the backlog to drain")
    analysed = [r for r in caplog.records if "analysed the table" in r.getMessage()]
    assert analysed, "the worker claimed with statistics that counted no row"
    assert "statistics-worker" in analysed[0].getMessage()
    assert counted_by_the_claim_index(conn) >= UNKNOWN_BACKLOG * 0.5
