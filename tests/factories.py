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
