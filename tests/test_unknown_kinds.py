"""Jobs no live worker can run: they wait (shown by jobq_stats, the metric, the dashboard),
then the maintenance sweep makes them "unknown kind" dead letters naming the kinds the
queue's workers know. A queue no live worker serves is an outage: nothing is swept."""

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone
from prometheus_client import REGISTRY

from django_jobq import stats
from django_jobq.models import DeadLetter, Job, StoredTaskResult, WorkerProcess
from django_jobq.worker.maintenance import Maintenance
from tests.factories import JobFactory
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

OLD = "kinds.old_handler"
NEW = "kinds.new_handler"


def register(worker_id, *, kinds, queues=("kinds",), seen_ago=0):
    WorkerProcess.objects.create(
        worker_id=worker_id,
        host="h",
        pid=1,
        concurrency=1,
        queues=None if queues is None else list(queues),
        kinds=sorted(kinds),
        last_seen=timezone.now() - timedelta(seconds=seen_ago),
    )


def waiting():
    with connection.cursor() as cursor:
        return [(w.queue, w.kind, w.jobs, w.known) for w in stats.waiting_kinds(cursor)]


def jobs_of(kind, count, *, queue="kinds", waited=0, **fields):
    due = timezone.now() - timedelta(seconds=waited)
    fields = {"run_at": due, "created_at": due, **fields}
    return [JobFactory(queue=queue, kind=kind, **fields) for _ in range(count)]


class Clock:
    """A simulated ``time.monotonic()`` for :class:`Maintenance`."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def sweep(conn, grace=60):
    """What a worker's sweeps do over one grace: look (the grace starts), then look again
    a whole grace later, within two sweep intervals of each look. Returns the second
    sweep's count (the first dead-letters nothing)."""
    clock = Clock()
    maintenance = Maintenance(clock=clock)
    assert maintenance.sweep_unknown_kinds(conn, grace) == 0  # seen waiting: the grace starts
    for _ in range(4):
        clock.now += grace / 4  # one sweep interval
        dead = maintenance.sweep_unknown_kinds(conn, grace)
        if dead or clock.now - 1000.0 >= grace:
            return dead
    return dead


def test_jobs_wait_for_a_worker_only_while_live_workers_of_their_queue_lack_the_kind():
    jobs_of(NEW, 3)
    jobs_of(OLD, 2)
    jobs_of(NEW, 1, run_at=timezone.now() + timedelta(hours=1))  # not due: not waiting
    assert waiting() == []  # no live worker serves the queue: an outage, not a kind
    register("old", kinds=[OLD])
    register("stale-new", kinds=[NEW], seen_ago=stats.STALE_AFTER + 5)  # does not count
    register("other-queue", kinds=[NEW], queues=["elsewhere"])  # serves another queue
    assert waiting() == [("kinds", NEW, 3, [OLD])]
    register("new", kinds=[NEW, OLD], queues=None)  # every queue, the new kind: it can run them
    assert waiting() == []


def dead_lettered_as_unknown() -> float:
    """``jobq_jobs_dead_lettered_total`` of queue kinds, kind NEW, reason "unknown kind"."""
    labels = {"queue": "kinds", "kind": NEW, "reason": "unknown kind"}
    return REGISTRY.get_sample_value("jobq_jobs_dead_lettered_total", labels) or 0.0


def test_the_sweep_dead_letters_after_the_grace_naming_the_kinds_the_queue_knows(connect):
    register("old", kinds=[OLD, "kinds.another"])
    late = jobs_of(NEW, 3, waited=120)
    recent = jobs_of(NEW, 2, waited=5)
    served = jobs_of(OLD, 1, waited=120)
    before = dead_lettered_as_unknown()

    assert sweep(connect()) == 3

    dead = DeadLetter.objects.order_by("job_id")
    assert [d.job_id for d in dead] == [job.pk for job in late]
    assert {d.reason for d in dead} == {
        "unknown kind: no live worker of queue kinds has registered kinds.new_handler "
        "(waited over 60 s); the kinds they know: kinds.another, kinds.old_handler"
    }
    assert {d.attempts for d in dead} == {0}  # none ran
    remaining = set(Job.objects.values_list("pk", flat=True))
    assert remaining == {job.pk for job in recent + served}
    after = dead_lettered_as_unknown()
    assert after - before == 3


def test_the_sweep_leaves_jobs_alone_while_no_live_worker_serves_their_queue(connect):
    jobs_of(NEW, 2, waited=3600)
    register("stale", kinds=[OLD], seen_ago=stats.STALE_AFTER + 5)
    assert sweep(connect()) == 0
    assert Job.objects.count() == 2 and not DeadLetter.objects.exists()


def test_the_sweep_rechecks_the_fleet_in_its_own_statement(connect):
    # The jobs were overdue when read, but a worker with the kind registered before the
    # dead-letter statement ran: nothing is dead-lettered.
    register("old", kinds=[OLD])
    jobs_of(NEW, 2, waited=3600)
    conn = connect()
    with connection.cursor() as cursor:
        (overdue,) = stats.waiting_kinds(cursor)
    register("new", kinds=[NEW])
    from django_jobq import sql

    rows = conn.execute(
        sql.maintenance.DEAD_LETTER_UNKNOWN_KINDS,
        {
            "stale_after": stats.STALE_AFTER,
            "queue": [overdue.queue],
            "kind": [overdue.kind],
            "reason": ["unknown kind: test"],
            "grace": 60,
            "limit": 100,
            "error": "",
            "traceback": "",
        },
    ).fetchall()
    assert rows == [] and Job.objects.count() == 2


def test_the_sweep_skips_a_locked_row_and_takes_it_next_round(connect):
    register("old", kinds=[OLD])
    first, second = jobs_of(NEW, 2, waited=3600)
    holder = connect(autocommit=False)
    holder.execute("SELECT 1 FROM jobq_job WHERE id = %s FOR UPDATE", [first.pk])
    sweeper = connect()
    sweeper.execute("SET lock_timeout = '100ms'")  # a wait for the holder would fail
    assert sweep(sweeper) == 1
    assert list(DeadLetter.objects.values_list("job_id", flat=True)) == [second.pk]
    holder.rollback()
    assert sweep(sweeper) == 1


def test_a_task_of_an_unknown_kind_fails_its_result_when_swept(connect):
    result = tasks.add.using(queue_name="tasks").enqueue(1, 2)
    Job.objects.update(created_at=timezone.now() - timedelta(hours=1))
    Job.objects.update(run_at=timezone.now() - timedelta(hours=1))
    register("old", kinds=[OLD], queues=["tasks"])
    assert sweep(connect()) == 1
    stored = StoredTaskResult.objects.get(pk=result.id)
    assert stored.status == "FAILED" and stored.finished_at is not None
    (error,) = stored.errors
    assert error["exception_class_path"] == "django_jobq.task_results.TaskNotRun"
    assert error["traceback"].startswith("unknown kind: no live worker of queue tasks")
    assert DeadLetter.objects.get().reason.startswith("unknown kind:")


def test_jobq_stats_check_warns_about_waiting_jobs_without_failing(capsys):
    register("old", kinds=[OLD])
    jobs_of(NEW, 4, waited=30)
    call_command("jobq_stats", "--check", "--max-oldest-ready-age", "3600")
    out, err = capsys.readouterr()
    assert "warning: 4 jobs of kind kinds.new_handler wait for a worker that can run them" in err
    assert "kinds.new_handler" in out and "kinds.old_handler" in out  # the waiting table
    assert "1 (" in out  # the worker's kinds: a count and its fingerprint


def test_the_grace_counts_from_the_first_sweep_that_saw_the_jobs_wait(connect):
    # A backlog far older than the grace: the new release's worker restarts (a gap of a few
    # seconds) and nothing is dead-lettered, since the grace starts when a sweep sees it.
    register("old", kinds=[OLD])
    new = WorkerProcess.objects.create(
        worker_id="new", host="h", pid=2, concurrency=1, queues=["kinds"], kinds=[NEW]
    )
    backlog = jobs_of(NEW, 3, waited=3600)
    clock = Clock()
    maintenance = Maintenance(clock=clock)
    conn = connect()
    assert maintenance.sweep_unknown_kinds(conn, grace=60) == 0  # served: nothing waits
    new.delete()  # the restart's gap
    clock.now += 15
    assert maintenance.sweep_unknown_kinds(conn, grace=60) == 0  # the grace starts here
    clock.now += 15
    assert maintenance.sweep_unknown_kinds(conn, grace=60) == 0
    register("new again", kinds=[NEW])  # back within the grace
    clock.now += 15
    assert maintenance.sweep_unknown_kinds(conn, grace=60) == 0  # served: the clock resets
    WorkerProcess.objects.filter(worker_id="new again").delete()  # gone for good
    for _ in range(4):
        clock.now += 15
        assert maintenance.sweep_unknown_kinds(conn, grace=60) == 0  # a new grace runs
    clock.now += 15
    assert maintenance.sweep_unknown_kinds(conn, grace=60) == len(backlog)


def test_a_sweep_that_stopped_looking_starts_the_grace_again(connect):
    # A worker that did not win the maintenance lock for a while has not watched: it may
    # have missed a worker with the kind coming and going. Its grace starts again.
    register("old", kinds=[OLD])
    jobs_of(NEW, 2, waited=3600)
    clock = Clock()
    maintenance = Maintenance(clock=clock)
    conn = connect()
    assert maintenance.sweep_unknown_kinds(conn, grace=60) == 0
    clock.now += 61  # more than two sweep intervals (15 s) without a look
    assert maintenance.sweep_unknown_kinds(conn, grace=60) == 0
    clock.now += 15
    assert maintenance.sweep_unknown_kinds(conn, grace=60) == 0


def test_a_worker_with_no_kinds_serves_no_queue(connect):
    # A misconfigured worker (its settings import no app's jobs module) would otherwise turn
    # every queue's outage into dead letters.
    register("empty", kinds=[], queues=None)
    jobs_of(NEW, 2, waited=3600)
    assert waiting() == []
    assert sweep(connect()) == 0
    assert Job.objects.count() == 2
