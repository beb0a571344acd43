"""The chaos suite, short: real worker processes SIGKILLed at every crash point, connections
terminated, and PostgreSQL restarted, under load. No job lost, no transactional effect
duplicated, every external duplicate explained by a death (docs/guarantees.md).

The full run is ``manage.py jobq_chaos`` (2,000 jobs, 4 workers, 50 kills by default), a
command of the chaos app, which tests/settings.py installs.
"""

import dataclasses
import json
import os
import shlex
import subprocess
import sys

import pytest

from django_jobq import crash_points
from django_jobq.contrib.chaos.handlers import QUEUE
from django_jobq.contrib.chaos.run import ChaosConfig, run
from django_jobq.models import DeadLetter, DedupKey, Job
from tests.conftest import REPO_ROOT

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

#: The short run: a kill at each crash point, and two terminated connections.
SHORT = ChaosConfig(jobs=200, workers=3, kills=6, terminations=2, seed=7, visibility_timeout=2)
#: Seeds that once failed, each rerun in full as a regression test: add a failing seed here
#: (with the date and what broke) before fixing the bug. No seed has found a broken
#: guarantee so far. Two failed the harness while it was written (2026-12-01): seed 7 here
#: and seed 3 in the restart test drained the queue before every planned kill and
#: termination had happened (the plan ignored the deaths that hand a plan on); they stay
#: the seeds of these two runs.
REGRESSION_SEEDS: list[int] = []


def planned_kills(config):
    crashes = config.plan().crashes
    return {point: sum(c.point == point for c in crashes) for point in crash_points.POINTS}


def test_the_plan_shares_the_kills_out_evenly_among_the_crash_points():
    assert planned_kills(SHORT) == dict.fromkeys(crash_points.POINTS, 1)
    assert sorted(planned_kills(dataclasses.replace(SHORT, kills=50)).values()) == [8] * 4 + [9] * 2


@pytest.mark.timeout(240)
@pytest.mark.parametrize("seed", [SHORT.seed, *REGRESSION_SEEDS])
def test_killed_workers_lose_no_job_and_repeat_no_transactional_effect(seed):
    config = dataclasses.replace(SHORT, seed=seed)
    report = run(config)

    assert report.ok, report.problems
    # Every planned kill happened, at its crash point.
    assert report.kills == config.kills
    assert {point: report.faults[point][0] for point in crash_points.POINTS} == planned_kills(
        config
    )
    terminated = sum(times for cause, (times, _) in report.faults.items() if "terminate" in cause)
    assert terminated == config.terminations
    # Nothing lost, nothing stuck.
    assert (report.finished, report.lost, report.still_queued) == (config.jobs, 0, 0)
    # Transactional: exactly one business row and one dedup key per job.
    assert report.business_rows == report.dedup_keys == report.transactional_jobs
    assert report.transactional_duplicates == 0
    # External: at least once, and every repeat explained by a death, within the bound.
    assert report.effects == report.external_jobs + report.external_duplicates
    assert report.unexplained_duplicates == 0
    assert report.external_duplicates <= report.duplicate_bound
    # A kill inside the handler, after its effect, or after the handler returned, always
    # leaves that job's effect unacked: the kills landed in the window that matters.
    for point in ("in_handler", "after_handler"):
        times, unacked = report.faults[point]
        assert unacked >= times
    assert report.dead_letters == report.dead_letters_explained
    # A passing run leaves nothing behind.
    assert not Job.objects.filter(queue=QUEUE).exists()
    assert not DeadLetter.objects.filter(queue=QUEUE).exists()
    assert not DedupKey.objects.filter(kind__startswith="jobq.chaos.").exists()


@pytest.mark.timeout(240)
def test_workers_finish_every_job_through_a_postgresql_restart(postgres_cluster):
    """PostgreSQL itself restarts mid-run (a cluster of the test's own), besides kills and
    terminated connections: every worker loses its connections at once."""
    env = {
        **os.environ,
        "DATABASE_URL": postgres_cluster.create_database("jobq_chaos"),
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "testproject")]),
    }
    manage = [sys.executable, str(REPO_ROOT / "testproject" / "manage.py")]
    subprocess.run([*manage, "migrate", "django_jobq", "-v", "0"], env=env, check=True)
    arguments = ["--jobs", "120", "--workers", "3", "--kills", "2", "--terminations", "2"]
    arguments += ["--concurrency", "2", "--seed", "3", "--visibility-timeout", "2", "--json"]
    done = subprocess.run(
        [
            *manage,
            "jobq_chaos",
            *arguments,
            "--restart-command",
            shlex.join(postgres_cluster.restart_argv),
        ],
        env=env,
        cwd=postgres_cluster.directory,  # the restart runs as postgres, who may enter only this
        capture_output=True,
        text=True,
        timeout=220,
        check=False,
    )

    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["ok"]
    assert report["faults"]["restart"][0] == 1
    assert report["kills"] == 2
    assert (report["finished"], report["lost"], report["still_queued"]) == (120, 0, 0)
    assert report["business_rows"] == report["dedup_keys"] == report["transactional_jobs"]
    assert report["transactional_duplicates"] == report["unexplained_duplicates"] == 0
    # The restart cut every worker's connections: the workers reconnected and carried on.
    assert report["reconnects"] >= 1
