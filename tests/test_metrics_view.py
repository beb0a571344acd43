"""The metrics view: the database gauges, who may read them, and that Prometheus can parse
them (``prometheus_client.parser``)."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse
from django.utils import timezone
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from django_jobq import flow_control
from django_jobq.metrics.collector import DatabaseCollector
from django_jobq.models import Job, WorkerProcess
from tests.factories import DeadLetterFactory, JobFactory

pytestmark = pytest.mark.django_db(transaction=True)

URL = reverse("jobq:metrics")
TOKEN = "s3cret-token-for-the-scraper"
#: Seconds of slack on ages: the test's clock and the database's run apart by the test's
#: own duration, never by more.
AGE_TOLERANCE = 5.0


def parse(response):
    assert response.status_code == 200, response.content
    assert response["Content-Type"] == CONTENT_TYPE_LATEST
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def sample(samples, name, **labels):
    return samples[(name, tuple(sorted(labels.items())))]


def aged(seconds, **fields):
    """A ready job that has been claimable for ``seconds`` (run_at = created_at)."""
    moment = timezone.now() - timedelta(seconds=seconds)
    job = JobFactory(run_at=moment, **fields)
    Job.objects.filter(pk=job.pk).update(created_at=moment)
    return job


@pytest.fixture(autouse=True)
def uncached(settings):
    """Every request reads the database (the view's reads are otherwise cached 5 s per
    process, across tests)."""
    settings.JOBQ = {**settings.JOBQ, "METRICS_CACHE_TIMEOUT": 0}
    return settings


@pytest.fixture
def staff_client(client, django_user_model):
    user = django_user_model.objects.create_user("ops", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(codename__in=["view_job", "view_deadletter"])
    )
    client.force_login(user)
    return client


def test_the_gauges_describe_the_queue_database(staff_client):
    now = timezone.now()
    aged(120, queue="alpha")
    aged(10, queue="alpha")
    aged(0, queue="alpha")
    JobFactory.create_batch(2, queue="alpha", run_at=now + timedelta(hours=1))  # scheduled
    JobFactory(queue="alpha", status=Job.Status.RUNNING, attempts=1, worker_id="w:1")
    aged(90, queue="beta", priority=5)
    aged(3600, queue="beta", priority=-5)  # a starved low priority counts too
    DeadLetterFactory.create_batch(2, queue="alpha", kind="shop.jobs.a")
    DeadLetterFactory(queue="beta", kind="shop.jobs.b")
    WorkerProcess.objects.create(worker_id="h:1", host="h", pid=1, concurrency=4)
    stale = WorkerProcess.objects.create(worker_id="h:2", host="h", pid=2, concurrency=4)
    WorkerProcess.objects.filter(pk=stale.pk).update(last_seen=now - timedelta(minutes=5))

    samples = parse(staff_client.get(URL))

    assert {
        state: sample(samples, "jobq_queue_jobs", queue="alpha", state=state)
        for state in ("ready", "scheduled", "running")
    } == {"ready": 3, "scheduled": 2, "running": 1}
    assert sample(samples, "jobq_queue_jobs", queue="beta", state="ready") == 2
    age = "jobq_queue_oldest_ready_age_seconds"
    assert 120 <= sample(samples, age, queue="alpha") < 120 + AGE_TOLERANCE
    assert 3600 <= sample(samples, age, queue="beta") < 3600 + AGE_TOLERANCE
    assert sample(samples, "jobq_dead_letters", queue="alpha", kind="shop.jobs.a") == 2
    assert sample(samples, "jobq_dead_letters", queue="beta", kind="shop.jobs.b") == 1
    assert sample(samples, "jobq_workers", state="live") == 1
    assert sample(samples, "jobq_workers", state="stale") == 1


def test_the_gauges_show_paused_queues_and_their_limits(staff_client, settings):
    settings.JOBQ = {**settings.JOBQ, "QUEUES": {"emails": {"RATE_LIMIT": "600/m"}}}
    flow_control.pause_queue("default", until=3600)
    flow_control.set_queue_limits("emails", concurrency_limit=3, rate_limit=flow_control.UNCHANGED)
    samples = parse(staff_client.get(URL))
    assert sample(samples, "jobq_queue_paused", queue="default") == 1
    assert sample(samples, "jobq_queue_paused", queue="emails") == 0
    concurrency = "jobq_queue_concurrency_limit"
    assert sample(samples, concurrency, queue="emails", source="operator") == 3
    rate = "jobq_queue_rate_limit_per_second"
    assert sample(samples, rate, queue="emails", source="setting") == 10
    assert (rate, (("queue", "default"), ("source", "None"))) not in samples  # no limit
    flow_control.resume_queue("default")
    assert sample(parse(staff_client.get(URL)), "jobq_queue_paused", queue="default") == 0


def test_a_job_enqueued_with_a_past_run_at_waits_from_its_enqueue(staff_client):
    """A run_at long past but enqueued 30 s ago has waited 30 s, not an hour; the job behind
    it in run_at order has waited 90 s, so the queue's oldest ready age is 90 s."""
    now = timezone.now()
    late = JobFactory(queue="gamma", run_at=now - timedelta(hours=1))
    Job.objects.filter(pk=late.pk).update(created_at=now - timedelta(seconds=30))
    aged(90, queue="gamma")
    samples = parse(staff_client.get(URL))
    age = sample(samples, "jobq_queue_oldest_ready_age_seconds", queue="gamma")
    assert 90 <= age < 90 + AGE_TOLERANCE
    late_only = Job.objects.filter(queue="gamma").exclude(pk=late.pk)
    late_only.delete()
    fresh = DatabaseCollector(cache_timeout=0)
    (_, oldest, *_) = fresh.collect()
    (gamma,) = [s for s in oldest.samples if s.labels["queue"] == "gamma"]
    assert 30 <= gamma.value < 30 + AGE_TOLERANCE


def test_a_job_whose_lease_lapsed_is_ready_and_waits_from_its_deadline(staff_client):
    # What a SIGKILLed worker leaves: claimable again, so waiting, since the deadline passed.
    JobFactory(
        queue="orphaned",
        status="running",
        attempts=1,
        lease_deadline=timezone.now() - timedelta(seconds=100),
    )
    samples = parse(staff_client.get(URL))
    assert sample(samples, "jobq_queue_jobs", queue="orphaned", state="ready") == 1
    assert sample(samples, "jobq_queue_jobs", queue="orphaned", state="running") == 0
    age = sample(samples, "jobq_queue_oldest_ready_age_seconds", queue="orphaned")
    assert 100 <= age < 100 + AGE_TOLERANCE


def test_a_queue_without_due_jobs_has_an_oldest_ready_age_of_zero(staff_client):
    JobFactory(queue="later", run_at=timezone.now() + timedelta(hours=1))
    samples = parse(staff_client.get(URL))
    assert sample(samples, "jobq_queue_oldest_ready_age_seconds", queue="later") == 0
    assert sample(samples, "jobq_queue_jobs", queue="later", state="scheduled") == 1


def test_reads_are_cached_for_the_cache_timeout():
    cached = DatabaseCollector(cache_timeout=3600)

    def ready(collector):
        depth = next(iter(collector.collect()))
        return {s.labels["queue"]: s.value for s in depth.samples if s.labels["state"] == "ready"}

    assert ready(cached) == {}
    JobFactory(queue="cached")
    assert ready(cached) == {}  # within the cache timeout: the earlier read
    assert ready(DatabaseCollector(cache_timeout=0)) == {"cached": 1}


def test_anonymous_requests_are_asked_to_authenticate(client):
    response = client.get(URL)
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_a_logged_in_user_without_staff_status_is_refused(client, django_user_model):
    user = django_user_model.objects.create_user("customer")
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="django_jobq"))
    client.force_login(user)
    assert client.get(URL).status_code == 403


def test_a_scraper_with_the_bearer_token_reads_the_gauges(client, uncached):
    uncached.JOBQ = {**uncached.JOBQ, "METRICS_TOKEN": TOKEN}
    JobFactory(queue="scraped")
    samples = parse(client.get(URL, headers={"Authorization": f"Bearer {TOKEN}"}))
    assert sample(samples, "jobq_queue_jobs", queue="scraped", state="ready") == 1
    assert client.get(URL, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get(URL, headers={"Authorization": f"Basic {TOKEN}"}).status_code == 401


def test_without_a_configured_token_no_bearer_token_is_accepted(client):
    response = client.get(URL, headers={"Authorization": "Bearer anything-at-all-here"})
    assert response.status_code == 401


def test_staff_without_the_view_permissions_are_refused(client, django_user_model):
    # The gauges list dead letters: the dashboard's permissions apply.
    client.force_login(django_user_model.objects.create_user("intern", is_staff=True))
    assert client.get(URL).status_code == 403


def test_only_get_is_allowed_even_without_a_csrf_token(staff_client):
    staff_client.handler.enforce_csrf_checks = True
    assert staff_client.post(URL).status_code == 405
