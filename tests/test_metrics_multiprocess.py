"""Several worker processes, one metrics endpoint: the hooks a supervisor calls
(``prepare_multiprocess``, ``serve_multiprocess``, ``mark_process_dead``), proved with real
forked and spawned processes that record metrics, scraped over HTTP and parsed."""

import os
import subprocess
import sys
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import REPO_ROOT, database_url
from tests.testapp.jobs import record
from tests.testapp.models import Effect

TIMEOUT = 60

#: A supervisor: forks two children, spawns a third (a fresh interpreter), waits for them,
#: then serves their sum and, when told "mark", marks them dead.
SUPERVISOR = r"""
import os
import subprocess
import sys

from django_jobq.metrics import instruments
from django_jobq.metrics.multiprocess import mark_process_dead, prepare_multiprocess
from django_jobq.metrics.server import serve_multiprocess

CHILD = '''
from django_jobq.metrics import instruments
for _ in range(5):
    instruments.observe_outcome("mp", "k", "succeeded", duration=0.5)
instruments.threads_started(4)
'''

instruments.observe_outcome("mp", "k", "succeeded", duration=0.5)  # before: not in the sum
prepare_multiprocess(sys.argv[1])
children = []
for count in (2, 3):
    pid = os.fork()
    if pid == 0:
        for _ in range(count):
            instruments.observe_outcome("mp", "k", "succeeded", duration=0.5)
        instruments.threads_started(4)
        os._exit(0)
    children.append(pid)
spawned = subprocess.Popen([sys.executable, "-c", CHILD])
for pid in children:
    os.waitpid(pid, 0)
assert spawned.wait() == 0
server = serve_multiprocess(0, "127.0.0.1")
print(server.port, flush=True)
for line in sys.stdin:
    if line.strip() != "mark":
        break
    for pid in (*children, spawned.pid):
        mark_process_dead(pid)
    print("marked", flush=True)
server.close()
"""

#: A supervisor of two real workers, forked after Django is set up, one per queue.
WORKERS = r"""
import os
import sys
import traceback

import django

django.setup()
from django_jobq.metrics.multiprocess import mark_process_dead, prepare_multiprocess
from django_jobq.metrics.server import serve_multiprocess
from django_jobq.worker import Worker

prepare_multiprocess(sys.argv[1])
children = []
for queue in ("mp-a", "mp-b"):
    pid = os.fork()
    if pid == 0:
        status = 0
        try:
            Worker(queues=[queue], burst=True, poll_interval=0.05, concurrency=2).run()
        except BaseException:
            traceback.print_exc()
            status = 1
        os._exit(status)
    children.append(pid)
for pid in children:
    _, status = os.waitpid(pid, 0)
    assert status == 0, status
    mark_process_dead(pid)
server = serve_multiprocess(0, "127.0.0.1")
print(server.port, flush=True)
sys.stdin.readline()
server.close()
"""


def start(script, directory, **env):
    return subprocess.Popen(
        [sys.executable, "-c", script, str(directory)],
        cwd=REPO_ROOT,
        env={
            **{k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"},
            "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "testproject")]),
            **env,
        },
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_forked_and_spawned_processes_are_summed_and_dead_ones_leave_the_live_gauges(tmp_path):
    supervisor = start(SUPERVISOR, tmp_path / "metrics")
    try:
        port = int(supervisor.stdout.readline())
        succeeded = ("jobq_jobs_succeeded_total", (("kind", "k"), ("queue", "mp")))
        durations = (
            "jobq_job_duration_seconds_sum",
            (("kind", "k"), ("outcome", "succeeded"), ("queue", "mp")),
        )
        idle = ("jobq_worker_threads", (("state", "idle"),))
        samples = scrape(port)
        assert samples[succeeded] == 2 + 3 + 5
        assert samples[durations] == pytest.approx(0.5 * 10)
        assert samples[idle] == 3 * 4  # the children exited, but nobody said so yet

        supervisor.stdin.write("mark\n")
        supervisor.stdin.flush()
        assert supervisor.stdout.readline().strip() == "marked"
        samples = scrape(port)
        assert samples[succeeded] == 10  # a dead child's counts stay: counters never go back
        assert samples.get(idle, 0) == 0
    finally:
        supervisor.communicate("quit\n", timeout=TIMEOUT)
    assert supervisor.returncode == 0


@pytest.mark.django_db(transaction=True)
def test_two_forked_workers_are_served_as_one(tmp_path):
    for n in range(12):
        record.using(queue="mp-a").enqueue(f"a{n}")
    for n in range(8):
        record.using(queue="mp-b").enqueue(f"b{n}")
    supervisor = start(
        WORKERS,
        tmp_path / "metrics",
        DATABASE_URL=database_url(),
        DJANGO_SETTINGS_MODULE="tests.settings",
    )
    try:
        port = int(supervisor.stdout.readline())
        samples = scrape(port)
    finally:
        supervisor.communicate("\n", timeout=TIMEOUT)
    assert supervisor.returncode == 0
    kind = "tests.testapp.jobs.record"
    for queue, count in (("mp-a", 12), ("mp-b", 8)):
        labels = (("kind", kind), ("queue", queue))
        assert samples[("jobq_jobs_claimed_total", labels)] == count
        assert samples[("jobq_jobs_succeeded_total", labels)] == count
        assert samples[("jobq_pickup_latency_seconds_count", (("queue", queue),))] == count
    assert samples.get(("jobq_worker_threads", (("state", "idle"),)), 0) == 0
    assert Effect.objects.count() == 20
