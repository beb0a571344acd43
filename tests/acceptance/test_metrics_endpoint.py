"""``jobq_worker --metrics-port``: a real worker process serves its own counters over HTTP."""

import re
import signal
import socket
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from django_jobq.models import Job
from tests.conftest import wait_until
from tests.testapp.jobs import always_fails, record

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

TIMEOUT = 60


def test_a_worker_serves_its_metrics_on_its_port(manage):
    for n in range(5):
        record.using(queue="served").enqueue(f"s{n}")
    always_fails.using(queue="served", max_attempts=1).enqueue()
    worker = manage(
        "jobq_worker", "--queue", "served", "--metrics-port", "0", "--metrics-addr", "127.0.0.1"
    )
    try:
        line = worker.stderr.readline()
        match = re.search(r"serving metrics on http://127\.0\.0\.1:(\d+)/metrics", line)
        assert match, line
        url = f"http://127.0.0.1:{match[1]}/metrics"
        wait_until(lambda: not Job.objects.filter(queue="served").exists(), what="the jobs")
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
    finally:
        worker.send_signal(signal.SIGTERM)
        _, stderr = worker.communicate(timeout=TIMEOUT)
    assert worker.returncode == 0, stderr
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    record_kind = (("kind", "tests.testapp.jobs.record"), ("queue", "served"))
    assert samples[("jobq_jobs_claimed_total", record_kind)] == 5
    assert samples[("jobq_jobs_succeeded_total", record_kind)] == 5
    dead = (("kind", "tests.testapp.jobs.always_fails"), ("queue", "served"))
    assert (
        samples[("jobq_jobs_dead_lettered_total", (*dead, ("reason", "max attempts exceeded")))]
        == 1
    )
    assert samples[("jobq_worker_threads", (("state", "idle"),))] == 1
    assert ("process_cpu_seconds_total", ()) in samples  # the process's own collectors too


def test_a_taken_port_is_a_clear_error(manage):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        worker = manage(
            "jobq_worker", "--burst", "--metrics-port", str(port), "--metrics-addr", "127.0.0.1"
        )
        _, stderr = worker.communicate(timeout=TIMEOUT)
    assert worker.returncode == 1
    assert f"cannot serve metrics on 127.0.0.1:{port}" in stderr
