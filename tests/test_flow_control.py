"""Flow control, in process: paused queues, fleet-wide concurrency and rate limits, ordered
lanes (docs/flow-control.md). Worker threads against real PostgreSQL; the fleet of worker
processes, SIGKILLed and restarted, is in tests/acceptance/test_flow_control_fleet.py."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from itertools import pairwise
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction
from django.db.models import F
from django.test.utils import override_settings
from django.utils import timezone

from django_jobq import (
    claims,
    conf,
    enqueue,
    enqueue_many,
    flow_state,
    job,
    leases,
    limited_claims,
    registry,
    signals,
    sql,
)
from django_jobq.models import DeadLetter, Job, KindLimit, LimitStart, Queue
from django_jobq.operations import cancel, redrive
from django_jobq.worker import Worker, executor
from django_jobq.worker.held import HeldJob
from tests.conftest import wait_until
from tests.factories import JobFactory
from tests.testapp.jobs import (
    flow_flaky,
    flow_step,
    limited_step,
    poison,
    rated_step,
    record,
    wait_for_lock,
)
from tests.testapp.models import Effect, Run

pytestmark = pytest.mark.django_db(transaction=True)


def run_burst(**options: Any) -> None:
    Worker(burst=True, poll_interval=0.05, **options).run()


@pytest.fixture
def workers() -> Iterator[Callable[..., Worker]]:
    """Start workers in threads (stopped, and joined, after the test)."""
    started: list[tuple[Worker, threading.Thread]] = []

    def start(**options: Any) -> Worker:
        options.setdefault("poll_interval", 0.1)
        options.setdefault("scheduler", False)
        worker = Worker(**options)
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        started.append((worker, thread))
        return worker

    yield start
    for worker, _ in started:
        worker.stop()
    for _, thread in started:
        thread.join(timeout=30)


def most_at_once(runs: list[Run]) -> int:
    """The most runs whose [started, finished) overlap at one moment."""
    events = sorted([(run.started, 1) for run in runs] + [(run.finished, -1) for run in runs])
    running = most = 0
    for _, change in events:
        running += change
        most = max(most, running)
    return most


def running_count(queue_or_kind: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM jobq_job WHERE status = 'running' AND (queue = %s OR kind = %s)",
            [queue_or_kind, queue_or_kind],
        )
        (count,) = cursor.fetchone()
        return int(count)


class Sampler:
    """Reads how many jobs of a queue or kind are running, over and over, in a thread."""

    def __init__(self, queue_or_kind: str) -> None:
        self.queue_or_kind = queue_or_kind
        self.most = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        from django.db import connections

        try:
            while not self._stop.is_set():
                self.most = max(self.most, running_count(self.queue_or_kind))
        finally:
            connections.close_all()

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


# -- pausing ---------------------------------------------------------------------------------


def test_a_paused_queue_keeps_its_jobs_while_other_queues_run_and_runs_them_once_resumed():
    Queue.objects.create(name="flow", paused_at=timezone.now())
    flow_step.enqueue("held")  # enqueue still works
    record.enqueue("elsewhere")
    run_burst(concurrency=2)
    assert list(Effect.objects.values_list("label", flat=True)) == ["elsewhere"]
    held = Job.objects.get(kind=flow_step.kind)
    assert (held.status, held.attempts) == ("ready", 0)

    Queue.objects.filter(name="flow").update(paused_at=None)
    run_burst(concurrency=2)
    assert list(Run.objects.values_list("label", flat=True)) == ["held"]
    assert not Job.objects.exists()


def test_a_pause_committed_after_a_worker_read_the_pauses_binds_its_very_next_claim(queue_cursor):
    flow_step.enqueue("held")
    state = flow_state.load(queue_cursor)  # the worker's view: nothing paused
    Queue.objects.create(name="flow", paused_at=timezone.now())

    claimed = claims.claim(
        queue_cursor,
        worker_id="stale",
        limit=10,
        queues=None,
        excluded_queues=state.excluded_queues(),
        flow=state.guard,
    )

    assert claimed == []
    assert state.guard.changed  # the claim told it to read the pauses again
    assert Job.objects.get().attempts == 0
    assert "flow" in flow_state.load(queue_cursor).paused


def test_a_pause_with_an_end_resumes_by_itself_at_that_time(workers):
    until = timezone.now() + timedelta(seconds=1.5)
    Queue.objects.create(name="flow", paused_at=timezone.now(), paused_until=until)
    flow_step.enqueue("after the pause")
    workers(queues=["flow"])
    run = wait_until(Run.objects.first, what="the job to run once the pause ended")
    assert run.started >= until.timestamp()


def test_a_worker_whose_queues_are_all_paused_claims_again_when_one_is_resumed(workers):
    Queue.objects.create(name="flow", paused_at=timezone.now())
    workers(queues=["flow"], concurrency=2)
    flow_step.enqueue("one")
    with connection.cursor() as cursor:  # as the worker sees it: the job waits, unclaimed
        cursor.execute("SELECT pg_sleep(0.3)")
    assert Job.objects.get().attempts == 0
    Queue.objects.filter(name="flow").update(paused_at=None)
    wait_until(Run.objects.exists, what="the resumed queue's job to run")


# -- concurrency limits -----------------------------------------------------------------------


def test_a_kind_limit_holds_across_workers_and_is_reached(workers):
    for n in range(12):
        limited_step.enqueue(f"j{n}", seconds=0.15)
    with Sampler(limited_step.kind) as sampler:
        workers(concurrency=4)
        workers(concurrency=4)
        wait_until(lambda: Run.objects.count() == 12, what="every job to run", timeout=60)
    runs = list(Run.objects.all())
    assert most_at_once(runs) == 2  # reached, never passed
    assert sampler.most <= 2


def test_an_operators_queue_limit_overrides_the_setting_and_one_at_a_time_is_serial(workers):
    Queue.objects.create(name="flow", concurrency_limit=1)
    with override_settings(JOBQ={"QUEUES": {"flow": {"CONCURRENCY_LIMIT": 5}}}):
        for n in range(5):
            flow_step.enqueue(f"j{n}", seconds=0.05)
        workers(concurrency=3)
        workers(concurrency=3)
        wait_until(lambda: Run.objects.count() == 5, what="every job to run", timeout=60)
    assert most_at_once(list(Run.objects.all())) == 1


def test_a_limit_in_the_settings_binds_without_any_row(workers):
    with override_settings(JOBQ={"QUEUES": {"flow": {"CONCURRENCY_LIMIT": 1}}}):
        for n in range(4):
            flow_step.enqueue(f"j{n}", seconds=0.05)
        workers(concurrency=4)
        wait_until(lambda: Run.objects.count() == 4, what="every job to run", timeout=60)
    assert most_at_once(list(Run.objects.all())) == 1


def test_limited_jobs_are_claimed_for_idle_threads_only_never_prefetched(workers):
    KindLimit.objects.create(kind=limited_step.kind, concurrency_limit=10)
    for n in range(4):
        limited_step.enqueue(f"j{n}", seconds=0.1)
    with Sampler(limited_step.kind) as sampler:
        workers(concurrency=1, batch_size=8)
        wait_until(lambda: Run.objects.count() == 4, what="every job to run", timeout=60)
    assert sampler.most == 1  # one thread: one claimed at a time, though the limit allows 10


# -- rate limits --------------------------------------------------------------------------------


def test_a_rate_limit_bounds_the_starts_in_every_window_across_workers(workers):
    for n in range(15):
        rated_step.enqueue(f"j{n}")
    workers(concurrency=4)
    workers(concurrency=4)
    wait_until(lambda: Run.objects.count() == 15, what="every job to run", timeout=60)
    starts = sorted(Run.objects.values_list("started", flat=True))
    for index, start in enumerate(starts):  # any one second holds at most 5 starts
        assert sum(1 for other in starts[index:] if other < start + 1.0) <= 5
    assert starts[-1] - starts[0] >= 2.0  # 15 starts at 5/s take at least two windows
    wait_until(lambda: not Job.objects.exists(), what="the last acks")
    assert not DeadLetter.objects.exists()  # held back, never failed


def test_a_burst_worker_runs_every_job_a_concurrency_limit_holds_back_before_it_stops():
    """A burst worker stops once no job is due: jobs held back by a concurrency limit are
    due as soon as a slot frees (its own job's end), so it runs them all, one at a time."""
    Queue.objects.create(name="flow", concurrency_limit=1)
    for n in range(5):
        flow_step.enqueue(f"j{n}")
    run_burst(concurrency=4)
    runs = sorted(Run.objects.values_list("started", "finished"))
    assert len(runs) == 5 and not Job.objects.exists()
    assert all(finished <= next_started for (_, finished), (next_started, _) in pairwise(runs))


def test_a_job_held_back_by_a_limit_consumes_no_attempt(queue_cursor):
    KindLimit.objects.create(kind=rated_step.kind, rate_limit="1/h")
    rated_step.enqueue("first")
    rated_step.enqueue("second")
    run_burst(concurrency=2)
    assert Run.objects.count() == 1
    waiting = Job.objects.get()
    assert (waiting.status, waiting.attempts, waiting.last_error) == ("ready", 0, "")


def claim_limited_now(
    connection: Any,
    *,
    limit: int = 1,
    prefetch: int = 0,
    queues: list[str] | None = ["tuned"],  # noqa: B006 (never changed)
    kind: str = record.kind,
    state: flow_state.FlowState | None = None,
) -> limited_claims.LimitedClaim:
    """One limited claim of ``kind``'s jobs of ``queues`` (``None``: every queue), as a
    worker makes it, with ``state`` (default: loaded now)."""
    return limited_claims.claim_limited(
        connection,
        worker_id="tests",
        limit=limit,
        prefetch=prefetch,
        queues=queues,
        kinds=[kind],
        state=state or flow_state.load(connection.cursor()),
    )


@pytest.mark.parametrize(
    ("limits", "claimed"),
    [
        ({"concurrency_limit": 100}, 5),  # room 100 >= 2 x 5: idle slot and prefetch
        ({"concurrency_limit": 9}, 1),  # room 9 < 2 x 5: the idle slot only
        ({"rate_limit": "1000/s"}, 5),  # 1,000 starts a second left >= 2 x 5
        ({"rate_limit": "9/s"}, 1),  # room 9 < 2 x 5: the idle slot only
        ({"concurrency_limit": 100, "rate_limit": "9/s"}, 1),  # the nearer limit decides
        # Each limit against its own room: 100 >= 2 x 5, and 100,000 starts left of 100,000.
        ({"concurrency_limit": 100, "rate_limit": "100000/s"}, 5),
    ],
)
def test_a_limited_claim_fills_the_prefetch_only_while_its_limits_are_far_from_binding(
    connect, limits, claimed
):
    Queue.objects.create(name="tuned", **limits)
    for n in range(8):
        record.using(queue="tuned").enqueue(f"j{n}")
    result = claim_limited_now(connect(), limit=1, prefetch=4)
    assert len(result.jobs) == claimed
    assert result.far_from_binding is (claimed > 1)
    assert Job.objects.filter(status="running").count() == claimed


@pytest.mark.parametrize(
    ("queue_jobs", "claimed", "kinds_claimed"),
    [
        (8, 5, {record.kind}),  # the queue's jobs fill the prefetch: its limit is far
        (0, 1, {limited_step.kind}),  # the tight kind's jobs fill the idle slot only
    ],
)
def test_a_tight_kind_limit_keeps_only_its_own_jobs_out_of_the_prefetch(
    connect, queue_jobs, claimed, kinds_claimed
):
    """A worker whose kinds include one with a tight limit of its own (limited_step: 2 at
    a time) still fills its prefetch with the jobs of a limited queue far from its limit;
    the tight kind's jobs are claimed for idle handler slots only."""
    Queue.objects.create(name="tuned", concurrency_limit=100)
    for n in range(queue_jobs):
        record.using(queue="tuned").enqueue(f"j{n}")
    for n in range(3):
        limited_step.enqueue(f"k{n}")
    worker_connection = connect()
    state = flow_state.load(worker_connection.cursor())
    result = limited_claims.claim_limited(
        worker_connection,
        worker_id="tests",
        limit=1,
        prefetch=4,
        queues=None,
        kinds=[record.kind, limited_step.kind],
        state=state,
    )
    assert len(result.jobs) == claimed
    assert {job.kind for job in result.jobs} == kinds_claimed
    assert not state.claim_first  # the kind's limit is near: the next claim counts first


@pytest.mark.parametrize(
    "queues",
    [["tuned"], ["tuned", "tuned_too"]],
    ids=["one claim statement, one round trip", "a claim statement per limited queue"],
)
def test_far_from_its_limits_a_limited_claim_holds_no_limit_row_while_it_claims(connect, queues):
    """Once a count found every limit far from binding, the next limited claim claims
    first and only then locks the limits' rows and counts: another worker's limited claim
    waits for those rows only for the count and the commit, not for the claim statement.
    The first claim, which knows nothing yet, locks before it claims. Seen from another
    connection while the claim statement waits (a lock on ``jobq_queue``, which it reads
    for the digest of the pauses and limits, holds it up)."""
    for name in queues:
        Queue.objects.create(name=name, concurrency_limit=100)
        for n in range(4):
            record.using(queue=name).enqueue(f"{name}{n}")
    worker_connection = connect()
    state = flow_state.load(worker_connection.cursor())
    blocker, onlooker = connect(), connect()

    def claim_while_looking() -> tuple[bool, limited_claims.LimitedClaim]:
        claimed: list[limited_claims.LimitedClaim] = []
        with blocker.transaction():
            blocker.execute("LOCK TABLE jobq_queue IN ACCESS EXCLUSIVE MODE")
            claiming = threading.Thread(
                target=lambda: claimed.append(
                    claim_limited_now(
                        worker_connection, limit=1, prefetch=1, queues=queues, state=state
                    )
                )
            )
            claiming.start()
            _wait_for_a_lock_wait(
                onlooker, worker_connection, "the claim statement waiting on jobq_queue"
            )
            try:
                onlooker.execute(
                    "SELECT 1 FROM jobq_limit_state WHERE name = ANY(%s) FOR UPDATE NOWAIT",
                    [queues],
                )
            except psycopg.errors.LockNotAvailable:
                locked = True
            else:
                locked = False
        claiming.join(timeout=20)
        return locked, claimed[0]

    first_locked, first = claim_while_looking()
    second_locked, second = claim_while_looking()
    assert (first_locked, second_locked) == (True, False)
    assert (len(first.jobs), len(second.jobs), second.far_from_binding) == (2, 2, True)
    assert Job.objects.filter(status="running").count() == 4


def _prepared_plans(connection: Any, fragment: str) -> list[tuple[int, int]]:
    """How many generic and custom plans PostgreSQL made for each statement prepared on
    ``connection`` whose text holds ``fragment`` (``pg_prepared_statements``)."""
    return [
        (generic, custom)
        for text, generic, custom in connection.execute(
            "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements"
        ).fetchall()
        if fragment in text
    ]


def test_far_from_its_limits_the_admission_is_planned_once_and_the_claim_for_its_values(
    connect,
):
    """On a connection that prepares its statements (a worker's main loop), the admission
    of a claim made before its count (``sql.flow.ADMIT_CLAIMED``) runs with its generic
    plan: PostgreSQL plans it once, not at every claim (where planning it took three
    times as long as running it). The claim statement sent before it in the same
    transaction, and every claim after, are still planned for their values (PostgreSQL's
    first five runs of a prepared statement): the setting ends with the admission."""
    worker_connection, state = _far_from_its_limit(connect)
    worker_connection.prepare_threshold = 0
    worker_connection.execute("DEALLOCATE ALL")
    for n in range(5):
        record.using(queue="tuned").enqueue(f"next {n}")
        result = claim_limited_now(worker_connection, state=state)
        assert (len(result.jobs), result.far_from_binding) == (1, True)
    admissions = _prepared_plans(worker_connection, "counted")
    claims = _prepared_plans(worker_connection, "front")
    assert admissions == [(5, 0)]
    assert claims == [(0, 5)]


def test_near_its_limits_the_count_is_planned_once_and_the_claims_after_it_for_their_values(
    connect,
):
    """A claim that counts before it claims (its last count found a limit near) runs that
    count (``sql.flow.COUNT_LIMITED``) with its generic plan, planned once, and sets the plan
    mode back before its claim statements, which are planned for their values as a plain
    claim's are (PostgreSQL's first five runs of a prepared statement)."""
    Queue.objects.create(name="tuned", concurrency_limit=100, rate_limit="1000/m")
    worker_connection = connect()
    worker_connection.prepare_threshold = 0
    state = flow_state.load(worker_connection.cursor())
    for n in range(5):
        record.using(queue="tuned").enqueue(f"job {n}")
        state.claim_first = False  # as after a count that found the limit near
        result = claim_limited_now(worker_connection, state=state)
        assert (len(result.jobs), result.far_from_binding) == (1, True)
    counts = _prepared_plans(worker_connection, "AS live,")
    # One prepared claim per set of parameter types (positions unknown at first, then known).
    claims = _prepared_plans(worker_connection, "front")
    assert counts == [(5, 0)]
    assert (sum(generic for generic, _ in claims), sum(custom for _, custom in claims)) == (0, 5)
    assert worker_connection.execute("SHOW plan_cache_mode").fetchone() == ("auto",)


@pytest.mark.parametrize(
    "limits", [{"concurrency_limit": 10}, {"rate_limit": "10/m"}], ids=["concurrency", "rate"]
)
@pytest.mark.parametrize(
    ("taken_elsewhere", "claimed", "running"),
    [
        (7, 1, 10),  # 9 of 10 taken: its 2 do not fit, rolled back; the idle slot's 1 does
        (5, 2, 9),  # 7 of 10 taken: its 2 fit and are kept; no longer far from the limit
    ],
)
def test_a_claim_made_before_its_count_is_kept_only_if_it_fits_the_limit(
    connect, limits, taken_elsewhere, claimed, running
):
    """A claim made before the count (the last count was far from binding) whose count
    finds that other workers took the limit close meanwhile: if its jobs do not fit, the
    count refuses them, nothing commits, and the jobs are claimed again under the locks,
    within what the limit leaves; if they fit, they are kept. Either way the next claim
    locks and counts first. The limit is never passed."""
    Queue.objects.create(name="tuned", **limits)
    for n in range(12):
        record.using(queue="tuned").enqueue(f"j{n}")
    worker_connection = connect()
    state = flow_state.load(worker_connection.cursor())
    first = claim_limited_now(worker_connection, limit=1, prefetch=1, state=state)
    assert (len(first.jobs), state.claim_first) == (2, True)  # room 10 >= 2 x 2
    other = claim_limited_now(connect(), limit=taken_elsewhere)  # another worker's claim
    assert len(other.jobs) == taken_elsewhere
    result = claim_limited_now(worker_connection, limit=1, prefetch=1, state=state)
    assert (len(result.jobs), result.far_from_binding, state.claim_first) == (
        claimed,
        False,
        False,
    )
    assert Job.objects.filter(status="running").count() == running
    assert Job.objects.filter(status="ready", attempts=0).count() == 12 - running


def test_a_rate_limited_claim_made_first_logs_its_starts_as_it_commits(connect):
    """A claim made before its count logs its jobs' starts in the statement that admits
    them (found server-side: this transaction's jobs), one row per rate limit, stamped as a
    claim that may fill the prefetch; each job's start points at that row."""
    Queue.objects.create(name="tuned", rate_limit="1000/h")
    for n in range(8):
        record.using(queue="tuned").enqueue(f"j{n}")
    worker_connection = connect()
    state = flow_state.load(worker_connection.cursor())
    assert len(claim_limited_now(worker_connection, limit=1, prefetch=2, state=state).jobs) == 3
    assert state.claim_first
    result = claim_limited_now(worker_connection, limit=1, prefetch=2, state=state)
    newest = LimitStart.objects.order_by("-id")[0]
    assert (len(result.jobs), newest.starts) == (3, 3)
    assert {rated.rows for rated in result.rated.values()} == {(newest.pk,)}
    assert set(result.rated) == {job.id for job in result.jobs}
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        (now,) = cursor.fetchone()
    # A quarter of an hour, at most 10 s ahead (limited_claims.prefetch_cover).
    assert timedelta(seconds=9) < newest.started_at - now <= timedelta(seconds=10)


def test_a_claim_made_first_is_taken_back_when_the_limit_changed_before_its_admission(
    connect,
):
    """A claim made before its count whose claim statement ran under the old limits, and
    whose admission comes after a change committed (it waited for the limit's row
    meanwhile), is refused: nothing commits, the jobs are ready again with their attempts
    untouched, and the worker reads the change before it claims again."""
    worker_connection, state = _far_from_its_limit(connect)
    for n in range(3):
        record.using(queue="tuned").enqueue(f"j{n}")
    holder, onlooker = connect(autocommit=False), connect()
    holder.execute("SELECT * FROM jobq_limit_state WHERE name = 'tuned' FOR UPDATE")
    claimed: list[limited_claims.LimitedClaim] = []
    claiming = threading.Thread(
        target=lambda: claimed.append(
            claim_limited_now(worker_connection, limit=1, prefetch=2, state=state)
        )
    )
    claiming.start()
    _wait_for_a_lock_wait(onlooker, worker_connection, "the claim waiting for the limit's row")
    Queue.objects.filter(name="tuned").update(concurrency_limit=1)  # commits
    holder.rollback()
    claiming.join(timeout=20)
    assert claimed[0].jobs == [] and state.stale
    assert Job.objects.filter(status="running").count() == 1  # the first claim's job
    assert Job.objects.filter(status="ready", attempts=0).count() == 3


def test_a_claim_made_before_its_count_is_taken_back_when_a_limit_row_is_held(connect):
    """A claim made before the count that cannot lock a limit's row (another worker's claim
    holds it past the lock timeout) is rolled back: its jobs are ready again, their attempts
    untouched; the row is not waited for again for a while, and once free the jobs are
    claimed."""
    Queue.objects.create(name="tuned", concurrency_limit=100)
    for n in range(3):
        record.using(queue="tuned").enqueue(f"j{n}")
    worker_connection = connect()
    state = flow_state.load(worker_connection.cursor())
    assert len(claim_limited_now(worker_connection, state=state).jobs) == 1
    assert state.claim_first
    held = connect(autocommit=False)
    held.execute("SELECT * FROM jobq_limit_state WHERE name = 'tuned' FOR UPDATE")
    result = claim_limited_now(worker_connection, limit=1, prefetch=1, state=state)
    assert (result.jobs, result.held_elsewhere) == ([], True)
    assert state.stuck_until[("queue", "tuned")] > time.monotonic()
    assert Job.objects.filter(status="ready", attempts=0).count() == 2
    held.rollback()
    state.stuck_until.clear()
    result = claim_limited_now(worker_connection, limit=1, prefetch=1, state=state)
    assert len(result.jobs) == 2


def test_a_limit_row_held_by_a_stalled_claim_holds_up_only_its_own_jobs(connect):
    """Another worker's limited claim that holds one limit's row (a stalled process, a slow
    network) makes this claim wait for it only briefly, then claim the other limited
    queue's job without it (held elsewhere: try again soon), and not wait for that row
    again for a while; once the row is free, its job is claimed."""
    Queue.objects.create(name="tuned", concurrency_limit=5)
    Queue.objects.create(name="other", concurrency_limit=5)
    stuck = record.using(queue="tuned").enqueue("stuck")
    free = record.using(queue="other").enqueue("free")
    worker_connection = connect()
    state = flow_state.load(worker_connection.cursor())  # writes the limits' rows

    def claim() -> Any:
        return claim_limited_now(worker_connection, limit=2, queues=["tuned", "other"], state=state)

    stalled = connect(autocommit=False)
    stalled.execute("SELECT * FROM jobq_limit_state WHERE name = 'tuned' FOR UPDATE")
    result = claim()
    assert ([job.id for job in result.jobs], result.held_elsewhere) == ([free.pk], True)
    assert state.stuck_until[("queue", "tuned")] > time.monotonic()  # not waited for again
    stalled.rollback()
    assert [job.id for job in claim().jobs] == [stuck.pk]


def _behind_positions(
    connect: Callable[..., Any], backlog: int
) -> tuple[Any, flow_state.FlowState, Job]:
    """A limited queue of ``backlog`` jobs, a worker's connection and flow state whose claim
    took the first two (its positions moved past them), and a straggler: a job that sorts
    before every other (a past ``run_at``), as one released by a stopping worker or
    committed late does, behind the positions."""
    Queue.objects.create(name="tuned", concurrency_limit=100)
    for n in range(backlog):
        record.using(queue="tuned").enqueue(f"j{n}")
    worker_connection = connect()
    state = flow_state.load(worker_connection.cursor())
    claim_limited_now(worker_connection, limit=2, state=state)
    straggler = record.using(queue="tuned").enqueue("behind")
    Job.objects.filter(pk=straggler.pk).update(run_at=timezone.now() - timedelta(days=1))
    return worker_connection, state, straggler


def test_limited_claims_read_on_from_where_the_last_one_stopped(connect):
    """In a backlog, a limited claim starts after the jobs the claims before it took (the
    entries of jobs already claimed are not walked again), so a job that comes to sort
    before that waits while claims come back full."""
    worker_connection, state, straggler = _behind_positions(connect, backlog=6)
    taken = claim_limited_now(worker_connection, limit=2, state=state).jobs
    assert len(taken) == 2 and straggler.pk not in [job.id for job in taken]


def test_a_limited_claim_that_comes_back_short_lets_the_next_read_from_the_start(connect):
    """A claim from the positions that takes fewer jobs than it asked for drops them: the
    next claim (the worker claims again after one that took jobs) finds a job behind them."""
    worker_connection, state, straggler = _behind_positions(connect, backlog=3)
    assert len(claim_limited_now(worker_connection, limit=5, state=state).jobs) == 1
    record.using(queue="tuned").enqueue("after the positions")
    assert [job.id for job in claim_limited_now(worker_connection, state=state).jobs] == [
        straggler.pk
    ]


def test_a_limited_claim_that_finds_nothing_from_its_positions_reads_from_the_start(connect):
    """A limited claim that returns nothing saw every job it could take: one that finds
    nothing after its positions reads again from the start at once."""
    worker_connection, state, straggler = _behind_positions(connect, backlog=2)
    assert [job.id for job in claim_limited_now(worker_connection, state=state).jobs] == [
        straggler.pk
    ]


def test_a_quiet_limited_queue_costs_one_claim_statement_per_limited_claim(connect, monkeypatch):
    """Positions are kept only after a claim that took all it asked for: once a claim from
    them found nothing (and read again from the start), the next reads from the start
    alone, one statement, as a worker's claims of a quiet limited queue do."""
    worker_connection, state, straggler = _behind_positions(connect, backlog=2)
    taken = claim_limited_now(worker_connection, limit=5, state=state).jobs  # read again
    assert [job.id for job in taken] == [straggler.pk]
    statements: list[str] = []
    for name in ("claim", "send_front"):  # each sends a claim statement, or more
        monkeypatch.setattr(claims, name, _counted(getattr(claims, name), statements))
    assert claim_limited_now(worker_connection, state=state).jobs == []
    assert statements == ["send_front"]  # the whole claim in one round trip


def _counted(function: Callable[..., Any], calls: list[str]) -> Callable[..., Any]:
    """``function``, noting its name in ``calls`` each time it is called."""

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(function.__name__)
        return function(*args, **kwargs)

    return counted


def _wait_for_a_lock_wait(onlooker: Any, waiting: Any, what: str) -> None:
    """Poll, on the connection ``onlooker``, until the connection ``waiting`` waits for a
    lock (``pg_stat_activity``)."""
    wait_until(
        lambda: onlooker.execute(
            "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s",
            [waiting.info.backend_pid],
        ).fetchone()[0],
        what=what,
    )


def _far_from_its_limit(connect: Callable[..., Any]) -> tuple[Any, flow_state.FlowState]:
    """A worker's connection and flow state whose first limited claim (it took one job of
    the limited queue "tuned") found the limit far from binding: its next claims of the
    queue are made first, in one round trip."""
    Queue.objects.create(name="tuned", concurrency_limit=100)
    record.using(queue="tuned").enqueue("first")
    worker_connection = connect()
    state = flow_state.load(worker_connection.cursor())
    assert len(claim_limited_now(worker_connection, state=state).jobs) == 1
    assert state.claim_first
    return worker_connection, state


@pytest.mark.parametrize(
    "queues",
    [["tuned"], ["tuned", "tuned_too"]],
    ids=["one claim statement, one round trip", "a claim statement per limited queue"],
)
def test_a_limited_claim_made_first_that_finds_nothing_locks_and_writes_nothing(connect, queues):
    """A claim made before its count that finds no job (a quiet limited queue, whose worker
    claims after every job it runs) takes no limit row: it neither waits for a row another
    worker's claim holds nor holds one up, and writes nothing (no pruning of the rate
    limit's old starts: its commit waits for no flush of the WAL). It still counts: the
    next claim is made first too, and prunes as it logs."""
    for name in queues:
        Queue.objects.create(name=name, concurrency_limit=1000, rate_limit="1000/h")
        record.using(queue=name).enqueue(f"{name} first")
    worker_connection = connect()
    state = flow_state.load(worker_connection.cursor())
    first = claim_limited_now(worker_connection, limit=2, queues=queues, state=state)
    assert (len(first.jobs), state.claim_first) == (len(queues), True)
    old = LimitStart.objects.create(
        scope="queue", name="tuned", started_at=timezone.now() - timedelta(hours=2), starts=1
    )
    holder = connect(autocommit=False)
    holder.execute("SELECT * FROM jobq_limit_state WHERE name = ANY(%s) FOR UPDATE", [queues])
    result = claim_limited_now(worker_connection, limit=1, prefetch=1, queues=queues, state=state)
    assert (result.jobs, result.held_elsewhere, result.far_from_binding) == ([], False, True)
    assert (state.claim_first, state.stuck_until) == (True, {})
    holder.rollback()
    assert LimitStart.objects.filter(pk=old.pk).exists()  # not pruned by a claim of nothing
    record.using(queue="tuned").enqueue("next")
    assert len(claim_limited_now(worker_connection, queues=queues, state=state).jobs) == 1
    assert not LimitStart.objects.filter(pk=old.pk).exists()  # a claim that logs prunes


def test_a_claim_in_one_round_trip_that_found_only_other_kinds_walks_to_its_own_at_once(
    connect, monkeypatch
):
    """A limited claim of one round trip sends only the claim's first statement. When that
    statement's front holds only jobs of kinds the worker lacks, the worker's own jobs wait
    behind them: the claim walks to them at once, in a second transaction, rather than
    coming back empty."""
    worker_connection, state = _far_from_its_limit(connect)
    Job.objects.bulk_create(JobFactory.build_batch(10, queue="tuned", kind="kinds.other"))
    mine = record.using(queue="tuned").enqueue("behind them")
    sent: list[str] = []
    for name in ("claim", "send_front"):
        monkeypatch.setattr(claims, name, _counted(getattr(claims, name), sent))
    result = claim_limited_now(worker_connection, limit=1, state=state)
    assert [job.id for job in result.jobs] == [mine.pk]
    assert sent == ["send_front", "claim"]
    assert not state.walk_next


def test_a_claim_in_one_round_trip_that_found_some_leaves_the_walk_to_the_next_claim(connect):
    """When the first statement's front held some of the worker's jobs among other kinds',
    the claim keeps them and says more may wait (``full``: the worker claims again at
    once); the next claim walks to those behind."""
    worker_connection, state = _far_from_its_limit(connect)
    ahead = record.using(queue="tuned").enqueue("ahead")
    Job.objects.bulk_create(JobFactory.build_batch(10, queue="tuned", kind="kinds.other"))
    behind = record.using(queue="tuned").enqueue("behind")
    first = claim_limited_now(worker_connection, limit=2, state=state)
    assert ([job.id for job in first.jobs], first.full) == ([ahead.pk], True)
    assert state.walk_next == {(("queue", "tuned"),)}
    second = claim_limited_now(worker_connection, limit=2, state=state)
    assert [job.id for job in second.jobs] == [behind.pk]
    assert not state.walk_next


def test_limited_claims_read_from_the_start_once_the_positions_probe_is_due(connect, monkeypatch):
    """However full the claims, a job behind the positions waits at most a probe interval
    (django_jobq.claim_positions): then the positions are dropped."""
    worker_connection, state, straggler = _behind_positions(connect, backlog=6)
    (positions,) = state.positions.values()
    monkeypatch.setattr(positions, "seconds_until_probe", lambda: 0.0)  # the interval passed
    taken = claim_limited_now(worker_connection, limit=2, state=state).jobs
    assert straggler.pk in [job.id for job in taken]


def test_a_claim_for_the_prefetch_alone_does_not_wait_for_a_row_held_elsewhere(connect):
    """With no idle handler thread to fill, a limited claim that finds a limit's row held by
    another worker's claim does not wait for it (the loop tries again on its next turn, and
    goes on with its acks meanwhile), nor marks the row stuck; a claim for an idle thread
    waits for it, and once it is free claims at once."""
    Queue.objects.create(name="tuned", concurrency_limit=100)
    waiting = record.using(queue="tuned").enqueue("waits")
    worker_connection = connect()
    state = flow_state.load(worker_connection.cursor())
    held = connect(autocommit=False)
    held.execute("SELECT * FROM jobq_limit_state WHERE name = 'tuned' FOR UPDATE")
    result = claim_limited_now(worker_connection, limit=0, prefetch=10, state=state)
    assert (result.jobs, result.held_elsewhere, state.stuck_until) == ([], True, {})
    result = claim_limited_now(worker_connection, limit=1, prefetch=10, state=state)
    assert (result.jobs, result.held_elsewhere) == ([], True)
    assert state.stuck_until[("queue", "tuned")] > time.monotonic()  # it waited in vain
    held.rollback()
    state.stuck_until.clear()
    assert [
        job.id
        for job in claim_limited_now(worker_connection, limit=0, prefetch=10, state=state).jobs
    ] == [waiting.pk]


def test_a_lock_on_an_old_row_of_the_starts_log_holds_up_no_claim(connect):
    """A row of the rate limits' log of starts out of its window, locked by another
    transaction (a lock taken by hand, a late start moving out of it), is not waited for
    by the claim that prunes the log: the claim goes on, and a later one deletes it."""
    Queue.objects.create(name="tuned", rate_limit="1000/s")
    old = LimitStart.objects.create(
        scope="queue", name="tuned", started_at=timezone.now() - timedelta(hours=1), starts=1
    )
    job_ = record.using(queue="tuned").enqueue("claimed")
    worker_connection = connect()
    holder = connect(autocommit=False)
    holder.execute("SELECT * FROM jobq_limit_start WHERE id = %s FOR UPDATE", [old.pk])
    result = claim_limited_now(worker_connection)
    assert ([job.id for job in result.jobs], result.held_elsewhere) == ([job_.pk], False)
    assert LimitStart.objects.filter(pk=old.pk).exists()
    holder.rollback()
    record.using(queue="tuned").enqueue("next")
    claim_limited_now(worker_connection)
    assert not LimitStart.objects.filter(pk=old.pk).exists()


@pytest.mark.parametrize("claim_first", [False, True], ids=["count first", "claim first"])
def test_a_limit_row_deleted_by_hand_is_written_again_by_the_next_load(connect, claim_first):
    """Without the row a limit's claims lock, nothing claims under the limit (a claim made
    before its count is refused by it); the next load writes the row again."""
    Queue.objects.create(name="tuned", concurrency_limit=5)
    record.using(queue="tuned").enqueue("waits")
    connection_ = connect()
    state = flow_state.load(connection_.cursor())
    state.claim_first = claim_first
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM jobq_limit_state")
    result = claim_limited_now(connection_, state=state)
    assert result.jobs == [] and state.guard.changed  # read the state again
    assert Job.objects.get().status == "ready"
    assert len(claim_limited_now(connection_, limit=1, prefetch=0).jobs) == 1


def test_a_rate_limited_handler_logs_its_start_only_when_it_starts_after_the_margin(
    connect, queue_cursor
):
    """The claim logs its starts in one row; a handler starting within half the window's
    margin of its claim (1 s for "1000/h") is counted by it, one starting later moves its
    start out of it into a row of its own, stamped as it starts."""
    Queue.objects.create(name="tuned", rate_limit="1000/h")
    prompt, late = (record.using(queue="tuned").enqueue(label) for label in ("prompt", "late"))
    result = claim_limited_now(connect(), limit=2, prefetch=0)
    held = {job.id: HeldJob(job, rated=result.rated[job.id]) for job in result.jobs}
    (claimed,) = LimitStart.objects.values_list("started_at", "starts")
    assert claimed[1] == 2

    assert not result.rated[prompt.pk].needs_confirming()
    executor.execute(held[prompt.pk], lambda held: True)
    assert LimitStart.objects.count() == 1  # no statement for a prompt start
    wait_until(result.rated[late.pk].needs_confirming, what="the margin to pass", timeout=5)
    executor.execute(held[late.pk], lambda held: True)

    logged = list(LimitStart.objects.order_by("started_at").values_list("started_at", "starts"))
    assert logged[0] == (claimed[0], 1)  # the prompt start
    assert logged[1][0] > claimed[0] and logged[1][1] == 1  # stamped as it started
    assert Effect.objects.count() == 2


def test_a_rate_limited_claim_that_fills_the_prefetch_counts_its_starts_ahead(connect):
    """Far from its rate limit a claim takes jobs for the prefetch too, and logs their
    starts in one row stamped a quarter of the window ahead of the clock (at most 10 s): a
    job that waits that long in the prefetch starts without a statement; near the limit, a
    claim takes jobs for its idle slots only, stamped the window's margin ahead."""
    Queue.objects.create(name="tuned", rate_limit="1000/h")
    for n in range(8):
        record.using(queue="tuned").enqueue(f"j{n}")
    connection_ = connect()

    far = claim_limited_now(connection_, limit=1, prefetch=4)
    (row,) = LimitStart.objects.values_list("started_at", "starts")
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        (now,) = cursor.fetchone()

    assert len(far.jobs) == 5 and row[1] == 5
    # A quarter of an hour, at most 10 s ahead: 10 s, less what ran since the stamp.
    assert timedelta(seconds=9) < row[0] - now <= timedelta(seconds=10)
    covered = [rated.covered_until - time.monotonic() for rated in far.rated.values()]
    assert all(9 < seconds <= 10 + 0.5 for seconds in covered)  # plus half the margin

    Queue.objects.filter(name="tuned").update(rate_limit="6/h")  # 5 logged: 1 left
    near = claim_limited_now(connection_, limit=1, prefetch=4)
    assert len(near.jobs) == 1
    newest = LimitStart.objects.order_by("-id").values_list("started_at", "starts")[0]
    # The window's margin ahead (1 s for an hour): what the commit and the hand-off take.
    assert newest[1] == 1 and timedelta(seconds=1) <= newest[0] - now < timedelta(seconds=2)


def test_a_rate_limit_counts_the_starts_of_every_claim_row_until_its_window_passes(connect):
    """Rows of many starts add up: with 7 of "10/h" logged by two claims, a claim takes 3,
    and the next one none, until the rows leave the window (``frees_in``: when the oldest
    row whose starts reach the count does)."""
    Queue.objects.create(name="tuned", rate_limit="10/h")
    for n in range(12):
        record.using(queue="tuned").enqueue(f"j{n}")
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO jobq_limit_start (scope, name, started_at, starts) VALUES "
            "('queue', 'tuned', now() - interval '50 minutes', 4),"
            "('queue', 'tuned', now() - interval '10 minutes', 3)"
        )
    connection_ = connect()

    assert len(claim_limited_now(connection_, limit=8).jobs) == 3
    stopped = claim_limited_now(connection_, limit=8)
    assert stopped.jobs == []
    # 10 reached: one more once the 50-minute-old row (4 starts) leaves the window (1 h and
    # its margin of 1 s): in 10 minutes and a second.
    assert stopped.next_start_in == pytest.approx(601, abs=5)


def starts_within(window: float) -> int:
    """The most handler starts (``Run.started``, the handlers' own clocks) in any
    ``window`` seconds."""
    starts = sorted(Run.objects.values_list("started", flat=True))
    return max(
        (
            sum(1 for other in starts[index:] if other < start + window)
            for index, start in enumerate(starts)
        ),
        default=0,
    )


def test_a_rate_limit_counts_a_retry_as_a_start():
    Queue.objects.create(name="flow", rate_limit="2/30s")
    flow_flaky.using(priority=10).enqueue("flaky")  # fails its first attempt, retried at once
    flow_step.enqueue("plain")
    flow_step.enqueue("plain too")

    run_burst(concurrency=1)  # the retry comes before the other jobs

    labels = list(Run.objects.order_by("started").values_list("label", flat=True))
    assert labels == ["flaky attempt 1", "flaky attempt 2"]
    assert starts_within(30.0) == 2
    for waiting in Job.objects.all():  # held back: no attempt consumed
        assert (waiting.kind, waiting.status, waiting.attempts) == (flow_step.kind, "ready", 0)


def test_a_rate_limit_counts_a_reclaim_as_a_start(queue_cursor):
    Queue.objects.create(name="flow", rate_limit="2/30s")
    reclaimed = flow_step.enqueue("reclaimed")
    held = flow_step.enqueue("held")
    # A worker claims the job, its handler starts, and the worker is SIGKILLed: its lease
    # lapses, with no outcome.
    claimed = claim_limited_now(queue_cursor.connection, queues=None, kind=flow_step.kind)
    assert [job.id for job in claimed.jobs] == [reclaimed.pk]
    flow_step.func("reclaimed")  # within the margin of its claim: the claim's row counts it
    Job.objects.filter(pk=reclaimed.pk).update(lease_deadline=timezone.now() - timedelta(seconds=1))

    run_burst(concurrency=2)

    assert list(Run.objects.values_list("label", flat=True)) == ["reclaimed", "reclaimed"]
    assert starts_within(30.0) == 2
    assert not Job.objects.filter(pk=reclaimed.pk).exists()  # attempt 2 ran and was acked
    waiting = Job.objects.get(pk=held.pk)
    assert (waiting.status, waiting.attempts, waiting.last_error) == ("ready", 0, "")


@pytest.mark.parametrize(
    ("age", "counted"), [(20.0, 2), (3600.0, 1)], ids=["inside-the-window", "pruned-by-the-claim"]
)
def test_a_released_job_claimed_again_counts_from_its_new_claim(age, counted, queue_cursor):
    """A stopping worker hands back a limited job no thread had started, and its attempt:
    the next claim of that same attempt logs a start from then; the first claim's row
    still counts until it leaves the window (on the safe side), and is pruned after."""
    Queue.objects.create(name="flow", rate_limit="3/30s")
    released = flow_step.enqueue("released")

    def claim() -> list[claims.ClaimedJob]:
        return claim_limited_now(queue_cursor.connection, queues=None, kind=flow_step.kind).jobs

    (first,) = claim()
    assert leases.release(queue_cursor, [first.lease]) == {released.pk}
    LimitStart.objects.update(started_at=F("started_at") - timedelta(seconds=age))
    (again,) = claim()

    assert (again.id, again.attempt) == (first.id, first.attempt)
    newest = LimitStart.objects.latest("id")
    claimed_at = Job.objects.get().started_at
    assert claimed_at is not None and newest.started_at >= claimed_at
    assert sum(LimitStart.objects.values_list("starts", flat=True)) == counted


def test_a_retry_held_back_by_a_rate_limit_keeps_its_attempt_and_logs_no_retry(caplog):
    Queue.objects.create(name="flow", rate_limit="2/30s")
    flow_flaky.enqueue("flaky")
    flow_step.enqueue("plain")
    caplog.set_level(logging.INFO, logger="django_jobq.worker")

    run_burst(concurrency=1)  # the flaky job's first attempt, then the plain job

    assert sorted(Run.objects.values_list("label", flat=True)) == ["flaky attempt 1", "plain"]
    retry = Job.objects.get()
    assert (retry.status, retry.attempts) == ("ready", 1)
    assert retry.last_error.startswith("RuntimeError: flaky fails its first attempt")
    retries = [r.getMessage() for r in caplog.records if "next run in" in r.getMessage()]
    assert (
        len(retries) == 1 and f"job {retry.pk} {flow_flaky.kind} attempt 1/3 failed" in (retries[0])
    )
    assert not DeadLetter.objects.exists()


# -- lanes ------------------------------------------------------------------------------------


def test_jobs_of_a_lane_wait_behind_its_first_and_lanes_run_side_by_side(workers):
    lanes: dict[str, list[str]] = {f"customer:{n}": [] for n in range(3)}
    for index in range(5):
        for lane, labels in lanes.items():
            label = f"{lane}#{index}"
            flow_step.using(ordering_key=lane).enqueue(label, seconds=0.03, lane=lane)
            labels.append(label)
    assert Job.objects.filter(status="ready").count() == 3  # one per lane
    assert Job.objects.filter(status="waiting").count() == 12
    workers(concurrency=4)
    workers(concurrency=4)
    wait_until(lambda: Run.objects.count() == 15, what="every job to run", timeout=60)
    for lane, labels in lanes.items():
        runs = list(Run.objects.filter(lane=lane).order_by("started"))
        assert [run.label for run in runs] == labels  # enqueue order
        assert most_at_once(runs) == 1
    assert most_at_once(list(Run.objects.all())) > 1  # lanes overlap


def test_a_failing_job_holds_its_lane_through_its_retries_and_its_dead_letter_frees_it():
    poison.using(ordering_key="lane").enqueue("failing")  # three attempts, no backoff
    record.using(ordering_key="lane").enqueue("after")
    run_burst(concurrency=4)
    labels = list(Effect.objects.order_by("id").values_list("label", flat=True))
    assert labels == ["failing", "failing", "failing", "after"]
    dead = DeadLetter.objects.get()
    assert dead.ordering_key == "lane"
    assert Effect.objects.get(label="after").created_at >= dead.died_at


def test_a_redriven_lane_job_joins_the_back_of_its_lane():
    poison.using(ordering_key="lane").enqueue("failing")
    run_burst(concurrency=1)
    record.using(ordering_key="lane").enqueue("queued")
    record.using(ordering_key="lane").enqueue("queued too")
    Job.objects.filter(kind=record.kind).update(status="waiting")  # as behind a running job
    Job.objects.filter(kind=record.kind, payload__label="queued").update(status="ready")
    assert redrive(DeadLetter.objects.all()) == 1
    redriven = Job.objects.get(kind=poison.kind)
    assert (redriven.status, redriven.ordering_key) == ("waiting", "lane")


def test_cancelling_a_lanes_first_job_makes_the_next_one_ready():
    first = record.using(ordering_key="lane").enqueue("first")
    second = record.using(ordering_key="lane").enqueue("second")
    assert Job.objects.get(pk=second.pk).status == "waiting"
    assert cancel(first.pk)
    assert Job.objects.get(pk=second.pk).status == "ready"


def test_a_waiting_job_can_be_cancelled():
    record.using(ordering_key="lane").enqueue("first")
    second = record.using(ordering_key="lane").enqueue("second")
    assert cancel(second.pk)
    assert Job.objects.count() == 1


def in_thread(action: Callable[[], Any]) -> Any:
    """Run ``action`` on another thread (its own database connection, closed after) and
    return its result: a concurrent transaction, while this thread's stays open."""
    from django.db import connections

    results: list[Any] = []

    def run() -> None:
        try:
            results.append(action())
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=60)
    assert results, "the other thread failed"
    return results[0]


def test_a_job_enqueued_while_the_job_ahead_of_it_ends_is_ready_once_it_commits():
    """The enqueue sees the lane's job and stores its own waiting; that job is acked before
    the enqueue commits, and its worker's promotion cannot see the uncommitted job. The
    enqueue's commit makes it ready (else it would wait for a maintenance round)."""
    record.using(ordering_key="lane").enqueue("ahead")
    with transaction.atomic():
        behind = record.using(ordering_key="lane").enqueue("behind")
        assert behind.status == "waiting"
        in_thread(lambda: run_burst(concurrency=1))
        assert Effect.objects.filter(label="ahead").exists()
    assert Job.objects.get(pk=behind.pk).status == "ready"


def test_a_job_enqueued_while_the_job_ahead_of_it_is_cancelled_is_ready_once_both_commit():
    """The cancel's transaction deletes the lane's first job; before it commits, another
    transaction enqueues into the lane (it still sees that job: waiting) and commits. The
    cancel's commit makes the new job ready."""
    ahead = record.using(ordering_key="lane").enqueue("ahead")
    with transaction.atomic():
        assert cancel(ahead.pk)
        behind = in_thread(lambda: record.using(ordering_key="lane").enqueue("behind"))
        assert behind.status == "waiting"
    assert Job.objects.get(pk=behind.pk).status == "ready"


def test_a_job_redriven_while_the_job_ahead_of_it_ends_is_ready_once_it_commits():
    poison.using(ordering_key="lane", max_attempts=1).enqueue("failing")
    run_burst(concurrency=1)
    record.using(ordering_key="lane").enqueue("ahead")
    with transaction.atomic():
        assert redrive(DeadLetter.objects.all()) == 1
        redriven = Job.objects.get(kind=poison.kind)
        assert redriven.status == "waiting"
        in_thread(lambda: run_burst(concurrency=1))
    assert Job.objects.get(pk=redriven.pk).status == "ready"


def test_maintenance_makes_a_stalled_lane_move_on(queue_cursor):
    first = record.using(ordering_key="lane").enqueue("first")
    second = record.using(ordering_key="lane").enqueue("second")
    Job.objects.filter(pk=first.pk).delete()  # its worker crashed between ack and promotion
    queue_cursor.execute(sql.lanes.PROMOTE_STALLED_LANES, {"channel": sql.wake.WAKE_CHANNEL})
    assert queue_cursor.fetchone()[0] == 1
    assert Job.objects.get(pk=second.pk).status == "ready"


def test_a_batch_enqueued_into_an_empty_lane_has_one_ready_job():
    jobs = enqueue_many(
        [
            {"kind": record.kind, "payload": {"label": f"n{n}"}, "ordering_key": "lane"}
            for n in range(3)
        ]
        + [{"kind": record.kind, "payload": {"label": "alone"}, "ordering_key": "other"}]
    )
    expected = ["ready", "waiting", "waiting", "ready"]
    assert [Job.objects.get(pk=job.pk).status for job in jobs] == expected
    assert [job.status for job in jobs] == expected  # as returned


def test_postgresql_refuses_a_second_running_job_in_a_lane():
    from django.db import IntegrityError

    Job.objects.bulk_create(
        [
            Job(kind="x", ordering_key="lane", status="running", visibility_timeout=timedelta(1)),
        ]
    )
    with pytest.raises(IntegrityError, match="jobq_job_one_running_per_lane"):
        Job.objects.create(
            kind="x", ordering_key="lane", status="running", visibility_timeout=timedelta(1)
        )


# -- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["", "x" * 201, "nul\x00", 7])
def test_an_invalid_ordering_key_is_refused_at_enqueue_naming_it(key):
    with pytest.raises(ValueError, match="ordering_key"):
        enqueue(record.kind, {"label": "x"}, ordering_key=key)
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"concurrency_limit": 0}, "concurrency_limit must be 1 to"),
        ({"concurrency_limit": "3"}, "concurrency_limit must be an int"),
        ({"rate_limit": "fast"}, "rate_limit: a rate limit is written <count>/<window>"),
        ({"rate_limit": "0/s"}, "rate_limit"),
    ],
)
def test_invalid_limits_on_a_job_are_refused_naming_the_option(options, message):
    with pytest.raises(ValueError, match=message):
        job(name="tests.flow.invalid", **options)(lambda: None)


@pytest.mark.parametrize(
    ("queues", "message"),
    [
        ({"flow": {"CONCURRENCY_LIMIT": 0}}, "JOBQ['QUEUES']['flow']['CONCURRENCY_LIMIT']"),
        ({"flow": {"RATE_LIMIT": "10 per second"}}, "JOBQ['QUEUES']['flow']['RATE_LIMIT']"),
        ({"flow": {"LIMIT": 3}}, "unknown key"),
        ({"not a queue!": {}}, "not a queue name"),
        ({"flow": 3}, "must be a dict"),
        ([], "JOBQ['QUEUES'] must be a dict"),
    ],
)
def test_invalid_queue_limits_in_the_settings_are_check_error_e021(queues, message):
    problems = conf.validate({"QUEUES": queues})
    assert [check_id for check_id, _ in problems] == ["django_jobq.E021"]
    assert message in problems[0][1]


def test_run_jobs_runs_a_lane_in_order_as_a_worker_does():
    from django_jobq.testing import run_jobs

    for n in range(3):
        record.using(ordering_key="lane").enqueue(f"n{n}")
    ran = run_jobs()
    assert [job.payload["label"] for job in ran] == ["n0", "n1", "n2"]
    assert list(Effect.objects.order_by("id").values_list("label", flat=True)) == ["n0", "n1", "n2"]


def test_two_ready_jobs_of_one_lane_are_never_leased_together(queue_cursor):
    # As two transactions that enqueued into an empty lane at once leave them.
    first = record.using(ordering_key="lane").enqueue("first")
    second = record.using(ordering_key="lane").enqueue("second")
    Job.objects.filter(pk=second.pk).update(status="ready")
    claimed = claims.claim(queue_cursor, worker_id="w", limit=10)
    assert [job.id for job in claimed] == [first.pk]
    assert claims.claim(queue_cursor, worker_id="w", limit=10) == []  # its lane is busy


def test_a_job_of_an_unlimited_queue_is_handed_on_before_the_limited_claim_after_its_claim(
    workers, monkeypatch, connect
):
    """A worker that also serves a quiet limited queue claims its limited jobs after the
    plain claim, and hands the plain claim's jobs on first: the limited claim's
    statements add nothing to their pickup."""
    Queue.objects.create(name="tuned", concurrency_limit=5)  # limited, and no job in it
    started = threading.Event()
    calls: list[bool | None] = []  # per limited claim: was the plain job's handler started?
    claim_limited = limited_claims.claim_limited

    def claim_limited_and_see(*args: Any, **kwargs: Any) -> limited_claims.LimitedClaim:
        claimed = Job.objects.filter(status="running").exists()  # the plain job was claimed
        connection.close()  # the main loop's thread: Django's connection is this test's
        calls.append(started.wait(timeout=2) if claimed else None)
        return claim_limited(*args, **kwargs)

    def job_started(sender: Any, **kwargs: Any) -> None:
        started.set()

    monkeypatch.setattr(limited_claims, "claim_limited", claim_limited_and_see)
    signals.job_started.connect(job_started)
    # The job runs until the lock is released: every limited claim until then sees it running
    # (its ack cannot come first, however the host schedules the worker's threads).
    holder = connect()
    holder.execute("SELECT pg_advisory_lock(%s)", [HANDED_ON_LOCK])
    try:
        workers(concurrency=2)
        # Two turns: the first one's limited claim found nothing, so the second one's (and
        # every next one's) comes after the plain claim.
        wait_until(lambda: len(calls) >= 2, what="the worker's first limited claims")
        wait_for_lock.enqueue(lock_id=HANDED_ON_LOCK, label="unlimited")
        wait_until(
            lambda: any(seen is not None for seen in calls),
            what="a limited claim while the job runs",
        )
    finally:
        holder.execute("SELECT pg_advisory_unlock(%s)", [HANDED_ON_LOCK])
        signals.job_started.disconnect(job_started)
    wait_until(lambda: Effect.objects.filter(label="unlimited").exists(), what="the job")

    after_the_claim = [seen for seen in calls if seen is not None]
    assert after_the_claim and all(after_the_claim)


#: The advisory lock the job of the test above waits for.
HANDED_ON_LOCK = 220_001


@pytest.mark.parametrize("limit", [5, 1000], ids=["near", "far from binding"])
def test_a_quiet_limited_queue_costs_the_others_no_claims_until_a_limited_job_comes(
    limit, workers, monkeypatch
):
    """Once a limited claim found nothing, jobs of unlimited queues are claimed without a
    limited claim after theirs (until the poll interval, here long, passes); a job of the
    limited queue, announced, is claimed at once. (A worker that serves kinds with limits
    runs a limited claim after each announced job: such a job may come in any queue.)"""
    Queue.objects.create(name="tuned", concurrency_limit=limit)
    calls: list[int] = []
    claim_limited = limited_claims.claim_limited

    def counted(*args: Any, **kwargs: Any) -> limited_claims.LimitedClaim:
        calls.append(1)
        return claim_limited(*args, **kwargs)

    monkeypatch.setattr(limited_claims, "claim_limited", counted)
    with monkeypatch.context() as only:  # a worker that serves no kind with a limit
        only.setattr(registry, "claimable_kinds", lambda: [record.kind])
        workers(concurrency=2, poll_interval=60)
    wait_until(lambda: calls, what="the worker's first limited claim")
    for n in range(5):
        label = f"plain {n}"
        record.enqueue(label)
        wait_until(Effect.objects.filter(label=label).exists, what=label)
    assert len(calls) == 1

    record.using(queue="tuned").enqueue("limited queue")
    # Announced: claimed at once, not a poll interval (a minute) later.
    wait_until(lambda: Effect.objects.filter(label="limited queue").exists(), what="it")


def test_a_job_a_kind_limit_binds_is_claimed_at_once_in_any_queue(workers):
    """Kind limits bind jobs of any queue: a worker that serves such a kind runs a limited
    claim after the plain one whenever a job is announced, however quiet its limits were."""
    workers(concurrency=2, poll_interval=60)
    record.enqueue("first")  # the first turns: a limited claim finds nothing
    wait_until(lambda: Effect.objects.filter(label="first").exists(), what="the first job")
    limited_step.using(queue="default").enqueue("limited kind")  # concurrency_limit=2
    wait_until(lambda: Run.objects.filter(label="limited kind").exists(), what="it")


def test_a_late_start_whose_statement_was_slow_moves_again(connect):
    """A late start's row counts a start within twice the margin of its stamp; a
    statement whose round trip took longer than a margin (here it waited for a lock on the
    claim's row, held three margins) cannot promise that, so the start moves again, out of
    the row just written into a newer one."""
    Queue.objects.create(name="tuned", rate_limit="100/5s")  # a margin of 0.1 s
    record.using(queue="tuned").enqueue("late")
    (job,) = (result := claim_limited_now(connect(), limit=1)).jobs
    (claim_row,) = result.rated[job.id].rows
    holder = connect(autocommit=False)
    holder.execute("SELECT 1 FROM jobq_limit_start WHERE id = %s FOR UPDATE", [claim_row])
    timer = threading.Timer(0.3, holder.commit)  # the delay under test, not a sync
    timer.start()
    try:
        limited_claims.confirm_start(result.rated[job.id])
    finally:
        timer.join()

    claimed, moved, again = LimitStart.objects.order_by("id")
    assert (claimed.id, claimed.starts) == (claim_row, 0)
    assert (moved.starts, again.starts) == (0, 1)  # moved once, then again
    assert again.started_at > moved.started_at
