"""factory-boy factories for rows the tests need to exist already (e.g. a job of a kind
no worker knows, or a dead letter), without going through enqueue."""

from datetime import timedelta

import factory
from django.utils import timezone

from django_jobq.models import DeadLetter, Job
from django_jobq.registry import kinds_fingerprint


class JobFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Job

    queue = "default"
    kind = "tests.testapp.jobs.record"
    payload = factory.Sequence(lambda n: {"label": f"job-{n}"})
    priority = 0
    status = Job.Status.READY
    run_at = factory.LazyFunction(timezone.now)
    attempts = 0
    max_attempts = 5
    visibility_timeout = timedelta(seconds=30)


class DeadLetterFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = DeadLetter

    job_id = factory.Sequence(lambda n: 1_000_000 + n)
    queue = "default"
    kind = "tests.testapp.jobs.always_fails"
    payload = factory.LazyFunction(dict)
    attempts = 2
    max_attempts = 2
    visibility_timeout = timedelta(seconds=30)
    created_at = factory.LazyFunction(timezone.now)
    reason = DeadLetter.Reason.MAX_ATTEMPTS_EXCEEDED
    last_error = "RuntimeError: boom"


def database_now():
    """The database's ``now()``: inside a test's transaction (``django_db`` without
    ``transaction=True``) it stays the same for the whole test, as the statistics' windows
    see it, so tests that place rows in minutes cannot straddle a minute boundary."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def waiting_job(seconds, *, now=None, **fields):
    """A ready job that has been claimable for ``seconds`` as of ``now`` (default: the
    database's): its ``run_at`` and ``created_at`` both that long ago."""
    moment = (now or database_now()) - timedelta(seconds=seconds)
    job = JobFactory(run_at=moment, **fields)
    Job.objects.filter(pk=job.pk).update(created_at=moment)
    return job


#: The kinds the scene's workers have registered (all of the scene's jobs).
SCENE_KINDS = [
    "shop.jobs.award_loyalty_points",
    "shop.jobs.generate_invoice",
    "shop.jobs.notify_order_webhook",
    "shop.jobs.send_reminder",
    "shop.jobs.send_welcome_email",
]


def dashboard_scene(*, now=None, kind="shop.jobs.award_loyalty_points"):
    """Three queues with an hour of history, as of ``now`` (default: the database's): a
    healthy one (``default``), one whose oldest job has waited 13 minutes (``emails``: a
    stuck dependency), one with failures (``webhooks``); 5 dead letters of ``kind`` and 2 of
    webhooks; two workers, one stale. The docs' screenshot and ``jobq_stats`` example."""
    from django_jobq.models import OutcomeRollup, QueueSample, WorkerProcess

    now = now or database_now()
    minute = now.replace(second=0, microsecond=0)
    buckets = [0] * 19
    buckets[6], buckets[7] = 40, 20  # (0.25, 0.5] and (0.5, 1] seconds
    for ago in range(1, 61):
        at = minute - timedelta(minutes=ago)
        OutcomeRollup.objects.create(
            queue="default",
            kind="shop.jobs.generate_invoice",
            minute=at,
            succeeded=120 + (ago * 7) % 40,
            duration_buckets=buckets,
        )
        OutcomeRollup.objects.create(
            queue="webhooks",
            kind="shop.jobs.notify_order_webhook",
            minute=at,
            succeeded=30 + ago % 12,
            retried=6 if 20 <= ago <= 28 else ago % 2,
            dead_lettered=1 if ago in (22, 25) else 0,
            duration_buckets=buckets,
        )
        for queue, ready, age in (
            ("default", 3 + ago % 5, 0.4),
            ("emails", max(0, 260 - 4 * ago), max(0.0, 780.0 - 13 * ago)),
            ("webhooks", 2 + (9 if 20 <= ago <= 28 else 0), 1.5),
        ):
            QueueSample.objects.create(
                queue=queue, minute=at, ready=ready, scheduled=0, running=2, oldest_ready_age=age
            )
    stuck = now - timedelta(minutes=13)
    Job.objects.bulk_create(
        JobFactory.build(
            queue="emails", kind="shop.jobs.send_welcome_email", run_at=stuck + timedelta(seconds=n)
        )
        for n in range(262)
    )
    Job.objects.filter(queue="emails").update(created_at=stuck)
    JobFactory.create_batch(4, queue="default", kind="shop.jobs.generate_invoice", run_at=now)
    JobFactory.create_batch(
        12, queue="default", kind="shop.jobs.send_reminder", run_at=now + timedelta(hours=3)
    )
    DeadLetterFactory.create_batch(2, kind="shop.jobs.notify_order_webhook", queue="webhooks")
    DeadLetterFactory.create_batch(5, kind=kind, queue="default")
    WorkerProcess.objects.create(
        worker_id="web-1:4711",
        host="web-1",
        pid=4711,
        queues=["default", "webhooks"],
        concurrency=8,
        kinds=SCENE_KINDS,
        kinds_fingerprint=kinds_fingerprint(SCENE_KINDS),
    )
    gone = WorkerProcess.objects.create(
        worker_id="web-2:802",
        host="web-2",
        pid=802,
        queues=["emails"],
        concurrency=4,
        kinds=SCENE_KINDS,
        kinds_fingerprint=kinds_fingerprint(SCENE_KINDS),
    )
    WorkerProcess.objects.filter(pk=gone.pk).update(last_seen=now - timedelta(minutes=14))
