"""The worker's prepared statements are planned again once the job table has grown.

PostgreSQL keeps a prepared statement's generic plan until the table's statistics change.
One made while ``jobq_job`` was empty reads the whole table, and stays however large the
table grows (:mod:`django_jobq.worker.plans`). The plans each statement runs with are read
from PostgreSQL itself: ``auto_explain`` sends them to the test's connection as notices.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from django_jobq import claims, enqueue_many, sql
from django_jobq.models import Job
from django_jobq.worker.plans import CHECK_INTERVAL, PlanRefresh
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
    """A connection that prepares every statement on its first run (as the worker's main
    connection does) and collects the plan of each statement it runs."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        self.plans: list[str] = []
        conn.add_notice_handler(self._notice)

    def _notice(self, diagnostic: psycopg.errors.Diagnostic) -> None:
        if diagnostic.message_primary and "plan:" in diagnostic.message_primary:
            self.plans.append(diagnostic.message_primary)

    def claim(self) -> list[claims.ClaimedJob]:
        return claims.claim(self.conn.cursor(), worker_id="plans", limit=4)

    def claim_reads_the_whole_table(self) -> bool:
        """Whether a claim run now reads ``jobq_job`` by a sequential scan."""
        self.plans.clear()
        self.claim()
        assert self.plans, "auto_explain sent no plan"
        return any("Seq Scan on jobq_job" in plan for plan in self.plans)


@pytest.fixture
def explained(connect: Callable[..., psycopg.Connection[Any]]) -> Iterator[Explained]:
    conn = connect()
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
    conn.prepare_threshold = 0
    yield Explained(conn)


def empty_and_analysed(conn: psycopg.Connection[Any]) -> None:
    """The job table as autovacuum leaves an idle queue: empty, its statistics saying so."""
    conn.execute("TRUNCATE jobq_job CASCADE")
    conn.execute("ANALYZE jobq_job")


def backlog(count: int = BACKLOG) -> None:
    enqueue_many([record.prepare(label=f"backlog {n}") for n in range(count)])


def test_plans_made_for_an_empty_table_are_made_again_once_it_has_grown(explained):
    empty_and_analysed(explained.conn)
    now = [0.0]
    refresh = PlanRefresh(worker_id="plans", clock=lambda: now[0])
    assert refresh.check(explained.conn.cursor(), claimed=0) is False  # its size read
    for _ in range(CLAIMS_TO_SETTLE):
        assert explained.claim() == []
    backlog()
    # What PostgreSQL does by itself: the plan it kept reads every row of the grown table.
    assert explained.claim_reads_the_whole_table()

    now[0] += CHECK_INTERVAL
    assert refresh.check(explained.conn.cursor(), claimed=4) is True

    assert not explained.claim_reads_the_whole_table()
    assert len(explained.claim()) == 4


def test_the_size_is_read_only_when_due_and_jobs_were_claimed_since_the_last_read(explained):
    empty_and_analysed(explained.conn)
    now = [0.0]
    refresh = PlanRefresh(worker_id="plans", clock=lambda: now[0])
    cursor = explained.conn.cursor()
    refresh.check(cursor, claimed=0)  # a new connection: read at once
    assert any(sql.plans.JOB_TABLE_SIZE in plan for plan in explained.plans)
    backlog()

    explained.plans.clear()
    assert refresh.check(cursor, claimed=4) is False  # not due yet
    now[0] += CHECK_INTERVAL
    assert refresh.check(cursor, claimed=0) is False  # nothing claimed: nothing sent
    assert explained.plans == []

    assert refresh.check(cursor, claimed=4) is True
    assert any(sql.plans.JOB_TABLE_SIZE in plan for plan in explained.plans)
    backlog()
    now[0] += CHECK_INTERVAL
    explained.plans.clear()
    assert refresh.check(cursor, claimed=4) is False  # nothing claimed since that read
    assert explained.plans == []


def test_growth_of_less_than_twice_the_smallest_size_read_keeps_the_plans(explained, connect):
    empty_and_analysed(explained.conn)
    backlog()
    now = [0.0]
    claimed = [0]

    def check(cursor: psycopg.Cursor[Any]) -> bool:
        now[0] += CHECK_INTERVAL
        claimed[0] += 1
        return refresh.check(cursor, claimed=claimed[0])

    refresh = PlanRefresh(worker_id="plans", clock=lambda: now[0])
    cursor = explained.conn.cursor()
    assert check(cursor) is False  # a new connection: its size read
    backlog(BACKLOG // 2)  # half as much again
    assert check(cursor) is False

    # The table shrinks (VACUUM truncates it): growth counts from the smallest size read.
    Job.objects.all().delete()
    explained.conn.execute("VACUUM jobq_job")
    assert check(cursor) is False
    backlog()
    assert check(cursor) is True

    # The worker reconnects while the queue is empty: its new connection's plans are made
    # for an empty table, whatever size the old connection last read.
    empty_and_analysed(explained.conn)
    other = connect().cursor()
    assert refresh.check(other, claimed=claimed[0]) is False  # read at once, due or not
    backlog()
    assert check(other) is True


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
