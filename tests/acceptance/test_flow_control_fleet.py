"""Flow control across a fleet: four real ``jobq_worker`` processes of 16 threads each on one
PostgreSQL, some SIGKILLed and restarted mid-run (docs/flow-control.md).

Each test proves one of the issue's claims from what the handlers recorded with their own
clocks (``tests.testapp.models.Run``) and from a sampler reading the jobs table.
"""

from __future__ import annotations

import itertools
import random
import signal
import subprocess
import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, connections
from django.utils import timezone

from django_jobq import enqueue_many
from django_jobq.models import DeadLetter, Job, KindLimit, Queue, WorkerProcess
from tests.conftest import wait_until
from tests.testapp.jobs import flow_step, limited_step, rated_step
from tests.testapp.models import Run

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

WORKERS = 4
THREADS = 16
TIMEOUT = 120
WORKER_ARGUMENTS = ["jobq_worker", "--queue", "flow", "--concurrency", str(THREADS)]
WORKER_ARGUMENTS += ["--poll-interval", "0.5"]


def start_fleet(manage: Callable[..., subprocess.Popen[str]], count: int) -> list[Any]:
    """Start ``count`` workers of ``THREADS`` threads serving queue "flow"; return once all
    have registered."""
    already = WorkerProcess.objects.count()
    fleet = [
        manage(
            "jobq_worker",
            "--queue",
            "flow",
            "--concurrency",
            str(THREADS),
            "--poll-interval",
            "0.5",
        )
        for _ in range(count)
    ]
    wait_until(
        lambda: WorkerProcess.objects.count() >= already + count, what="the workers to start"
    )
    return fleet


def stop_fleet(fleet: list[Any]) -> None:
    for process in fleet:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in fleet:
        process.communicate(timeout=TIMEOUT)


def enqueue_steps(labels: list[str], **options: Any) -> None:
    enqueue_many(
        [{"kind": flow_step.kind, "payload": {"label": label, **options}} for label in labels]
    )


def most_at_once(runs: list[Run]) -> int:
    events = sorted([(run.started, 1) for run in runs] + [(run.finished, -1) for run in runs])
    running = most = 0
    for _, change in events:
        running += change
        most = max(most, running)
    return most


class RunningSampler:
    """The most jobs of queue "flow" seen running at once, read over and over in a thread."""

    def __init__(self) -> None:
        self.most = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            with connections["default"].cursor() as cursor:
                while not self._stop.is_set():
                    cursor.execute(
                        "SELECT count(*) FROM jobq_job WHERE queue = 'flow' AND status = 'running'"
                    )
                    self.most = max(self.most, cursor.fetchone()[0])
                    self.samples += 1
        finally:
            connections.close_all()

    def __enter__(self) -> RunningSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def test_a_concurrency_limit_of_3_holds_while_workers_are_killed_and_restarted(manage):
    Queue.objects.create(name="flow", concurrency_limit=3)
    labels = [f"job-{n}" for n in range(60)]
    rng = random.Random(18)
    enqueue_many(
        [
            {
                "kind": flow_step.kind,
                "payload": {"label": label, "seconds": rng.uniform(0.02, 0.12)},
                "visibility_timeout": 2,  # a killed worker's jobs are claimable 2 s later
            }
            for label in labels
        ]
    )
    with RunningSampler() as sampler:
        fleet = start_fleet(manage, WORKERS)
        wait_until(lambda: Run.objects.count() >= 15, timeout=TIMEOUT, what="a quarter of the jobs")
        for process in fleet[:2]:
            process.send_signal(
                signal.SIGKILL
            )  # their running jobs keep their slots until they lapse
            process.communicate(timeout=TIMEOUT)
        fleet += start_fleet(manage, 2)
        wait_until(lambda: not Job.objects.exists(), timeout=TIMEOUT, what="every job to finish")
    stop_fleet(fleet)
    runs = list(Run.objects.all())
    assert {run.label for run in runs} == set(labels)  # nothing lost (a killed one ran again)
    assert not DeadLetter.objects.exists()
    assert sampler.samples > 100
    assert sampler.most == 3  # the limit was reached and never passed
    assert most_at_once(runs) <= 3


def test_a_concurrency_limit_the_prefetch_reaches_holds_while_workers_are_killed(manage):
    """A limit of 100 over 64 threads: far from binding at first, so the workers' claims
    fill their prefetch too and are made before their count (docs/flow-control.md); then
    the prefetched jobs bring the leases to the limit, where a count refuses a claim that
    does not fit (rolled back, claimed again under the locks) and claims are for idle
    threads only. Never more than 100 jobs hold a lease. (The test app's
    kinds with tight limits of their own are raised out of the way: a worker claims first
    only while every limit it counts is far from binding.)"""
    Queue.objects.create(name="flow", concurrency_limit=100)
    for kind in (limited_step.kind, rated_step.kind):  # the test app's tight kind limits
        KindLimit.objects.create(kind=kind, concurrency_limit=10**6, rate_limit="1000000/s")
    labels = [f"job-{n}" for n in range(1500)]
    rng = random.Random(100)
    enqueue_many(
        [
            {
                "kind": flow_step.kind,
                "payload": {"label": label, "seconds": rng.uniform(0.05, 0.15)},
                "visibility_timeout": 2,
            }
            for label in labels
        ]
    )
    with RunningSampler() as sampler:
        fleet = start_fleet(manage, WORKERS)
        wait_until(lambda: Run.objects.count() >= 300, timeout=TIMEOUT, what="a fifth of the jobs")
        for process in fleet[:2]:
            process.send_signal(signal.SIGKILL)
            process.communicate(timeout=TIMEOUT)
        fleet += start_fleet(manage, 2)
        wait_until(lambda: not Job.objects.exists(), timeout=TIMEOUT, what="every job to finish")
    stop_fleet(fleet)
    assert {run.label for run in Run.objects.all()} == set(labels)
    assert not DeadLetter.objects.exists()
    assert sampler.samples > 100
    assert WORKERS * THREADS < sampler.most <= 100  # prefetched far from the limit, never past


def test_a_rate_limit_of_50_a_second_holds_over_20_seconds_and_is_nearly_reached(manage):
    Queue.objects.create(name="flow", rate_limit="50/s")
    enqueue_steps([f"job-{n}" for n in range(1000)])
    fleet = start_fleet(manage, WORKERS)
    wait_until(lambda: Run.objects.count() == 1000, timeout=TIMEOUT, what="every job to run")
    stop_fleet(fleet)
    starts = sorted(Run.objects.values_list("started", flat=True))
    most_in_a_second = max(
        sum(1 for other in starts[index : index + 60] if other < start + 1.0)
        for index, start in enumerate(starts)
    )
    assert most_in_a_second <= 50
    achieved = (len(starts) - 1) / (starts[-1] - starts[0])
    assert achieved >= 45, f"{achieved:.1f} starts/s"


def test_lanes_run_in_enqueue_order_one_at_a_time_while_lanes_overlap(manage):
    rng = random.Random(20)
    order = [lane for lane in range(20) for _ in range(50)]
    rng.shuffle(order)  # the lanes' jobs enqueued interleaved
    expected: dict[str, list[str]] = {f"lane-{lane}": [] for lane in range(20)}
    jobs = []
    for number in order:
        key = f"lane-{number}"
        label = f"{key}#{len(expected[key])}"
        expected[key].append(label)
        payload = {"label": label, "seconds": rng.uniform(0, 0.02), "lane": key}
        jobs.append({"kind": flow_step.kind, "payload": payload, "ordering_key": key})
    enqueue_many(jobs)
    fleet = start_fleet(manage, WORKERS)
    wait_until(lambda: Run.objects.count() == 1000, timeout=TIMEOUT, what="every job to run")
    stop_fleet(fleet)
    for key, labels in expected.items():
        runs = list(Run.objects.filter(lane=key).order_by("started"))
        assert [run.label for run in runs] == labels, key
        for before, after in itertools.pairwise(runs):
            assert before.finished <= after.started, (key, before.label, after.label)
    assert most_at_once(list(Run.objects.all())) >= 4  # lanes ran side by side


def test_a_pause_under_load_holds_back_new_jobs_until_resumed_and_loses_nothing(manage):
    enqueue_steps([f"before-{n}" for n in range(300)], seconds=0.01)
    fleet = start_fleet(manage, WORKERS)
    wait_until(lambda: Run.objects.count() >= 50, timeout=TIMEOUT, what="the fleet to get going")
    Queue.objects.create(name="flow", paused_at=timezone.now())
    enqueue_steps([f"after-{n}" for n in range(100)], seconds=0.01)
    wait_until(
        lambda: not Job.objects.filter(status="running").exists(),
        timeout=TIMEOUT,
        what="the running jobs to finish",
    )
    with connection.cursor() as cursor:  # the fleet polls every 0.5 s: give it two polls
        cursor.execute("SELECT pg_sleep(1.0)")
    assert not Run.objects.filter(label__startswith="after-").exists()
    held = Job.objects.filter(status="ready").count()
    assert held >= 100  # every job enqueued after the pause, and those not yet claimed
    Queue.objects.filter(name="flow").update(paused_at=None)
    wait_until(lambda: not Job.objects.exists(), timeout=TIMEOUT, what="every job to run")
    stop_fleet(fleet)
    labels = list(Run.objects.values_list("label", flat=True))
    assert len(labels) == len(set(labels)) == 400  # none lost, none run twice
