"""Wake-up: enqueue notifies at commit, the worker's listener wakes it, and the worker
survives losing its listener or its main connection."""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction

from django_jobq import claim_positions, enqueue_many, sql
from django_jobq.models import Job, Queue
from django_jobq.operations import redrive, run_now
from django_jobq.worker import Worker, WorkerStats, observer
from django_jobq.worker import listener as listener_module
from django_jobq.worker.listener import Listener
from django_jobq.worker.wakeup import Wakeup, readable
from tests.conftest import wait_until
from tests.factories import DeadLetterFactory
from tests.testapp.jobs import flow_step, poison, record, wait_for_lock
from tests.testapp.models import Effect, Run

pytestmark = pytest.mark.django_db(transaction=True)

#: Longer than any test: a job picked up before it passes was picked up by a wake-up.
NEVER = 3600.0


@pytest.fixture
def listening(connect):
    """A connection LISTENing on the wake channel; call it to drain its notifications."""
    conn = connect()
    conn.execute(sql.wake.LISTEN_WAKE)

    def received():
        conn.execute(sql.wake.PING)  # a round trip delivers what has arrived
        return [(n.channel, n.payload) for n in conn.notifies(timeout=0)]

    return received


def terminate(application_name):
    """``pg_terminate_backend`` the connections named ``application_name``; return how many."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = %s AND datname = current_database()",
            [application_name],
        )
        return cursor.fetchone()[0]


def test_enqueue_notifies_each_queue_once_at_commit_and_not_before(listening):
    with transaction.atomic():
        for n in range(3):
            record.enqueue(f"a{n}")
        record.using(queue="reports").enqueue("b")
        assert listening() == []
    assert sorted(listening()) == [("jobq", "default"), ("jobq", "reports")]


def test_a_rolled_back_enqueue_notifies_nobody(listening):
    with transaction.atomic():
        record.enqueue("never")
        transaction.set_rollback(True)
    assert listening() == []


def test_a_bulk_insert_sends_one_notification_per_queue_not_per_row(listening):
    enqueue_many(
        [record.prepare(label=f"n{i}") for i in range(2000)]
        + [record.using(queue="reports").prepare(label=f"r{i}") for i in range(2000)]
    )
    assert sorted(listening()) == [("jobq", "default"), ("jobq", "reports")]


def test_an_idempotent_enqueue_that_finds_its_job_notifies_nobody(listening):
    record.using(idempotency_key="k").enqueue("first")
    listening()
    record.using(idempotency_key="k").enqueue("again")
    assert listening() == []


class Running:
    """A worker running on a thread of its own, stopped (and joined) on exit; ``stats`` is
    what its :meth:`~django_jobq.worker.Worker.run` returned."""

    def __init__(self, **options: Any) -> None:
        options.setdefault("poll_interval", NEVER)
        options.setdefault("scheduler", False)
        self.worker = Worker(**options)
        self.thread = threading.Thread(target=self.run)
        self.stats: WorkerStats | None = None

    def run(self) -> None:
        try:
            self.stats = self.worker.run()
        finally:
            connection.close()

    def __enter__(self) -> Running:
        self.thread.start()
        wait_until(lambda: listener_pid(self.worker.worker_id), what="the listener to connect")
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.worker.stop()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive()


def listener_pid(worker_id: str) -> int | None:
    """The server pid of the worker's listener connection (``jobq listener <id>``, see
    docs/guarantees.md) once it is listening, else ``None``."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s "
            "AND datname = current_database() AND state = 'idle' AND query = %s",
            [f"jobq listener {worker_id}", sql.wake.LISTEN_WAKE],
        )
        row = cursor.fetchone()
    return None if row is None else int(row[0])


def wait_until_idle(worker_id: str) -> None:
    """Wait until the worker's last statement is the idle-time query it runs just before it
    goes to sleep (up to its poll interval): a job enqueued now is picked up by a wake-up."""

    def idle() -> bool:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                "AND state = 'idle' AND query LIKE %s",
                [f"jobq worker {worker_id}", "%WITH RECURSIVE priorities%"],
            )
            (count,) = cursor.fetchone()
        return bool(count == 1)

    wait_until(idle, what=f"worker {worker_id} to go idle")


#: Seconds within which a job enqueued for a sleeping worker must run: a small fraction of
#: the hour it sleeps without a wake-up (:func:`sleeping_an_hour`), yet ample on a loaded host.
WAKE_BOUND = 10.0


@pytest.fixture
def sleeping_an_hour(monkeypatch: pytest.MonkeyPatch) -> None:
    """Push every wake of an idle worker's own out to :data:`NEVER`, so that only the
    listener's wake-up can make it claim within :data:`WAKE_BOUND`: besides its poll
    interval (``Running`` sets it), the claim positions' probe (due every 1 to 30 s once a
    claim has set a position), the registration beat (10 s) and the queue sample (20 s)."""
    monkeypatch.setattr(claim_positions, "MIN_PROBE_INTERVAL", NEVER)
    monkeypatch.setattr(claim_positions, "MAX_PROBE_INTERVAL", NEVER)
    monkeypatch.setattr(observer, "BEAT_INTERVAL", NEVER)
    monkeypatch.setattr(observer, "SAMPLE_INTERVAL", NEVER)


def run_by_a_wake_up(worker_id: str, label: str) -> None:
    """Once the worker ``worker_id`` (sleeping an hour between polls) is idle, enqueue a job
    ``label`` and wait until it has run: within :data:`WAKE_BOUND`, which only a wake-up
    makes."""
    wait_until_idle(worker_id)
    record.enqueue(label)
    wait_until_run_by_a_wake_up(label)


def wait_until_run_by_a_wake_up(label: str) -> None:
    """Wait until the job ``label`` (of ``record``) has run: within :data:`WAKE_BOUND`,
    which only a wake-up makes of a worker sleeping an hour between polls."""
    wait_until(
        lambda: Effect.objects.filter(label=label).exists(),
        timeout=WAKE_BOUND,
        what=f"the job {label!r} to run (only a wake-up runs it this soon)",
    )


def test_an_idle_worker_is_woken_by_enqueue_long_before_its_poll_interval(sleeping_an_hour):
    with Running(worker_id="woken"):
        run_by_a_wake_up("woken", "woken")


@contextmanager
def served(listener: Listener, wakeup: Wakeup) -> Iterator[None]:
    """Start ``listener`` (made with ``wakeup``), with a thread that waits on it as the
    worker's main loop does between turns (``Listener.wait``); stop both at the end."""
    done = threading.Event()

    def wait_like_the_loop() -> None:
        while not done.is_set():
            wakeup.clear()
            listener.wait(None)

    waiter = threading.Thread(target=wait_like_the_loop)
    listener.start()
    waiter.start()
    try:
        yield
    finally:
        done.set()
        wakeup.set()
        waiter.join(timeout=5)
        listener.stop()


def test_the_main_loop_reads_the_notification_itself(sleeping_an_hour):
    """The worker's main loop waits on the listener's socket and reads a notification
    itself: the job's pickup waits for no other thread to be scheduled to pass it on (the
    listener's thread only opens the connection)."""
    running = Running(worker_id="reader")
    announced_on: list[threading.Thread] = []
    announce = running.worker._announce

    def recorded(queues: Any = None) -> None:
        if queues is not None:  # a notification (None: a connection was made ready)
            announced_on.append(threading.current_thread())
        announce(queues)

    running.worker._announce = recorded  # type: ignore[method-assign]
    running.worker._listener._wake = recorded  # type: ignore[union-attr]
    with running:
        run_by_a_wake_up("reader", "announced")
    assert announced_on == [running.thread]


def test_a_worker_ignores_notifications_for_queues_it_does_not_serve():
    wakes = []
    wakeup = Wakeup()
    listener = Listener(
        queues=["mine"], wake=lambda queues: wakes.append(1), wakeup=wakeup, worker_id="picky"
    )
    with served(listener, wakeup):
        wait_until(lambda: wakes, what="the wake-up of the first connection")
        record.using(queue="theirs").enqueue("not for me")
        record.using(queue="mine").enqueue("for me")
        wait_until(lambda: len(wakes) == 2, what="the wake-up for queue mine")
        record.using(queue="theirs").enqueue("not for me either")
        record.using(queue="mine").enqueue("for me too")
        wait_until(lambda: len(wakes) == 3, what="the second wake-up for queue mine")
    assert len(wakes) == 3  # the "theirs" jobs woke nobody


@pytest.fixture
def no_drain(monkeypatch: pytest.MonkeyPatch) -> None:
    """The listener's thread never reads the socket itself (as it does while nobody is in
    ``wait``): what a test's ``wait`` or ``read_waiting`` reads, only it read."""
    monkeypatch.setattr(listener_module, "DRAIN_INTERVAL", NEVER)


@contextmanager
def handed_over(worker_id: str) -> Iterator[tuple[Listener, list[frozenset[str] | None]]]:
    """A started listener serving queue "mine" whose connection has been handed over (its
    first ``wake(None)`` came), and the list of its ``wake()`` calls; stopped at the end.
    Nobody waits on it unless the test does."""
    wakes: list[frozenset[str] | None] = []
    listener = Listener(queues=["mine"], wake=wakes.append, wakeup=Wakeup(), worker_id=worker_id)
    listener.start()
    try:
        wait_until(lambda: wakes == [None], what="the connection to be handed over")
        yield listener, wakes
    finally:
        listener.stop()


@pytest.mark.usefixtures("no_drain")
def test_a_notification_of_a_queue_not_served_does_not_end_the_wait():
    """The loop's wait between turns reads a notification of another queue and goes on
    waiting: enqueues into queues a worker does not serve cost it no turn (no claim)."""
    with handed_over("picky") as (listener, wakes):
        listener._wakeup.clear()  # set by the hand-over
        record.using(queue="theirs").enqueue("not for me")
        assert listener.wait(0.5) is False  # its timeout passed: nothing of "mine" came
        record.using(queue="mine").enqueue("for me")
        assert listener.wait(None) is True
        assert wakes == [None, frozenset({"mine"})]


@pytest.mark.usefixtures("no_drain")
def test_a_turn_reads_a_notification_waiting_on_the_socket_without_waiting():
    """What ended the loop's last wait may have been an outcome; a notification that came
    meanwhile is read at the start of the next turn (``read_waiting``), so the turn knows
    of the job before it decides what comes first."""
    with handed_over("turn") as (listener, wakes):
        listener.read_waiting()  # nothing waits: returns at once
        record.using(queue="mine").enqueue("for me")
        connection = listener._ready
        assert connection is not None
        assert readable([connection.fileno()], 10), "the notification never arrived"
        listener.read_waiting()
        assert wakes == [None, frozenset({"mine"})]


def test_while_the_loop_is_busy_the_listener_thread_reads_the_notifications_itself():
    """Nobody is in ``wait`` (a long turn, or the loop reconnecting its own connection):
    the listener's thread reads what arrives within its drain interval and calls ``wake()``
    (which wakes the loop for the turn after), so unread notifications never fill the
    socket (the server's send would block, holding back VACUUM)."""
    with handed_over("busy") as (listener, wakes):
        record.using(queue="mine").enqueue("for me")
        wait_until(
            lambda: wakes == [None, frozenset({"mine"})],
            what="the listener's thread to read the notification",
        )
        assert listener._ready is not None  # read, not handed back


def test_a_listener_never_started_closes_its_pipes_once_collected():
    listener = Listener(queues=None, wake=print, wakeup=Wakeup(), worker_id="unused")
    pipes = [listener._stop_read, listener._stop_write, listener._back_read, listener._back_write]
    del listener
    gc.collect()
    for fd in pipes:
        with pytest.raises(OSError):
            os.fstat(fd)


def test_a_listener_whose_connection_is_killed_reconnects_and_wakes_the_worker():
    wakes = []
    wakeup = Wakeup()
    listener = Listener(
        queues=None, wake=lambda queues: wakes.append(1), wakeup=wakeup, worker_id="cut-off"
    )
    with served(listener, wakeup):
        wait_until(lambda: listener.listening.is_set() and wakes == [1])
        assert terminate("jobq listener cut-off") == 1
        # No job was enqueued: the second wake-up is the reconnection's own, so the worker
        # claims whatever was enqueued while nobody listened.
        wait_until(lambda: len(wakes) == 2, what="the reconnected listener's wake-up")
        assert listener.reconnects == 1
        record.enqueue("after")
        wait_until(lambda: len(wakes) == 3, what="a notification on the new connection")


def test_pickup_by_notification_resumes_after_the_listener_is_killed(sleeping_an_hour):
    with Running(worker_id="relisten"):
        cut = listener_pid("relisten")
        assert terminate("jobq listener relisten") == 1
        wait_until(
            lambda: listener_pid("relisten") not in (None, cut), what="the listener to reconnect"
        )
        run_by_a_wake_up("relisten", "after the cut")


def test_a_worker_whose_connection_is_killed_mid_job_reconnects_and_records_the_outcome(caplog):
    lock_id = 5151
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s)", [lock_id])  # the handler blocks on it
    blocked = wait_for_lock.enqueue(lock_id=lock_id, label="finished during the outage")
    running = Running(worker_id="cut-main", concurrency=2)
    with running:
        wait_until(lambda: Job.objects.filter(pk=blocked.pk, status="running").exists())
        assert terminate("jobq worker cut-main") == 1
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [lock_id])
        wait_until(lambda: not Job.objects.filter(pk=blocked.pk).exists(), what="the late ack")
        record.enqueue("after the outage")  # and it carries on claiming
        wait_until(lambda: Effect.objects.filter(label="after the outage").exists())
        assert "worker cut-main: database error, reconnecting" in caplog.text
    assert running.stats is not None
    assert running.stats.outcome_counts.succeeded == 2
    assert running.stats.outcome_counts.lease_lost == 0


def test_an_announced_job_is_claimed_without_waiting_for_outcomes_to_share_an_ack(monkeypatch):
    # Outcomes wait up to ACK_FLUSH_DELAY for others to share their ack statement; made an
    # hour here, only the announcement can end that wait before the test's deadline.
    from django_jobq.worker import worker as worker_module

    monkeypatch.setattr(worker_module, "ACK_FLUSH_DELAY", NEVER)
    with Running(worker_id="claims-first", concurrency=2):
        first = record.enqueue("first")
        wait_until(lambda: Effect.objects.filter(label="first").exists())
        record.enqueue("announced")
        wait_until(
            lambda: Effect.objects.filter(label="announced").exists(),
            timeout=WAKE_BOUND,
            what="the announced job to run while the first one's outcome waited",
        )
        # Claimed first, then the waiting outcome was recorded in the same turn.
        wait_until(lambda: not Job.objects.filter(pk=first.pk).exists(), what="the first ack")


def counted_claim_turns(running: Running) -> list[None]:
    """The turns of ``running``'s worker that went on to claim (one item each)."""
    turns: list[None] = []
    claim_turn = running.worker._claim_turn

    def counted(connection: psycopg.Connection[Any], cursor: psycopg.Cursor[Any]) -> float | None:
        turns.append(None)
        return claim_turn(connection, cursor)

    running.worker._claim_turn = counted  # type: ignore[method-assign]
    return turns


def test_the_acks_of_a_drained_queue_send_no_claim(sleeping_an_hour):
    """A worker whose last claim found its queues drained records its jobs' acks without
    claiming again: no job can have become ready that was not announced. One claim per
    job enqueued one at a time, not two (the second, after its ack, finding nothing)."""
    jobs = 10
    running = Running(worker_id="drained", concurrency=4)
    turns = counted_claim_turns(running)
    with running:
        wait_until_idle("drained")
        before = len(turns)
        for n in range(jobs):
            record.enqueue(f"drained {n}")
            wait_until(lambda: not Job.objects.exists(), what="its ack")
        claims = len(turns) - before
    assert Effect.objects.filter(label__startswith="drained").count() == jobs
    # One per announcement; a few more if a timer (the rollup flush) fell due meanwhile.
    assert jobs <= claims <= jobs + 3


def test_a_job_falling_due_while_acks_come_is_claimed_when_due(sleeping_an_hour):
    """The acks that claim nothing wait for the deadline the last claim's turn read (the
    next job falling due), not for the poll interval (an hour here)."""
    with Running(worker_id="due", concurrency=4):
        wait_until_idle("due")
        record.using(delay=timedelta(seconds=1)).enqueue("due later")
        record.enqueue("now")  # its ack comes before the other falls due
        wait_until(
            lambda: Effect.objects.filter(label="due later").exists(),
            timeout=WAKE_BOUND,
            what="the delayed job to run once due",
        )


def test_a_retry_makes_the_worker_claim_again(sleeping_an_hour):
    """A retried job is ready again at once (no backoff): recording a retry is not an ack,
    and the turn claims it, without a notification."""
    with Running(worker_id="retried", concurrency=4):
        wait_until_idle("retried")
        poison.enqueue("tried thrice")
        wait_until(
            lambda: Effect.objects.filter(label="tried thrice").count() == 3,
            timeout=WAKE_BOUND,
            what="all three attempts",
        )


def test_the_end_of_a_limited_job_makes_the_worker_claim_the_next(sleeping_an_hour):
    """A job held back by a concurrency limit becomes claimable when a running one ends:
    its ack is not one that can wait for a notification (none comes)."""
    Queue.objects.create(name="flow", concurrency_limit=1)
    for n in range(3):
        flow_step.enqueue(f"limited {n}")
    with Running(worker_id="limited", concurrency=4):
        wait_until(
            lambda: Run.objects.count() == 3,
            timeout=WAKE_BOUND,
            what="every job of the limited queue, one after the other",
        )


def test_a_redrive_wakes_an_idle_worker(sleeping_an_hour):
    dead = DeadLetterFactory(kind=record.kind, payload={"label": "redriven"})
    with Running(worker_id="redriven"):
        wait_until_idle("redriven")
        assert redrive([dead.pk]) == 1
        wait_until_run_by_a_wake_up("redriven")


def test_run_now_wakes_an_idle_worker(sleeping_an_hour):
    later = record.using(delay=timedelta(hours=1)).enqueue("run now")
    with Running(worker_id="run-now"):
        wait_until_idle("run-now")
        assert run_now([later.pk]) == 1
        wait_until_run_by_a_wake_up("run now")
