"""The handler threads' pool (``django_jobq.worker.executor.ExecutorPool``), as a specification.

- The main loop submits each claimed job to the pool; one of its threads takes it.
- ``let_start()``, called by the main loop after a claim's jobs are submitted, waits until an
  idle thread has taken a job, so that the woken thread does not wait for the GIL while the
  loop builds its next statement; it does not wait when no thread is idle (a busy pool
  takes the job when a thread frees, and the loop must not stall a claim for it), nor when
  no job waits (a claim of async or refused jobs only).
"""

import threading

import pytest

from django_jobq import claims, job, registry
from django_jobq.outcomes import Outcome
from django_jobq.worker import executor
from django_jobq.worker.executor import ExecutorPool
from django_jobq.worker.held import HeldJob
from tests.conftest import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

KIND = "pool_tests.wait"


@pytest.fixture
def pool_and_jobs(queue_cursor):
    """A started pool of one thread, and a function that enqueues and claims a job whose
    handler waits until ``release`` is set; the test's outcomes land in ``outcomes``."""
    release = threading.Event()
    outcomes: list[Outcome] = []

    def wait() -> None:
        assert release.wait(60), "the test never released the handler"

    with registry.isolated():
        definition = job(name=KIND)(wait)
        pool = ExecutorPool(1, report=outcomes.append, extend=lambda held: True, name="pool")
        pool.start()

        def claimed() -> HeldJob:
            definition.enqueue()
            (claimed_job,) = claims.claim(queue_cursor, worker_id="pool", limit=1, kinds=[KIND])
            return HeldJob(claimed_job)

        try:
            yield pool, claimed, release, outcomes
        finally:
            release.set()
            pool.stop(timeout=30)


def test_let_start_returns_once_an_idle_thread_has_taken_the_job(pool_and_jobs):
    pool, claimed, release, outcomes = pool_and_jobs
    wait_until(lambda: pool._idle == 1, what="the thread waiting for a job")
    held = claimed()

    pool.submit(held)
    pool.let_start()

    # Without the wait, this thread kept the GIL and the job would still be queued.
    assert pool.take_unstarted() == []
    release.set()
    wait_until(lambda: outcomes, what="the job's outcome")
    assert outcomes[0].job.lease == held.job.lease


def returns(action):
    """Whether ``action()`` returns within 30 s (run on a thread of its own)."""
    thread = threading.Thread(target=action, daemon=True)
    thread.start()
    thread.join(30)
    return not thread.is_alive()


def test_let_start_does_not_wait_when_no_job_was_submitted(pool_and_jobs, monkeypatch):
    pool, *_ = pool_and_jobs
    monkeypatch.setattr(executor, "LET_START_TIMEOUT", 600.0)
    wait_until(lambda: pool._idle == 1, what="the thread waiting for a job")

    assert returns(pool.let_start), "let_start waited with no job to take"


def test_let_start_does_not_wait_when_every_thread_is_busy(pool_and_jobs, monkeypatch):
    pool, claimed, _, _ = pool_and_jobs
    monkeypatch.setattr(executor, "LET_START_TIMEOUT", 600.0)
    wait_until(lambda: pool._idle == 1, what="the thread waiting for a job")
    pool.submit(claimed())
    wait_until(lambda: pool._idle == 0, what="the thread taking the first job")
    queued = claimed()

    pool.submit(queued)

    assert returns(pool.let_start), "let_start waited for a busy pool"
    assert pool.take_unstarted() == [queued]
