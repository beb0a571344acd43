"""Jobs no live worker can run: they wait (shown by jobq_stats, the metric, the dashboard),
then the maintenance sweep makes them "unknown kind" dead letters naming the kinds the
queue's workers know. A queue no live worker serves is an outage: nothing is swept."""

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from django_jobq import metrics, stats
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


def test_the_sweep_dead_letters_after_the_grace_naming_the_kinds_the_queue_knows(connect):
    register("old", kinds=[OLD, "kinds.another"])
    late = jobs_of(NEW, 3, waited=120)
    recent = jobs_of(NEW, 2, waited=5)
    served = jobs_of(OLD, 1, waited=120)
    before = metrics.JOBS_DEAD_LETTERED.labels("kinds", NEW, "unknown kind")._value.get()

    assert Maintenance().sweep_unknown_kinds(connect(), grace=60) == 3

    dead = DeadLetter.objects.order_by("job_id")
    assert [d.job_id for d in dead] == [job.pk for job in late]
    assert {d.reason for d in dead} == {
        "unknown kind: no live worker of queue kinds has registered kinds.new_handler "
        "(waited over 60 s); the kinds they know: kinds.another, kinds.old_handler"
    }
    assert {d.attempts for d in dead} == {0}  # none ran
    remaining = set(Job.objects.values_list("pk", flat=True))
    assert remaining == {job.pk for job in recent + served}
    after = metrics.JOBS_DEAD_LETTERED.labels("kinds", NEW, "unknown kind")._value.get()
    assert after - before == 3


def test_the_sweep_leaves_jobs_alone_while_no_live_worker_serves_their_queue(connect):
    jobs_of(NEW, 2, waited=3600)
    register("stale", kinds=[OLD], seen_ago=stats.STALE_AFTER + 5)
    assert Maintenance().sweep_unknown_kinds(connect(), grace=60) == 0
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
        sql.DEAD_LETTER_UNKNOWN_KINDS,
        {
            "stale_after": stats.STALE_AFTER,
            "queue": [overdue.queue],
            "kind": [overdue.kind],
            "reason": ["unknown kind: test"],
            "grace": 60,
            "limit": 100,
            "ran": True,
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
    assert Maintenance().sweep_unknown_kinds(sweeper, grace=60) == 1
    assert list(DeadLetter.objects.values_list("job_id", flat=True)) == [second.pk]
    holder.rollback()
    assert Maintenance().sweep_unknown_kinds(sweeper, grace=60) == 1


def test_a_task_of_an_unknown_kind_fails_its_result_when_swept(connect):
    result = tasks.add.using(queue_name="tasks").enqueue(1, 2)
    Job.objects.update(created_at=timezone.now() - timedelta(hours=1))
    Job.objects.update(run_at=timezone.now() - timedelta(hours=1))
    register("old", kinds=[OLD], queues=["tasks"])
    assert Maintenance().sweep_unknown_kinds(connect(), grace=60) == 1
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
