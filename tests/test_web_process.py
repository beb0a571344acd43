"""What a web process loads to enqueue: Django, psycopg and django-jobq's enqueue path, and
not prometheus-client (docs/operations.md, "Metrics"). Each test runs a fresh interpreter on
the test database, because this process has long loaded everything."""

import subprocess
import sys
import textwrap

import pytest

from django_jobq.models import Job, StoredTaskResult
from tests.conftest import REPO_ROOT, subprocess_env

pytestmark = pytest.mark.django_db(transaction=True)

# A web process: settings, the admin's URLs (autodiscovered model admins, the dashboard),
# then one job enqueued in a transaction, one enqueue_many and one Django task.
WEB_PROCESS = """
import sys

import django

django.setup()
from django.contrib import admin
from django.db import transaction

admin.site.get_urls()
from django_jobq import enqueue, enqueue_many
from tests.testapp.tasks import add

with transaction.atomic():
    enqueue("web.signup", {"user": 1})
enqueue_many([{"kind": "web.bulk", "payload": {"n": n}} for n in range(3)])
add.enqueue(1, 2)
print("prometheus_client" in sys.modules)
"""


def run_web_process(script: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=REPO_ROOT,
        env=subprocess_env(**env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_enqueueing_from_a_web_process_never_imports_prometheus_client():
    result = run_web_process(WEB_PROCESS)

    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False"]
    assert Job.objects.filter(kind__startswith="web.").count() == 4
    assert StoredTaskResult.objects.count() == 1


# The same process's async views then enqueue: aenqueue hops to Django's sync thread with
# asgiref, which Django itself has loaded, so nothing is imported that enqueue did not need.
ASYNC_WEB_PROCESS = (
    WEB_PROCESS
    + """
from asgiref.sync import async_to_sync
from django_jobq import aenqueue, aenqueue_many
from tests.testapp.jobs import record

loaded = set(sys.modules)


async def view():
    await aenqueue("web.async", {"n": 1})
    await aenqueue_many([{"kind": "web.async", "payload": {"n": 2}}])
    await record.aenqueue(label="web")


async_to_sync(view)()
print(sorted(set(sys.modules) - loaded))
"""
)


def test_aenqueue_imports_nothing_that_enqueue_did_not():
    result = run_web_process(ASYNC_WEB_PROCESS)

    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "[]"]
    assert Job.objects.filter(kind="web.async").count() == 2


def test_a_broken_multiprocess_directory_does_not_break_enqueue_where_metrics_are_loaded(
    tmp_path,
):
    """A process that exposes metrics counts its enqueues; when counting fails (the
    multiprocess directory is gone), the jobs are committed and enqueue returns: the failure
    is logged, not raised."""
    script = "import prometheus_client\n" + WEB_PROCESS
    result = run_web_process(script, PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "gone"))

    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True"]
    assert Job.objects.filter(kind__startswith="web.").count() == 4
    assert "Error calling" in result.stderr and "on_commit" in result.stderr
