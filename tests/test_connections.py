"""The worker's connections, in process: a hung statement is cut by the watchdog, the
heartbeater extends only live leases, repeated failures are logged with back-off."""

import logging
import os
import signal
import threading
import time
from datetime import timedelta

import psycopg
import pytest
from django.db import connection

from django_jobq import claims, db
from django_jobq.models import Job
from django_jobq.worker.heartbeat import Heartbeater
from django_jobq.worker.held import HeldJob, HeldJobs, Progress
from django_jobq.worker.outage import OutageLog
from django_jobq.worker.supervisor import Supervisor
from django_jobq.worker.watchdog import Watchdog
from tests.conftest import through, wait_until
from tests.testapp.jobs import record

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_watchdog_cuts_a_statement_hung_on_a_silent_connection(proxy):
    watchdog = Watchdog(bound=0.5, name="test")
    watchdog.start()
    conn = db.WatchedConnection.connect(through(proxy), autocommit=True)
    watchdog.watch(conn, "test connection")
    try:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        proxy.freeze()
        failures = []

        def run():
            try:
                conn.execute("SELECT 1")
            except psycopg.Error as exc:
                failures.append(exc)

        started = time.monotonic()
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        thread.join(10)
        assert not thread.is_alive(), "the hung statement was not cut"
        assert isinstance(failures[0], psycopg.OperationalError)
        assert 0.5 <= time.monotonic() - started < 5
        wait_until(lambda: watchdog.cuts == 1, timeout=5, what="the cut counted")
    finally:
        proxy.resume()
        conn.close()
        watchdog.stop()


def test_the_watchdog_cuts_a_guarded_block_on_a_connection_the_worker_does_not_own(proxy):
    # The scheduler enqueues on Django's connection: its statements are guarded as a block.
    watchdog = Watchdog(bound=0.5, name="test")
    watchdog.start()
    conn = psycopg.connect(through(proxy), autocommit=True)
    try:
        with watchdog.guard("scheduler", lambda: conn):
            assert conn.execute("SELECT 1").fetchone() == (1,)  # quick: not cut
        assert watchdog.cuts == 0
        proxy.freeze()
        with pytest.raises(psycopg.OperationalError), watchdog.guard("scheduler", lambda: conn):
            conn.execute("SELECT 1")
        # The watchdog's thread counts the cut just after it, racing this one to it.
        wait_until(lambda: watchdog.cuts == 1, timeout=5, what="the cut counted")
    finally:
        proxy.resume()
        conn.close()
        watchdog.stop()


def test_the_watchdog_cuts_at_the_deadline_and_never_an_idle_connection(proxy):
    deadline = time.monotonic()
    watchdog = Watchdog(bound=3600, name="test", deadline=lambda: deadline)
    watchdog.start()
    conn = db.WatchedConnection.connect(through(proxy), autocommit=True)
    watchdog.watch(conn, "test connection")
    try:
        assert watchdog.check(time.monotonic(), deadline) == 0  # idle: nothing to cut
        proxy.freeze()
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
    finally:
        proxy.resume()
        conn.close()
        watchdog.stop()


def test_connections_have_server_side_timeouts_derived_from_the_lease(settings):
    settings.JOBQ = {"VISIBILITY_TIMEOUT": 12}
    with db.connect() as conn:
        assert conn.execute("SHOW statement_timeout").fetchone() == ("4s",)
        assert conn.execute("SHOW lock_timeout").fetchone() == ("2s",)
    settings.JOBQ = {"STATEMENT_TIMEOUT": 0.5, "CONNECT_TIMEOUT": 3}
    assert db.connection_timeouts()["connect_timeout"] == 3
    with db.connect() as conn:
        assert conn.execute("SHOW statement_timeout").fetchone() == ("500ms",)
        with pytest.raises(psycopg.errors.QueryCanceled):
            conn.execute("SELECT pg_sleep(5)")


def claimed_held(queue_cursor, count):
    for n in range(count):
        record.using(visibility_timeout=timedelta(seconds=1)).enqueue(f"held {n}")
    return [HeldJob(job) for job in claims.claim(queue_cursor, worker_id="hb", limit=count)]


def deadline(held):
    return Job.objects.get(pk=held.job.id).lease_deadline


def test_a_finished_job_waiting_for_its_ack_is_not_heartbeated(queue_cursor):
    running, finished = claimed_held(queue_cursor, 2)
    finished.finished = True
    held = HeldJobs()
    held.add(running)
    held.add(finished)
    heartbeater = Heartbeater(held, worker_id="hb")
    heartbeater.start()
    try:
        first = deadline(finished)
        wait_until(lambda: db_now() > first, timeout=5, what="the finished job's deadline")
        assert deadline(finished) == first  # never extended: its lease lapsed
        assert deadline(running) > db_now()  # the running job's is still extended
    finally:
        heartbeater.stop()


def test_leases_are_withheld_while_the_main_loop_is_stalled_and_resume_after(queue_cursor):
    (job,) = claimed_held(queue_cursor, 1)
    held = HeldJobs()
    held.add(job)
    progress = Progress()
    progress.busy()  # a pass that does not end
    heartbeater = Heartbeater(held, worker_id="hb", progress=progress)
    heartbeater.start()
    try:
        first = deadline(job)
        wait_until(
            lambda: Job.objects.filter(pk=job.job.id, lease_deadline__lt=db_now()).exists(),
            timeout=5,
            what="the lease to lapse",
        )
        assert deadline(job) == first
    finally:
        heartbeater.stop()

    (job,) = claimed_held(queue_cursor, 1)
    held = HeldJobs()
    held.add(job)
    progress = Progress()
    progress.busy()
    heartbeater = Heartbeater(held, worker_id="hb", progress=progress)
    heartbeater.start()
    try:
        first = deadline(job)
        progress.progressed()  # within the heartbeat interval: nothing lost
        wait_until(lambda: deadline(job) > first, timeout=5, what="a heartbeat")
    finally:
        heartbeater.stop()


def test_a_handlers_own_heartbeat_is_refused_while_the_main_loop_is_stalled(queue_cursor):
    (job,) = claimed_held(queue_cursor, 1)
    held = HeldJobs()
    held.add(job)
    progress = Progress()
    heartbeater = Heartbeater(held, worker_id="hb", progress=progress)
    first = deadline(job)
    progress.busy()  # a pass that does not end, for longer than the heartbeat interval
    wait_until(
        lambda: progress.stalled_for(time.monotonic()) > job.heartbeat_interval,
        timeout=5,
        what="the main loop to count as stalled",
    )
    assert heartbeater.extend_one(job) is False  # JobContext.heartbeat() while wedged
    assert deadline(job) == first
    assert not job.lease_lost  # withheld, not lost
    progress.progressed()
    assert heartbeater.extend_one(job) is True
    assert deadline(job) > first


def db_now():
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def test_a_repeated_failure_is_logged_first_then_with_back_off_and_once_restored(caplog):
    caplog.set_level(logging.INFO, logger="django_jobq.worker")
    log = OutageLog(interval=0.2)
    log.failed("heartbeat failed: %s", "down")
    logged_by = time.monotonic()  # the first line was logged by now
    for _ in range(49):
        log.failed("heartbeat failed: %s", "down")
    assert [r.getMessage() for r in caplog.records] == ["heartbeat failed: down"]
    wait_until(lambda: time.monotonic() > logged_by + 0.2, timeout=2)  # the interval passes
    log.failed("heartbeat failed: %s", "down")
    assert caplog.records[-1].getMessage() == (
        "heartbeat failed: down (49 more failure(s) since the last line)"
    )
    log.restored("heartbeats %s", "restored")
    assert caplog.records[-1].getMessage().startswith("heartbeats restored after 51 failure(s)")
    log.restored("heartbeats %s", "restored")  # nothing failed since: no line
    assert len(caplog.records) == 3


def _ignore_sigterm_and_hang(slot):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    threading.Event().wait(60)  # a worker that never exits
    return 0


def test_the_supervisor_kills_a_child_still_running_after_its_stop_timeout():
    supervisor = Supervisor(1, _ignore_sigterm_and_hang, stop_timeout=0.5)
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    started = time.monotonic()
    try:
        assert supervisor.run() == 1  # the child was killed
    finally:
        timer.cancel()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    assert time.monotonic() - started < 0.5 + 0.5 + 5


def test_a_long_statement_cursor_sends_what_psycopgs_cursor_sends(connect):
    # Longer than psycopg keeps parsed: its placeholders repeat, and a literal percent sign.
    statement = (
        "SELECT %(a)s::integer + %(b)s::integer AS total, %(a)s::integer AS a, 'p%%' AS p"
        f" /* {'x' * 5000} */"
    )
    conn = connect()
    conn.prepare_threshold = 0  # every statement prepared: the server shows what it got
    params = {"b": 2, "a": 40}
    expected = conn.cursor().execute(statement, params).fetchall()
    with db.LongStatementCursor(conn) as cursor:
        cursor.execute_named(statement, params)
        assert cursor.fetchall() == expected == [(42, 40, "p%")]
    # The same text and parameter types: one prepared statement serves both.
    prepared = conn.execute(
        "SELECT count(*) FROM pg_prepared_statements WHERE length(statement) > 5000"
    ).fetchone()
    assert prepared == (1,)
    with db.LongStatementCursor(conn) as cursor, pytest.raises(KeyError):
        cursor.execute_named(statement, {"a": 1})


def test_a_workers_connection_keeps_one_cursor_per_purpose(connect):
    conn = connect()
    assert isinstance(conn, db.WatchedConnection)
    loop = db.kept_cursor(conn, "loop", psycopg.Connection.cursor)
    assert db.kept_cursor(conn, "loop", psycopg.Connection.cursor) is loop
    assert db.kept_cursor(conn, "outcomes", psycopg.Connection.cursor) is not loop
    claims_cursor = db.kept_cursor(conn, "claims", db.LongStatementCursor)
    assert isinstance(claims_cursor, db.LongStatementCursor)
    with pytest.raises(TypeError, match="'claims' cursor was made by"):
        db.kept_cursor(conn, "claims", psycopg.Connection.cursor)
    assert not connect().closed  # another connection keeps its own
    assert db.kept_cursor(connect(), "loop", psycopg.Connection.cursor) is not loop


def test_any_other_connection_gets_a_new_cursor_each_time():
    with connection.cursor() as django_cursor:
        plain = django_cursor.connection  # the psycopg connection Django wraps
        first = db.kept_cursor(plain, "outcomes", psycopg.Connection.cursor)
        assert db.kept_cursor(plain, "outcomes", psycopg.Connection.cursor) is not first
        assert type(first) is type(plain.cursor())  # Django's own cursor class
