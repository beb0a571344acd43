"""Upgrading django-jobq: a worker of a release whose migrations the queue database lacks
refuses to start, naming them (docs/deploying.md, "Upgrading django-jobq")."""

import pytest

from django_jobq.models import Job
from tests.factories import JobFactory

pytestmark = pytest.mark.acceptance


def finished(process, timeout=60):
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out + err


def test_a_worker_refuses_a_queue_database_without_its_migrations_and_runs_once_migrated(
    manage,
):
    job = JobFactory(kind="tests.testapp.jobs.record")
    code, output = finished(manage("migrate", "django_jobq", "0011", "-v", "0"))
    assert code == 0, output
    try:
        code, output = finished(manage("jobq_worker", "--burst"))
        assert code == 1
        assert "lacks django_jobq migrations of this release: 0012_trace_context" in output
        assert "Traceback" not in output
    finally:
        code, output = finished(manage("migrate", "django_jobq", "-v", "0"))
        assert code == 0, output
    assert Job.objects.filter(pk=job.pk).exists()  # nothing claimed meanwhile

    code, output = finished(manage("jobq_worker", "--burst"))
    assert code == 0, output
    assert not Job.objects.filter(pk=job.pk).exists()
