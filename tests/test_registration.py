"""The worker registry (a row per running worker, deregistered on exit) and the workers'
structured log lines."""

import logging
import os
import socket
import threading

import pytest

from django_jobq import registry
from django_jobq.models import WorkerProcess
from django_jobq.worker import Worker
from django_jobq.worker.registration import Registration
from tests.conftest import wait_until
from tests.testapp.jobs import always_fails, record

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_running_worker_is_registered_and_deregisters_when_it_stops():
    worker = Worker(queues=["registry-a", "registry-b"], concurrency=3, poll_interval=0.05)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        row = wait_until(
            lambda: WorkerProcess.objects.filter(worker_id=worker.worker_id).first(),
            what="the worker's registration",
        )
        assert (row.host, row.pid, row.queues, row.concurrency) == (
            socket.gethostname(),
            os.getpid(),
            ["registry-a", "registry-b"],
            3,
        )
        assert row.started_at <= row.last_seen
        # It claims what its registry has: every @job handler and task of this process.
        assert row.kinds == registry.claimable_kinds() == sorted(row.kinds)
        assert record.kind in row.kinds and "tests.testapp.tasks.add" in row.kinds
        assert row.kinds_fingerprint == registry.kinds_fingerprint(row.kinds)
        assert len(row.kinds_fingerprint) == 16
    finally:
        worker.stop()
        thread.join(30)
    assert not WorkerProcess.objects.exists()


def test_a_worker_of_every_queue_registers_without_a_queue_list(queue_cursor):
    Registration(worker_id="all", queues=None, concurrency=1, kinds=[]).register(queue_cursor)
    assert WorkerProcess.objects.get().queues is None


def test_a_beat_registers_again_a_row_the_maintenance_pruned(queue_cursor):
    registration = Registration(worker_id="w", queues=["q"], concurrency=1, kinds=["b", "a"])
    first = registration.register(queue_cursor)
    registration.beat(queue_cursor)
    assert list(WorkerProcess.objects.values_list("pk", flat=True)) == [first]
    WorkerProcess.objects.all().delete()  # pruned while the worker was stalled
    registration.beat(queue_cursor)
    (row,) = WorkerProcess.objects.all()
    assert row.pk != first and row.worker_id == "w"
    assert row.kinds == ["a", "b"]
    registration.deregister(queue_cursor)
    assert not WorkerProcess.objects.exists()


def test_job_log_lines_carry_structured_fields(caplog):
    caplog.set_level(logging.DEBUG, logger="django_jobq.worker")
    record.using(queue="logs").enqueue("ok")
    always_fails.using(queue="logs", max_attempts=1).enqueue(reason="bad data")
    Worker(queues=["logs"], burst=True, poll_interval=0.05).run()
    lines = {r.outcome: r for r in caplog.records if getattr(r, "job_id", None) is not None}
    assert set(lines) == {"succeeded", "dead_lettered"}
    ok = lines["succeeded"]
    assert (ok.kind, ok.queue, ok.attempt, ok.max_attempts, ok.error, ok.reason) == (
        "tests.testapp.jobs.record",
        "logs",
        1,
        5,
        None,
        None,
    )
    assert ok.duration > 0 and ok.retry_delay is None
    assert ok.getMessage().startswith(f"job {ok.job_id} tests.testapp.jobs.record attempt 1/5")
    dead = lines["dead_lettered"]
    assert (dead.reason, dead.error) == ("max attempts exceeded", "RuntimeError: bad data")


def test_the_fingerprint_names_the_set_of_kinds_not_their_order():
    assert registry.kinds_fingerprint(["a", "b"]) == registry.kinds_fingerprint(["b", "a"])
    assert registry.kinds_fingerprint(["a", "b"]) != registry.kinds_fingerprint(["a", "c"])
    assert registry.kinds_fingerprint(["a", "b"]) != registry.kinds_fingerprint(["a\nb"])


def test_the_start_line_says_how_many_kinds_the_worker_serves_and_debug_lists_them(caplog):
    caplog.set_level(logging.DEBUG, logger="django_jobq.worker")
    worker = Worker(queues=["registry-start"], burst=True, poll_interval=0.05)
    worker.run()
    kinds = registry.claimable_kinds()
    fingerprint = registry.kinds_fingerprint(kinds)
    messages = [record.getMessage() for record in caplog.records]
    (start,) = [m for m in messages if " starting: " in m]
    assert start.endswith(f" kinds={len(kinds)} ({fingerprint})")
    assert f"worker {worker.worker_id} claims kinds: {', '.join(kinds)}" in messages
    levels = {r.getMessage(): r.levelno for r in caplog.records}
    assert levels[start] == logging.INFO
    assert levels[f"worker {worker.worker_id} claims kinds: {', '.join(kinds)}"] == logging.DEBUG
