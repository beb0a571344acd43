"""Orphaned leases are reclaimed promptly: by a burst worker started as a recovery run, and
by a worker restarted with its predecessor's ``--worker-id``. Real worker processes, a
real PostgreSQL; the crashed predecessor is a job row leased by SQL under its worker id,
its lease a few seconds from lapsing."""

from datetime import timedelta

import pytest
from django.db import connection

from django_jobq.models import Job
from tests.conftest import wait_until
from tests.testapp.jobs import small_record_attempt
from tests.testapp.models import Effect

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

TIMEOUT = 60  # seconds; a generous bound so a hung worker fails the test
#: Longer than the tests: a worker that wakes by its poll interval never gets there.
POLL_INTERVAL = "600"


def orphan(label, *, worker_id, lapses_in):
    """A job leased (attempt 1) by a worker that crashed: its lease lapses in ``lapses_in``
    seconds, on the database clock. Returns the job's id and that deadline."""
    job = small_record_attempt.using(visibility_timeout=2).enqueue(label=label)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE jobq_job SET status = 'running', attempts = 1, worker_id = %s, "
            "started_at = now(), lease_deadline = clock_timestamp() + make_interval(secs => %s) "
            "WHERE id = %s RETURNING lease_deadline",
            [worker_id, lapses_in, job.pk],
        )
        ((deadline,),) = cursor.fetchall()
    return job.pk, deadline


def test_a_burst_worker_waits_for_a_crashed_workers_lease_then_reclaims_and_runs_it(manage):
    job_id, _ = orphan("orphan", worker_id="crashed", lapses_in=3)
    scheduled = small_record_attempt.using(delay=3600).enqueue(label="scheduled")

    sweeper = manage(
        "jobq_worker", "--queue", "small", "--burst", "--poll-interval", POLL_INTERVAL, "-v", "2"
    )
    _, stderr = sweeper.communicate(timeout=TIMEOUT)

    assert sweeper.returncode == 0, stderr
    assert list(Effect.objects.values_list("label", flat=True)) == ["orphan attempt 2"]
    assert not Job.objects.filter(pk=job_id).exists()
    # A job scheduled for later does not keep a burst worker: it is left for the next run.
    assert Job.objects.get(pk=scheduled.pk).status == "ready"


def test_a_worker_restarted_with_the_same_id_reclaims_its_predecessors_lapsed_lease(manage):
    """The restarted worker wakes when the predecessor's lease lapses, as another worker
    would, not at its next poll (600 s) or its next registration beat (10 s)."""
    job_id, deadline = orphan("predecessor's", worker_id="web-1", lapses_in=4)

    worker = manage(
        "jobq_worker", "--queue", "small", "--worker-id", "web-1", "--poll-interval", POLL_INTERVAL
    )
    effect = wait_until(
        lambda: Effect.objects.filter(label="predecessor's attempt 2").first(),
        timeout=TIMEOUT,
        what="the restarted worker to reclaim and run the job",
    )
    worker.terminate()
    _, stderr = worker.communicate(timeout=TIMEOUT)

    assert worker.returncode == 0, stderr
    assert not Job.objects.filter(pk=job_id).exists()
    # Slack for a busy host; a worker waking at its next beat would be about 6 s late.
    assert effect.created_at - deadline < timedelta(seconds=2.5), (effect.created_at, deadline)
