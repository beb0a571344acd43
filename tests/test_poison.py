"""Rows no ``enqueue`` wrote are quarantined, never crashed on (issue 15).

Each poison row is inserted by SQL next to a healthy job, as a row older than the CHECK
constraints of migration 0008 (see tests/poison.py). The claim leases it without failing,
the worker dead-letters it unrun with a reason naming the problem, the healthy job runs and
the worker goes on; every statement that reads the jobs table survives it.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from django_jobq import leases, sql, stats
from django_jobq.models import DeadLetter, Job
from django_jobq.worker import Worker
from tests.conftest import wait_until
from tests.poison import CLAIMED_POISON, LAPSED_AT_MINUS_INFINITY, UNCLAIMED_POISON, insert_row
from tests.testapp.jobs import record
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)


def labels() -> list[str]:
    return sorted(Effect.objects.values_list("label", flat=True))


class RunningWorker:
    """An in-process worker on a thread (full turns: claim, observer tick, idle timeout);
    :meth:`stop` joins it and re-raises whatever ended its loop."""

    def __init__(self, **options: Any) -> None:
        self.worker = Worker(poll_interval=0.2, batch_size=10, **options)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.worker.run()
        except BaseException as exc:
            self.error = exc

    def stop(self) -> None:
        self.worker.stop()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive()
        if self.error is not None:
            raise self.error


@pytest.mark.parametrize("case", list(CLAIMED_POISON))
def test_the_claim_leases_a_poison_row_and_names_its_problem(case, queue_cursor):
    columns, reason = CLAIMED_POISON[case]
    poison_id = insert_row(columns)
    healthy = record.enqueue("healthy")
    claimed = {job.id: job for job in leases.claim(queue_cursor, worker_id="w", limit=10)}
    assert set(claimed) == {poison_id, healthy.pk}
    assert (claimed[healthy.pk].poison, claimed[healthy.pk].payload) == ("", {"label": "healthy"})
    poisoned = claimed[poison_id]
    if reason.startswith("poison row: "):
        assert reason.removeprefix("poison row: ") in poisoned.poison
        assert poisoned.payload == {}
    else:
        assert poisoned.attempts_exhausted and not poisoned.reclaimed
    assert poisoned.visibility_timeout.total_seconds() <= 10 * 365 * 86400


@pytest.mark.parametrize("case", list(CLAIMED_POISON))
def test_a_poison_row_becomes_one_dead_letter_and_the_healthy_job_next_to_it_runs(case):
    columns, reason = CLAIMED_POISON[case]
    poison_id = insert_row(columns)
    record.enqueue("healthy")
    running = RunningWorker()
    wait_until(lambda: labels() == ["healthy"] and DeadLetter.objects.exists(), what="outcomes")
    record.enqueue("after")  # the loop goes on: claims, ticks and idles with the row gone
    wait_until(lambda: labels() == ["after", "healthy"], what="the next job")
    running.stop()
    # (not DeadLetter.objects.get(): the row keeps the poison values, see test_admin_poison)
    ((job_id, dead_reason),) = DeadLetter.objects.values_list("job_id", "reason")
    assert job_id == poison_id
    assert reason in dead_reason, dead_reason
    assert not Job.objects.exists()


@pytest.mark.parametrize("case", list(UNCLAIMED_POISON))
def test_a_worker_turns_with_an_unclaimable_poison_row_in_the_table(case):
    poison_id = insert_row(UNCLAIMED_POISON[case])
    record.enqueue("healthy")
    running = RunningWorker()
    wait_until(lambda: labels() == ["healthy"], what="the healthy job")
    record.enqueue("after")
    wait_until(lambda: labels() == ["after", "healthy"], what="the next job")
    running.stop()
    assert list(Job.objects.values_list("id", flat=True)) == [poison_id]
    assert not DeadLetter.objects.exists()


def test_a_lease_lapsed_at_minus_infinity_is_reclaimed_and_run():
    insert_row(LAPSED_AT_MINUS_INFINITY, label="lapsed")
    record.enqueue("healthy")
    running = RunningWorker()
    wait_until(lambda: labels() == ["healthy", "lapsed"], what="both jobs")
    running.stop()
    assert not Job.objects.exists() and not DeadLetter.objects.exists()


ALL_POISON = {
    **{case: columns for case, (columns, _) in CLAIMED_POISON.items()},
    **UNCLAIMED_POISON,
    "lease lapsed at -infinity": LAPSED_AT_MINUS_INFINITY,
}


@pytest.mark.parametrize("case", list(ALL_POISON))
def test_queue_states_samples_and_the_idle_wake_up_survive_each_poison_row(case, queue_cursor):
    insert_row(ALL_POISON[case])
    record.enqueue("healthy")
    (state,) = stats.queue_states()
    assert (state.queue, state.ready) == ("default", 1 + (case not in UNCLAIMED_POISON))
    assert 0 <= state.oldest_ready_age < 60
    worker = Worker(poll_interval=0.5)
    assert 0 <= worker._idle_timeout(queue_cursor) <= 0.5
    queue_cursor.execute(sql.SAMPLE_QUEUES)
    assert queue_cursor.fetchall() == [("default",)]
