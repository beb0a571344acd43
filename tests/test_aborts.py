"""Aborting a running job (docs/flow-control.md ("Aborting a running job")), as a specification.

- ``abort(job_id)`` asks a *running* job to stop; a ready job is not aborted (cancel it).
- The worker's heartbeat returns the request, and the heartbeater looks for one between two
  heartbeats, every half heartbeat interval: the handler's ``ctx.abort_requested`` turns
  true, ``ctx.raise_if_aborted()`` raises ``Aborted``.
- Once the request is seen, an attempt that raises (anything) is a dead letter "aborted"
  at once, never retried; an attempt that returns is acked (the handler ignored the
  request and ran to completion). ``Aborted`` raised with no request seen is an ordinary
  failure.
- A job claimed with a request (a reclaim after its worker died) is dead-lettered unrun.
- A redriven "aborted" dead letter is a fresh job, without the request.

The proof the issue asks for runs real ``jobq_worker`` processes on a real PostgreSQL: a
running job stops within one heartbeat interval (a third of its visibility timeout) of the
request, sync and async.
"""

import dataclasses
import signal
import time

import pytest
from django.db import connection

from django_jobq import claims, enqueue, job, leases, operations, registry
from django_jobq.context import JobContext
from django_jobq.exceptions import Aborted, Retry
from django_jobq.models import DeadLetter, Job
from django_jobq.outcomes import Action
from django_jobq.worker.executor import execute, refusal
from django_jobq.worker.heartbeat import Heartbeater
from django_jobq.worker.held import HeldJob, HeldJobs
from tests.conftest import wait_until
from tests.testapp.jobs import hold_lock, ignore_abort, loop_until_aborted
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)

#: The visibility timeout of the abort tests' kinds (tests/testapp/jobs.py): heartbeats every
#: second, looks for an abort request every half second.
VISIBILITY_TIMEOUT = 3.0
HEARTBEAT_INTERVAL = VISIBILITY_TIMEOUT / 3
TIMEOUT = 60
LOCK = 78


def claim_one(cursor, kind):
    (claimed,) = claims.claim(cursor, worker_id="abort-tests", limit=1, kinds=[kind])
    return claimed


@pytest.fixture
def heartbeater():
    """A started heartbeater holding nothing: its ``extend_one`` backs ``ctx.heartbeat()``
    in the in-process tests, with the worker's own heartbeat statement."""
    beats = Heartbeater(HeldJobs(), worker_id="abort-tests")
    beats.start()
    yield beats
    beats.stop()


# -- the request ---------------------------------------------------------------------------


def test_abort_asks_a_running_job_and_leaves_a_ready_one_for_cancel(queue_cursor):
    running = enqueue("tests.testapp.jobs.record", {"label": "running"})
    claim_one(queue_cursor, "tests.testapp.jobs.record")
    ready = enqueue("tests.testapp.jobs.record", {"label": "ready"})

    assert operations.abort(running.pk) is True
    assert operations.abort(ready.pk) is False
    assert operations.abort(10**15) is False  # no such job

    running.refresh_from_db()
    ready.refresh_from_db()
    first_request = running.abort_requested_at
    assert first_request is not None
    assert (running.status, ready.status, ready.abort_requested_at) == ("running", "ready", None)
    # Asking again is harmless: still requested, the first request's time kept.
    assert operations.abort_many([running.pk, ready.pk, 10**15]) == 1
    running.refresh_from_db()
    assert running.abort_requested_at == first_request
    assert operations.abort_many([]) == 0
    # Cancelling a ready job is as it was.
    assert operations.cancel(ready.pk) is True
    assert operations.cancel(running.pk) is False
    assert list(Job.objects.values_list("pk", flat=True)) == [running.pk]


@pytest.mark.parametrize(
    ("operation", "value", "error", "message"),
    [
        (operations.abort, "12", TypeError, "job_id must be a job id (int), not '12'."),
        (operations.abort, True, TypeError, "job_id must be a job id (int), not True."),
        (operations.abort, 1.0, TypeError, "job_id must be a job id (int), not 1.0."),
        (operations.abort, 2**63, ValueError, "job_id must be a job id (a 64-bit integer)"),
        (operations.abort_many, "12", TypeError, "job_ids must be an iterable of job ids"),
        (operations.abort_many, 12, TypeError, "job_ids must be an iterable of job ids"),
        (
            operations.abort_many,
            [1, None],
            TypeError,
            "job_ids[1] must be a job id (int), not None.",
        ),
        (
            operations.abort_many,
            [1, False],
            TypeError,
            "job_ids[1] must be a job id (int), not False.",
        ),
    ],
    ids=["str", "bool", "float", "too big", "many: str", "many: int", "many: None", "many: bool"],
)
def test_bad_ids_are_refused_naming_the_argument(operation, value, error, message):
    with pytest.raises(error) as raised:
        operation(value)
    assert str(raised.value).startswith(message)


# -- what the worker reads -----------------------------------------------------------------


def test_the_heartbeat_returns_the_request_of_the_attempt_holding_the_lease(queue_cursor):
    enqueue("tests.testapp.jobs.record", {"label": "asked"})
    enqueue("tests.testapp.jobs.record", {"label": "not asked"})
    asked = claim_one(queue_cursor, "tests.testapp.jobs.record")
    not_asked = claim_one(queue_cursor, "tests.testapp.jobs.record")
    operations.abort(asked.id)

    extended = leases.heartbeat(queue_cursor, [asked.lease, not_asked.lease])
    assert set(extended) == {asked.id, not_asked.id}
    assert extended.abort_requested == {asked.id}
    assert leases.abort_requested(queue_cursor, [asked.lease, not_asked.lease]) == {asked.id}
    # Fenced: another attempt's lease sees nothing (its heartbeat is refused, as before).
    stale = leases.Lease(asked.id, asked.attempt + 1)
    assert leases.abort_requested(queue_cursor, [stale]) == frozenset()
    refused = leases.heartbeat(queue_cursor, [stale])
    assert (dict(refused), refused.abort_requested) == ({}, frozenset())


def test_a_lost_lease_is_lost_as_before_and_never_flagged(queue_cursor, heartbeater):
    enqueue("tests.testapp.jobs.record", {"label": "lost"})
    claimed = claim_one(queue_cursor, "tests.testapp.jobs.record")
    operations.abort(claimed.id)
    # This worker believes it holds an attempt that is no longer the job's.
    held = HeldJob(dataclasses.replace(claimed, attempt=claimed.attempt + 1))

    assert heartbeater.extend([held]) is False
    assert (held.lease_lost, held.abort_requested) == (True, False)
    heartbeater.look_for_aborts([held])
    assert held.abort_requested is False


# -- the verdict ---------------------------------------------------------------------------


def _run_in_process(queue_cursor, heartbeater, handler, **options):
    """Register ``handler`` (with a context), enqueue it, claim and execute it as a handler
    thread does; return ``(outcome, held)``."""
    with registry.isolated():
        definition = job(name="abort_tests.handler", takes_context=True, **options)(handler)
        definition.enqueue()
        held = HeldJob(claim_one(queue_cursor, "abort_tests.handler"))
        return execute(held, heartbeater.extend_one), held


def _abort_and_heartbeat(ctx: JobContext) -> None:
    """Ask for this job's abort, and heartbeat now: the worker's heartbeat sees it."""
    assert ctx.abort_requested is False
    assert operations.abort(ctx.job_id) is True
    assert ctx.heartbeat() is True
    assert ctx.abort_requested is True


def test_raise_if_aborted_makes_the_attempt_an_aborted_dead_letter_whatever_attempts_remain(
    queue_cursor, heartbeater
):
    def handler(ctx: JobContext) -> None:
        ctx.raise_if_aborted()  # nothing requested yet: returns
        _abort_and_heartbeat(ctx)
        ctx.raise_if_aborted()

    outcome, _ = _run_in_process(queue_cursor, heartbeater, handler, max_attempts=5)

    assert (outcome.action, outcome.reason) == (Action.DEAD_LETTER, DeadLetter.Reason.ABORTED)
    assert isinstance(outcome.exception, Aborted)
    assert outcome.error.startswith("Aborted: job ")
    assert outcome.error.endswith("attempt 1: abort requested by an operator")


@pytest.mark.parametrize(
    "raised", [RuntimeError("gave up"), Retry(delay=1)], ids=["an exception", "Retry"]
)
def test_any_exception_after_the_request_is_an_aborted_dead_letter_never_a_retry(
    queue_cursor, heartbeater, raised
):
    def handler(ctx: JobContext) -> None:
        _abort_and_heartbeat(ctx)
        raise raised

    outcome, _ = _run_in_process(queue_cursor, heartbeater, handler, max_attempts=5)

    assert (outcome.action, outcome.reason) == (Action.DEAD_LETTER, DeadLetter.Reason.ABORTED)
    assert outcome.exception is raised  # its error is the dead letter's last error


def test_aborted_raised_with_no_request_is_an_ordinary_failure(queue_cursor, heartbeater):
    def handler(ctx: JobContext) -> None:
        raise Aborted("the handler's own reason")

    outcome, _ = _run_in_process(queue_cursor, heartbeater, handler, max_attempts=5)

    assert outcome.action is Action.RETRY
    assert outcome.error == "Aborted: the handler's own reason"


def test_a_handler_that_ignores_the_request_and_returns_is_acked(queue_cursor, heartbeater):
    def handler(ctx: JobContext) -> str:
        _abort_and_heartbeat(ctx)
        return "done anyway"

    outcome, _ = _run_in_process(queue_cursor, heartbeater, handler)

    assert (outcome.action, outcome.returned) == (Action.ACK, "done anyway")


def test_a_job_seen_aborted_before_its_handler_started_is_not_run(queue_cursor, heartbeater):
    ran = []
    with registry.isolated():
        definition = job(name="abort_tests.prefetched")(lambda: ran.append(True))
        definition.enqueue()
        held = HeldJob(claim_one(queue_cursor, "abort_tests.prefetched"))
        held.abort_seen()  # a heartbeat saw the request while it waited for a handler thread
        outcome = execute(held, heartbeater.extend_one)

    assert (outcome.action, outcome.reason, outcome.ran) == (
        Action.DEAD_LETTER,
        DeadLetter.Reason.ABORTED,
        False,
    )
    assert "before attempt 1 started; it was not run" in outcome.error
    assert ran == []


def test_a_job_claimed_with_a_request_is_refused(queue_cursor):
    enqueue("tests.testapp.jobs.record", {"label": "asked"})
    claimed = claim_one(queue_cursor, "tests.testapp.jobs.record")
    operations.abort(claimed.id)
    # As a reclaim after its worker died: the lease lapsed, another claim takes it.
    queue_cursor.execute(
        "UPDATE jobq_job SET lease_deadline = now() - interval '1 second' WHERE id = %s",
        [claimed.id],
    )
    reclaimed = claim_one(queue_cursor, "tests.testapp.jobs.record")
    assert (reclaimed.id, reclaimed.attempt, reclaimed.abort_requested) == (claimed.id, 2, True)

    refused = refusal(reclaimed)

    assert refused is not None
    assert (refused.action, refused.reason, refused.ran) == (
        Action.DEAD_LETTER,
        DeadLetter.Reason.ABORTED,
        False,
    )
    assert refused.error.endswith("attempt 2 was not run")


# -- real worker processes -----------------------------------------------------------------


def start_worker(manage, queue, **env):
    return manage("jobq_worker", "--queue", queue, "--poll-interval", "0.1", **env)


def stop(worker):
    worker.send_signal(signal.SIGTERM)
    _, stderr = worker.communicate(timeout=TIMEOUT)
    assert worker.returncode == 0, stderr
    return stderr


def effect(label):
    return Effect.objects.filter(label=label).exists()


def dead_letter_of(job_id):
    return DeadLetter.objects.filter(job_id=job_id).first()


def abort_and_time_the_dead_letter(job_id):
    """Request the abort of ``job_id``; return the dead letter and the seconds from the
    request to the dead letter's commit, as the test sees it (polling every 20 ms)."""
    requested = time.monotonic()
    assert operations.abort(job_id) is True
    dead = wait_until(lambda: dead_letter_of(job_id), what="the aborted dead letter")
    return dead, time.monotonic() - requested


@pytest.mark.acceptance
def test_a_running_job_stops_within_one_heartbeat_interval_of_the_request(manage):
    worker = start_worker(manage, "aborts")
    latencies = []
    # Requested as soon as the handler runs, and just after a heartbeat (the worst moment
    # for a worker that would read requests only with its heartbeats).
    for n, moment in enumerate(["at the start", "after a heartbeat"] * 2):
        job_row = loop_until_aborted.enqueue(label=f"{moment} {n}")
        wait_until(lambda: effect(f"{moment} {n} started attempt 1"), what="the handler to start")  # noqa: B023
        if moment == "after a heartbeat":
            first = Job.objects.get(pk=job_row.pk).lease_deadline
            wait_until(
                lambda: Job.objects.get(pk=job_row.pk).lease_deadline != first,  # noqa: B023
                what="a heartbeat",
            )
        dead, latency = abort_and_time_the_dead_letter(job_row.pk)
        latencies.append(latency)
        assert (dead.reason, dead.attempts, dead.max_attempts) == ("aborted", 1, 5)
        assert dead.last_error.endswith("attempt 1: abort requested by an operator")
        assert "raise_if_aborted" in dead.traceback
    stderr = stop(worker)

    assert max(latencies) < HEARTBEAT_INTERVAL, latencies
    print(f"abort latencies (s): {[round(latency, 3) for latency in latencies]}")
    assert not Job.objects.exists()
    assert "abort requested; its handler is told" in stderr


@pytest.mark.acceptance
def test_a_handler_that_ignores_the_request_runs_to_completion_and_is_acked(manage):
    worker = start_worker(manage, "aborts")
    job_row = ignore_abort.enqueue(label="stubborn")
    wait_until(lambda: effect("stubborn started"), what="the handler to start")

    assert operations.abort(job_row.pk) is True
    wait_until(lambda: not Job.objects.filter(pk=job_row.pk).exists(), what="the ack")
    stop(worker)

    assert effect("stubborn finished, abort_requested=True")
    assert not DeadLetter.objects.exists()


@pytest.mark.acceptance
def test_a_redriven_aborted_dead_letter_runs_again_without_the_request(manage):
    worker = start_worker(manage, "aborts")
    job_row = loop_until_aborted.enqueue(label="again")
    wait_until(lambda: effect("again started attempt 1"), what="the handler to start")
    dead, _ = abort_and_time_the_dead_letter(job_row.pk)

    new_id = operations.redrive_one(dead.pk)

    assert new_id is not None
    fresh = Job.objects.get(pk=new_id)
    assert (fresh.abort_requested_at, fresh.attempts) == (None, 0)
    # It runs (and is not refused as aborted), then can be aborted again.
    wait_until(lambda: Effect.objects.filter(label="again started attempt 1").count() == 2)
    dead_again, _ = abort_and_time_the_dead_letter(new_id)
    assert dead_again.reason == DeadLetter.Reason.ABORTED
    stop(worker)


def handlers_waiting():
    """How many ``hold_lock`` handlers (their connections) of this test's database wait for
    ``LOCK``. A killed worker's connection goes on waiting: PostgreSQL sees its client gone
    only once the lock is granted."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
            "AND objid = %s AND database = (SELECT oid FROM pg_database "
            "WHERE datname = current_database())",
            [LOCK],
        )
        return cursor.fetchone()[0]


@pytest.mark.acceptance
def test_a_job_whose_worker_died_after_the_request_is_dead_lettered_without_running(manage):
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s)", [LOCK])
    try:
        job_row = hold_lock.using(visibility_timeout=1.5).enqueue(lock_id=LOCK, label="orphan")
        first = start_worker(manage, "leases")
        wait_until(lambda: handlers_waiting() == 1, what="the handler to start")
        first.send_signal(signal.SIGKILL)  # dies before any heartbeat sees the request
        first.wait(TIMEOUT)
        assert operations.abort(job_row.pk) is True  # still running: its lease has not lapsed

        second = start_worker(manage, "leases")
        dead = wait_until(lambda: dead_letter_of(job_row.pk), what="the reclaim's dead letter")
        assert handlers_waiting() == 1  # the dead worker's: attempt 2 never started its handler
        stop(second)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock_all()")

    # attempts counts the attempts that ran: the killed one; the reclaim's did not run.
    assert (dead.reason, dead.attempts) == (DeadLetter.Reason.ABORTED, 1)
    assert dead.last_error.endswith("attempt 2 was not run")
    assert not Effect.objects.exists()


@pytest.mark.acceptance
def test_an_async_handlers_task_is_cancelled_within_one_heartbeat_interval(manage):
    worker = start_worker(manage, "async", JOBQ_TEST_ASYNC_JOBS="1")
    # By name (the async kinds are registered only in the worker), with the kind's options.
    job_row = enqueue(
        "async.until_aborted",
        {"label": "awaiting"},
        queue="async",
        visibility_timeout=VISIBILITY_TIMEOUT,
    )
    wait_until(lambda: effect("awaiting started"), what="the handler to start")

    dead, latency = abort_and_time_the_dead_letter(job_row.pk)
    stderr = stop(worker)

    assert latency < HEARTBEAT_INTERVAL, (latency, stderr)
    print(f"async abort latency (s): {latency:.3f}")
    assert dead.reason == DeadLetter.Reason.ABORTED
    assert dead.last_error.endswith("abort requested by an operator; the task was cancelled")
    assert effect("awaiting cancelled, abort_requested=True")
    assert not effect("awaiting went on")
