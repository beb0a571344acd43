"""A mixed fleet, with real ``manage.py jobq_worker`` processes: an old release's worker and
a new one's (which has the kind ``kinds.new_release``) serve one queue. The old worker never
claims the new kind; without the new worker its jobs wait (jobq_stats --check says so), and
after the grace they become dead letters naming the kinds the queue's workers know; a
redrive once the new worker is back runs them."""

import signal
from datetime import timedelta

import pytest
from django.utils import timezone

from django_jobq import operations
from django_jobq.models import DeadLetter, Job, WorkerProcess
from tests.conftest import wait_until
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)

KIND = "kinds.new_release"
QUEUE = "kinds"
WORKER = ("jobq_worker", "--queue", QUEUE, "--poll-interval", "0.1", "--concurrency", "4")


def enqueue_new_kind(count, prefix):
    """Jobs of the new kind, written as a web process of the new release would (this test
    process has not registered the kind, as an old web process would not have)."""
    Job.objects.bulk_create(
        Job(
            queue=QUEUE,
            kind=KIND,
            payload={"label": f"{prefix}-{n}"},
            max_attempts=3,
            visibility_timeout=timedelta(seconds=30),
            run_at=timezone.now() - timedelta(seconds=1),
        )
        for n in range(count)
    )


def start(manage, *, new_release=False, **env):
    process = manage(*WORKER, **({"JOBQ_TEST_NEW_RELEASE": "1"} if new_release else {}), **env)
    wait_until(
        lambda: WorkerProcess.objects.filter(pid=process.pid).exists(),
        timeout=60,
        what=f"worker {process.pid} to register",
    )
    return process


def stop(process):
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=60)
    assert process.returncode == 0


def ran_by():
    """{pid: jobs run} from the handler's Effect rows."""
    counts: dict[int, int] = {}
    for label in Effect.objects.values_list("label", flat=True):
        pid = int(label.rsplit(" by ", 1)[1])
        counts[pid] = counts.get(pid, 0) + 1
    return counts


def test_a_mixed_fleet_runs_each_kind_on_a_worker_that_has_it(manage):
    old = start(manage)
    new = start(manage, new_release=True)
    old_row, new_row = (WorkerProcess.objects.get(pid=p.pid) for p in (old, new))
    assert KIND in new_row.kinds and KIND not in old_row.kinds
    assert old_row.kinds_fingerprint != new_row.kinds_fingerprint

    # 200 jobs of the new kind: all run by the new worker, none dead-lettered by the old.
    enqueue_new_kind(200, "first")
    wait_until(lambda: Effect.objects.count() == 200, timeout=120, what="200 jobs to run")
    assert ran_by() == {new.pid: 200}
    assert not DeadLetter.objects.exists()

    # The new worker stops: the next jobs wait, and jobq_stats --check says so (a warning,
    # not a failed check).
    stop(new)
    enqueue_new_kind(50, "second")
    stats = manage("jobq_stats", "--check")
    out, err = stats.communicate(timeout=60)
    assert stats.returncode == 0, err
    assert KIND in out  # the table of jobs waiting for a worker
    assert f"warning: 50 jobs of kind {KIND} wait for a worker that can run them" in err
    assert Job.objects.filter(kind=KIND, status=Job.Status.READY).count() == 50
    assert not DeadLetter.objects.exists()

    # The old release's worker, with a grace of 1 s: they become dead letters naming the
    # kinds its queue's workers know.
    stop(old)
    short = start(manage, JOBQ_TEST_UNKNOWN_KIND_GRACE="1")
    wait_until(lambda: DeadLetter.objects.count() == 50, timeout=60, what="50 dead letters")
    reasons = set(DeadLetter.objects.values_list("reason", flat=True))
    assert len(reasons) == 1
    (reason,) = reasons
    assert reason.startswith(f"unknown kind: no live worker of queue {QUEUE} has registered {KIND}")
    # The kinds the old worker knows, in order, as many as the reason's 500 characters hold.
    assert f"the kinds they know: {', '.join(old_row.kinds[:2])}, " in reason
    assert len(reason) <= 500
    assert not Job.objects.exists()

    # The new worker is back: a redrive runs them, on it.
    back = start(manage, new_release=True)
    assert operations.redrive(list(DeadLetter.objects.values_list("id", flat=True))) == 50
    wait_until(lambda: Effect.objects.count() == 250, timeout=120, what="the redriven jobs")
    assert ran_by() == {new.pid: 200, back.pid: 50}
    assert not DeadLetter.objects.exists()
    stop(short)
    stop(back)
