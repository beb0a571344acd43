"""The handler threads' pool (``django_jobq.worker.executor.ExecutorPool``), as a specification.

- The main loop submits each claimed job to the pool; one of its threads takes it.
- ``let_start()``, called by the main loop once a claim's jobs are submitted, waits until a
  thread has taken a job, so that the woken thread does not wait for the GIL while the loop
  builds its next statement. It waits only when exactly one job was submitted since its
  last call, while every thread was idle: not while a handler runs (a CPU-bound one would
  hold the GIL the loop needs to go on), not for a claim of several jobs (the threads they
  wake would contend with the loop for the GIL), nor for a claim of async or refused jobs
  only.
"""

import threading
import time

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
def pool_of(queue_cursor, monkeypatch):
    """``pool_of(size)``: a started pool of ``size`` threads, and a function that enqueues
    and claims a job whose handler, if ``blocks``, waits until ``release`` is set; the
    outcomes land in ``outcomes``. ``let_start`` waits up to 60 s here: a wait that should
    not happen is seen, not cut short."""
    monkeypatch.setattr(executor, "LET_START_TIMEOUT", 60.0)
    release = threading.Event()
    outcomes: list[Outcome] = []
    pools: list[ExecutorPool] = []

    def wait(blocks: bool) -> None:
        if blocks:
            assert release.wait(60), "the test never released the handler"

    with registry.isolated():
        definition = job(name=KIND)(wait)

        def claimed(*, blocks: bool = True) -> HeldJob:
            definition.enqueue(blocks=blocks)
            (claimed_job,) = claims.claim(queue_cursor, worker_id="pool", limit=1, kinds=[KIND])
            return HeldJob(claimed_job)

        def make(size: int) -> ExecutorPool:
            pool = ExecutorPool(size, report=outcomes.append, extend=lambda held: True, name="p")
            pool.start()
            pools.append(pool)
            wait_until(lambda: pool.idle_threads == size, what="the threads waiting for a job")
            return pool

        try:
            yield make, claimed, release, outcomes
        finally:
            release.set()
            for pool in pools:
                pool.stop(timeout=30)


def returns(action):
    """Whether ``action()`` returns within 30 s (run on a thread of its own)."""
    thread = threading.Thread(target=action, daemon=True)
    thread.start()
    thread.join(30)
    return not thread.is_alive()


def test_let_start_returns_once_an_idle_thread_has_taken_the_job(pool_of):
    make, claimed, _, _ = pool_of
    pool = make(1)
    held = claimed()

    pool.submit(held)
    started = time.monotonic()
    pool.let_start()

    # Without the wait this thread kept the GIL, and the woken one had taken nothing yet.
    assert pool.idle_threads == 0
    assert time.monotonic() - started < 30, "it waited for its timeout, not for the take"
    assert pool.take_unstarted() == []


def test_each_claim_waits_for_a_take_of_its_own(pool_of):
    make, claimed, _, outcomes = pool_of
    pool = make(1)
    pool.submit(claimed(blocks=False))
    pool.let_start()
    wait_until(lambda: outcomes and pool.idle_threads == 1, what="the first job done")

    pool.submit(claimed())
    pool.let_start()

    assert pool.idle_threads == 0  # the first job's take did not end this wait


def test_let_start_does_not_wait_when_no_job_was_submitted(pool_of):
    make, _, _, _ = pool_of
    pool = make(1)  # every thread idle, and no take to end a wait

    assert returns(pool.let_start), "let_start waited with no job submitted"


def test_let_start_does_not_wait_when_every_thread_is_busy(pool_of):
    make, claimed, _, _ = pool_of
    pool = make(1)
    pool.submit(claimed())
    pool.let_start()
    queued = claimed()

    pool.submit(queued)

    assert returns(pool.let_start), "let_start waited for a busy pool"
    assert pool.take_unstarted() == [queued]


def test_let_start_does_not_wait_while_a_handler_runs(pool_of):
    make, claimed, _, _ = pool_of
    pool = make(2)
    pool.submit(claimed())
    pool.let_start()
    assert pool.idle_threads == 1

    pool.submit(claimed())
    pool.let_start()

    # This thread kept the GIL: the idle thread, woken for the job, has not taken it yet.
    assert pool.idle_threads == 1


def test_let_start_does_not_wait_for_a_claim_of_several_jobs(pool_of):
    make, claimed, _, _ = pool_of
    pool = make(2)
    first, second = claimed(), claimed()

    pool.submit(first)
    pool.submit(second)
    pool.let_start()

    # This thread kept the GIL: neither woken thread has taken its job yet.
    assert pool.idle_threads == 2
