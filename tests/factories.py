"""factory-boy factories for rows the tests need to exist already (e.g. a job of a kind
no worker knows, or a dead letter), without going through enqueue."""

from datetime import timedelta

import factory
from django.utils import timezone

from django_jobq.models import DeadLetter, Job


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
