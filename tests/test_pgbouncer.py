"""Behind PgBouncer in transaction pooling mode: what docs/pgbouncer.md says, proved.

Each test runs through a PgBouncer of this module's own (tests/pgbouncer.py) in front of the
test database, in transaction pooling mode with ``server_round_robin = 1``, so that
consecutive transactions of one client run on different server connections: a client that
relied on session state (a named prepared statement, a ``LISTEN``) breaks here as it would on
a busy pool. Skipped where the ``pgbouncer`` binary is missing (``scripts/test`` installs
Debian's package when it runs as root).

- Enqueue from Django through PgBouncer, with PgBouncer's default startup parameters (Django
  sends no ``options``), over more transactions than psycopg's prepare threshold; and the
  error a prepare threshold brings.
- A ``--no-listen`` worker through it: claims, retries, dead letters, acks.
- The workers' startup parameter ``options`` (their statement and lock timeouts): refused
  without ``ignore_startup_parameters = options``, with an error that says what to do;
  dropped with it.
- A listening worker through it: its listener cannot hear notifications there; it says so
  (an ERROR naming ``--no-listen`` and ``JOBQ['LISTEN_DATABASE']``) and the worker polls.
  With ``LISTEN_DATABASE`` naming a direct connection, it is woken by enqueues made
  through PgBouncer.
"""

from __future__ import annotations

import copy
import queue
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import IO, Any

import psycopg
import pytest
from django.db import ProgrammingError, connections, transaction

from django_jobq import db, enqueue_many
from django_jobq.models import DeadLetter, Job, Queue
from django_jobq.worker import Worker
from django_jobq.worker import listener as listener_module
from django_jobq.worker.listener import Listener
from django_jobq.worker.wakeup import Wakeup
from tests import pgbouncer as pgbouncer_module
from tests.conftest import database_url, wait_until
from tests.pgbouncer import PgBouncer
from tests.test_wake import (
    WAKE_BOUND,
    Running,
    listener_pid,
    served,
    sleeping_an_hour,  # noqa: F401  (a fixture)
)
from tests.testapp.jobs import pgbouncer_attempts, record
from tests.testapp.models import Effect

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        pgbouncer_module.unavailable_reason() is not None,
        reason=pgbouncer_module.unavailable_reason() or "",
    ),
]

#: Seconds a worker subprocess may take for what a test waits for: generous, so a loaded
#: host does not fail the test, and a hung worker still does.
TIMEOUT = 60.0

#: More executions of one statement than psycopg's default ``prepare_threshold`` (5), after
#: which it would prepare the statement if it prepared at all.
MORE_THAN_PREPARE_THRESHOLD = 12


def _start(**options: Any) -> Iterator[PgBouncer]:
    settings = connections["default"].settings_dict
    bouncer = PgBouncer(
        host=settings["HOST"] or "127.0.0.1",
        port=int(settings["PORT"] or 5432),
        user=settings["USER"],
        password=settings["PASSWORD"] or "",
        **options,
    )
    try:
        bouncer.start()
        bouncer.warm(settings["NAME"])  # the test database: pytest-django has set it up
        yield bouncer
    finally:
        bouncer.stop()


@pytest.fixture(scope="module")
def pgbouncer(django_db_setup: None) -> Iterator[PgBouncer]:
    """PgBouncer as docs/pgbouncer.md configures it: transaction pooling,
    ``ignore_startup_parameters = options``. Stopped before the test database is dropped
    (its server connections would keep the database in use)."""
    yield from _start()


@pytest.fixture(scope="module")
def default_pgbouncer(django_db_setup: None) -> Iterator[PgBouncer]:
    """PgBouncer in transaction pooling mode with its default startup parameters: no
    ``ignore_startup_parameters``."""
    yield from _start(ignore_startup_parameters=())


@pytest.fixture
def django_alias(transactional_db: None) -> Iterator[Callable[..., str]]:
    """Add a Django database alias for the test database through a PgBouncer (the test
    database's settings with PgBouncer's address, ``DISABLE_SERVER_SIDE_CURSORS`` as
    docs/pgbouncer.md recommends, ``OPTIONS`` updated with ``options``), connected; returns
    its name. Removed after the test. Connected at once because Django's test case lets no
    alias it did not set up open a connection on its own (``ensure_connection``)."""
    added: list[str] = []

    def add(bouncer: PgBouncer, name: str = "pgbouncer", **options: Any) -> str:
        settings = copy.deepcopy(connections["default"].settings_dict)
        settings.update(HOST="127.0.0.1", PORT=bouncer.port, DISABLE_SERVER_SIDE_CURSORS=True)
        settings["OPTIONS"].update(options)
        connections.settings[name] = settings
        added.append(name)
        connections[name].connect()
        return name

    yield add
    for name in added:
        connections[name].close()
        del connections[name]
        del connections.settings[name]


def test_enqueue_from_django_through_pgbouncer_needs_no_startup_parameter_ignored(
    default_pgbouncer, django_alias, settings
):
    alias = django_alias(default_pgbouncer)
    settings.JOBQ = {**settings.JOBQ, "DATABASE": alias}
    with connections[alias].cursor() as cursor:
        servers = set()
        for _ in range(4):
            cursor.execute("SELECT pg_backend_pid()")  # one transaction each (autocommit)
            servers.add(cursor.fetchone()[0])
    assert len(servers) > 1  # the transactions took turns on the server connections
    for n in range(MORE_THAN_PREPARE_THRESHOLD):
        with transaction.atomic(using=alias):
            record.enqueue(f"through {n}")
    with transaction.atomic(using=alias):
        record.enqueue("rolled back")
        transaction.set_rollback(True, using=alias)
    enqueue_many([record.prepare(label=f"many {n}") for n in range(3)])

    expected = {f"through {n}" for n in range(MORE_THAN_PREPARE_THRESHOLD)}
    expected |= {f"many {n}" for n in range(3)}
    assert {job.payload["label"] for job in Job.objects.all()} == expected  # read directly


def test_a_prepare_threshold_breaks_enqueue_through_pgbouncer_before_1_21(
    default_pgbouncer, django_alias, settings
):
    alias = django_alias(default_pgbouncer, prepare_threshold=1)
    settings.JOBQ = {**settings.JOBQ, "DATABASE": alias}
    with pytest.raises(
        ProgrammingError, match=r'prepared statement "_pg3_\d+" (does not|already) exist'
    ):
        for n in range(MORE_THAN_PREPARE_THRESHOLD):
            with transaction.atomic(using=alias):
                record.enqueue(f"prepared {n}")


def transactions_through(bouncer: PgBouncer, database: str) -> int:
    """Transactions PgBouncer has carried to ``database`` so far."""
    (row,) = [row for row in bouncer.show("STATS") if row["database"] == database]
    return int(row["total_xact_count"])


def burst_worker_through(
    bouncer: PgBouncer, manage: Callable[..., subprocess.Popen[str]], database: str
) -> tuple[subprocess.Popen[str], str]:
    """Run a ``--no-listen --burst`` worker of queue "pgbouncer" (4 threads) through
    ``bouncer`` until it exits; return it and its standard error."""
    worker = manage(
        "jobq_worker",
        "--no-listen",
        "--burst",
        "--queue",
        "pgbouncer",
        "--concurrency",
        "4",
        "--no-scheduler",
        DATABASE_URL=bouncer.url(database),
    )
    _, stderr = worker.communicate(timeout=TIMEOUT)
    return worker, stderr


def test_a_no_listen_worker_through_pgbouncer_runs_retries_and_dead_letters(pgbouncer, manage):
    jobs = (
        [pgbouncer_attempts.prepare(label=f"ok {n}", failures=0) for n in range(20)]
        + [pgbouncer_attempts.prepare(label=f"retried {n}", failures=1) for n in range(10)]
        + [pgbouncer_attempts.prepare(label=f"dead {n}", failures=3) for n in range(5)]
    )
    dead_ids = {job.pk for job in enqueue_many(jobs)[30:]}
    database = connections["default"].settings_dict["NAME"]
    before = transactions_through(pgbouncer, database)

    worker, stderr = burst_worker_through(pgbouncer, manage, database)

    assert worker.returncode == 0, stderr
    assert "30 succeeded, 20 retried, 5 dead-lettered" in stderr
    assert not Job.objects.exists(), stderr
    assert set(Effect.objects.values_list("label", flat=True)) == {
        *(f"ok {n} attempt 1" for n in range(20)),
        *(f"retried {n} attempt 2" for n in range(10)),
    }
    dead = DeadLetter.objects.all()
    assert {d.job_id for d in dead} == dead_ids
    assert {(d.reason, d.attempts) for d in dead} == {("max attempts exceeded", 3)}
    assert all(d.last_error.endswith("fails attempt 3") for d in dead)
    # Claims, acks, retries, dead letters, handlers' writes: all through PgBouncer.
    assert transactions_through(pgbouncer, database) - before > len(jobs)


def test_a_worker_through_pgbouncer_claims_limited_jobs_within_their_limits(pgbouncer, manage):
    """Limited claims send BEGIN with their first statements and COMMIT with their last in
    one pipeline each (django_jobq.pipelined_transaction): through PgBouncer in transaction
    mode, a worker claims a limited queue's jobs, logs their starts, and runs them all."""
    Queue.objects.create(name="pgbouncer", concurrency_limit=2, rate_limit="1000/s")
    enqueue_many([pgbouncer_attempts.prepare(label=f"ok {n}", failures=0) for n in range(20)])
    database = connections["default"].settings_dict["NAME"]
    worker, stderr = burst_worker_through(pgbouncer, manage, database)
    assert worker.returncode == 0, stderr
    assert "20 succeeded" in stderr
    assert not Job.objects.exists(), stderr
    assert Effect.objects.count() == 20
    assert not DeadLetter.objects.exists()


class Lines:
    """The lines a subprocess writes to ``stream``, read on a thread of their own, so a
    test can wait for one with a deadline (:meth:`wait_for`)."""

    def __init__(self, stream: IO[str]) -> None:
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self._queue.put(line)
        self._queue.put(None)

    def wait_for(self, pattern: str, timeout: float = TIMEOUT) -> str:
        """The first line (read so far or later) that matches ``pattern`` (a regular
        expression); AssertionError if the stream ends or ``timeout`` seconds pass first."""
        deadline = time.monotonic() + timeout
        for line in self.lines:
            if re.search(pattern, line):
                return line
        while (time_left := deadline - time.monotonic()) > 0:
            try:
                read = self._queue.get(timeout=time_left)
            except queue.Empty:
                break
            if read is None:
                raise AssertionError(f"output ended without {pattern!r}:\n{''.join(self.lines)}")
            self.lines.append(read)
            if re.search(pattern, read):
                return read
        raise AssertionError(f"no {pattern!r} within {timeout:g} s:\n{''.join(self.lines)}")


def stop(worker: subprocess.Popen[str]) -> int:
    """SIGTERM ``worker`` and return its exit status."""
    worker.send_signal(signal.SIGTERM)
    return worker.wait(timeout=TIMEOUT)


def test_without_ignore_startup_parameters_the_worker_says_what_to_do(default_pgbouncer, manage):
    database = connections["default"].settings_dict["NAME"]
    worker = manage(
        "jobq_worker", "--no-listen", "--no-scheduler", DATABASE_URL=default_pgbouncer.url(database)
    )
    assert worker.stderr is not None
    stderr = Lines(worker.stderr)
    line = stderr.wait_for("database error, reconnecting")
    assert "unsupported startup parameter: options" in line  # PgBouncer's own words
    assert "add 'options' to its ignore_startup_parameters" in line
    worker.kill()  # it would reconnect until its shutdown timeout
    worker.wait(timeout=TIMEOUT)


def test_with_ignore_startup_parameters_the_workers_timeouts_are_dropped(
    pgbouncer, django_alias, settings
):
    with connections["default"].cursor() as cursor:  # Django sends no options
        cursor.execute("SHOW statement_timeout")
        (servers_own,) = cursor.fetchone()
    with db.connect() as direct:
        sent = direct.execute("SHOW statement_timeout").fetchone()
    assert sent != (servers_own,)  # the worker's own, sent as options
    settings.JOBQ = {**settings.JOBQ, "DATABASE": django_alias(pgbouncer)}
    with db.connect() as through:
        assert through.execute("SHOW statement_timeout").fetchone() == (servers_own,)


def test_a_listening_worker_through_pgbouncer_says_it_cannot_hear_and_polls(pgbouncer, manage):
    database = connections["default"].settings_dict["NAME"]
    worker = manage(
        "jobq_worker",
        "--queue",
        "pgbouncer",
        "--poll-interval",
        "0.2",
        "--no-scheduler",
        DATABASE_URL=pgbouncer.url(database),
    )
    assert worker.stderr is not None
    stderr = Lines(worker.stderr)
    line = stderr.wait_for(
        "receives no notifications", timeout=listener_module.CHECK_TIMEOUT + TIMEOUT
    )
    assert "ERROR" in line
    assert "--no-listen" in line and "JOBQ['LISTEN_DATABASE']" in line
    pgbouncer_attempts.enqueue(label="polled", failures=0)
    wait_until(
        lambda: Effect.objects.filter(label="polled attempt 1").exists(),
        timeout=TIMEOUT,
        what="the polling worker to run the job",
    )
    assert stop(worker) == 0


def test_a_worker_whose_listener_cannot_hear_prepares_nothing_and_polls(
    pgbouncer, django_alias, settings
):
    alias = django_alias(pgbouncer)
    settings.JOBQ = {**settings.JOBQ, "DATABASE": alias}
    running = Running(worker_id="unheard", queues=["pgbouncer"], poll_interval=0.2)
    listener = running.worker._listener
    assert listener is not None
    running.thread.start()  # not ``with``: that waits for a listening connection
    try:
        wait_until(
            listener.cannot_hear.is_set,
            timeout=listener_module.CHECK_TIMEOUT + TIMEOUT,
            what="the listener's check to fail",
        )
        assert not listener.keeps_session_state.is_set()
        assert not running.worker._prepares_statements()
        with transaction.atomic(using=alias):
            for n in range(8):  # more runs of each statement than psycopg's threshold
                pgbouncer_attempts.enqueue(label=f"polled {n}", failures=0)
        wait_until(
            lambda: Effect.objects.filter(label__startswith="polled").count() == 8,
            timeout=TIMEOUT,
            what="the polling worker to run the jobs",
        )
    finally:
        running.__exit__(None, None, None)
    assert running.stats is not None and running.stats.outcome_counts.succeeded == 8


def test_a_direct_listener_hears_enqueues_made_through_pgbouncer(pgbouncer, django_alias, settings):
    alias = django_alias(pgbouncer)
    settings.JOBQ = {**settings.JOBQ, "DATABASE": alias, "LISTEN_DATABASE": "default"}
    wakes: list[int] = []
    wakeup = Wakeup()
    listener = Listener(
        queues=["pgbouncer"], wake=lambda queues: wakes.append(1), wakeup=wakeup, worker_id="direct"
    )
    with served(listener, wakeup):
        wait_until(lambda: wakes == [1], what="the listener's first connection")
        assert listener.listening.is_set() and not listener.cannot_hear.is_set()
        with transaction.atomic(using=alias):
            pgbouncer_attempts.enqueue(label="announced", failures=0)
        wait_until(lambda: len(wakes) == 2, what="the notification sent through PgBouncer")


def sleeping(worker: Worker) -> threading.Event:
    """An event set while ``worker``'s main loop waits for a wake-up (or its timeout).

    tests/test_wake.py reads that from the main connection's last statement in
    ``pg_stat_activity``; through PgBouncer each statement may run on another server
    connection, so several can show the idle-time query: here the loop's own wait says it.
    """
    asleep = threading.Event()
    wait = worker._wait_for_wake

    def recorded(timeout: float) -> bool:
        asleep.set()
        try:
            return wait(timeout)
        finally:
            asleep.clear()

    worker._wait_for_wake = recorded  # type: ignore[method-assign]
    return asleep


@pytest.mark.usefixtures("sleeping_an_hour")
def test_a_worker_through_pgbouncer_with_a_direct_listener_is_woken_by_enqueue(
    pgbouncer, django_alias, settings
):
    alias = django_alias(pgbouncer)
    settings.JOBQ = {**settings.JOBQ, "DATABASE": alias, "LISTEN_DATABASE": "default"}
    running = Running(worker_id="pooled", queues=["pgbouncer"])
    asleep = sleeping(running.worker)
    with running:
        assert running.worker._listener is not None
        assert not running.worker._listener.cannot_hear.is_set()
        # The direct listener proves nothing of the pooled alias: nothing is prepared there,
        # and no claim leaves a note in the session for its tasks' start.
        assert running.worker._listener.keeps_session_state.is_set()
        assert not running.worker._prepares_statements()
        assert not running.worker._keeps_session_state()
        wait_until(asleep.is_set, what="the worker to wait for work")
        with transaction.atomic(using=alias):
            pgbouncer_attempts.enqueue(label="woken", failures=0)
        wait_until(
            lambda: Effect.objects.filter(label="woken attempt 1").exists(),
            timeout=WAKE_BOUND,
            what="the job to run (only a wake-up runs it this soon)",
        )


def test_a_worker_subprocess_with_a_direct_listener_listens_directly(pgbouncer, manage):
    database = connections["default"].settings_dict["NAME"]
    worker = manage(
        "jobq_worker",
        "--queue",
        "pgbouncer",
        "--worker-id",
        "pooled-main",
        "--no-scheduler",
        DATABASE_URL=pgbouncer.url(database),
        JOBQ_TEST_LISTEN_DATABASE_URL=database_url(),
    )
    pid = wait_until(lambda: listener_pid("pooled-main"), timeout=TIMEOUT)
    assert pid not in {server["remote_pid"] for server in pgbouncer.show("SERVERS")}
    assert stop(worker) == 0
    _, stderr = worker.communicate()
    assert "receives no notifications" not in stderr


def test_prepared_statements_fail_through_this_pgbouncer(pgbouncer):
    """The setup's own control: a client that prepares breaks here, so the tests above would
    have caught a worker or an enqueue that prepared."""
    database = connections["default"].settings_dict["NAME"]
    client = psycopg.connect(pgbouncer.url(database), autocommit=True, prepare_threshold=0)
    with client, pytest.raises(psycopg.errors.Error, match="prepared statement"):
        for n in range(MORE_THAN_PREPARE_THRESHOLD):
            client.execute("SELECT %s::int", [n])
