"""The chaos app's parts: crash points, the seeded plan, the refusal to run beside other
jobs or workers, the verdict (it must catch every broken guarantee), and the command's
report. The runs themselves are in tests/acceptance/test_chaos.py; what the app's absence
leaves of it (nothing) is in tests/test_chaos_app.py."""

import dataclasses
import json
import re
import subprocess
import sys
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.utils import timezone

from django_jobq import crash_points
from django_jobq.contrib.chaos import handlers, sql
from django_jobq.contrib.chaos import run as chaos_run
from django_jobq.contrib.chaos.handlers import QUEUE, Effect
from django_jobq.contrib.chaos.plan import Plan, make_plan
from django_jobq.contrib.chaos.run import ChaosConfig, ChaosRefused
from django_jobq.contrib.chaos.supervisor import Death, Supervisor
from django_jobq.contrib.chaos.verdict import Report, judge
from django_jobq.leases import Lease
from django_jobq.models import DeadLetter, DedupKey
from tests.conftest import REPO_ROOT
from tests.testapp.jobs import record

TRANSACTIONAL, EXTERNAL = handlers.transactional.kind, handlers.external.kind
COMMAND = "django_jobq.contrib.chaos.management.commands.jobq_chaos"

# -- crash points --------------------------------------------------------------------------

# A process with the chaos app, passing crash points as the worker's code does.
ARRIVALS = """
import django
from django.conf import settings

settings.configure(INSTALLED_APPS=["django_jobq", "django_jobq.contrib.chaos"], DATABASES={})
django.setup()
from django_jobq import crash_points
for point in ["after_ack", "after_handler", "after_ack", "after_handler", "after_handler"]:
    print(point, flush=True)
    if crash_points.reach is not None:
        crash_points.reach(point)
print("survived", flush=True)
"""


def run_script(crash_at):
    env = {"PATH": "/usr/bin:/bin"}
    if crash_at is not None:
        env[crash_points.ENV_VAR] = crash_at
    return subprocess.run(
        [sys.executable, "-c", ARRIVALS],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_crash_points_are_off_unless_the_test_only_variable_is_set():
    assert crash_points.reach is None  # this process (the test suite) never sets it
    done = run_script(None)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == "survived"


def test_a_process_kills_itself_at_the_armed_arrival_of_the_armed_point():
    done = run_script("after_handler:2")
    assert done.returncode == -9  # SIGKILL: no clean-up ran
    # The second arrival at after_handler is the fourth point reached; after_ack never counts.
    assert done.stdout.split() == ["after_ack", "after_handler", "after_ack", "after_handler"]
    assert done.stderr == "jobq crash point: SIGKILL at after_handler (arrival 2)\n"


@pytest.mark.parametrize("value", ["after_handlr:1", "after_ack:0", "after_ack", "after_ack:x"])
def test_a_misspelt_crash_plan_fails_at_start_up(value):
    done = run_script(value)
    assert done.returncode == 1
    assert f"JOBQ_TEST_CRASH_AT={value!r}: expected POINT:COUNT" in done.stderr


# -- plan ----------------------------------------------------------------------------------


def plan(**overrides):
    arguments = {"seed": 5, "jobs": 2000, "kills": 50, "workers": 4, "terminations": 5}
    return make_plan(**{**arguments, "restart": False, **overrides})


def test_a_seed_fixes_the_plan():
    assert plan() == plan()
    assert plan(seed=6) != plan()


def test_the_plan_kills_every_point_evenly_early_in_the_run_and_strikes_from_outside():
    crashes = plan().crashes
    counts = sorted(sum(c.point == p for c in crashes) for p in crash_points.POINTS)
    assert counts == [8, 8, 8, 8, 9, 9]
    # Workers die after about jobs / (2 * deaths) = 2000 / 118 ≈ 17 jobs: arrival counts stay
    # within twice that (per job a point is reached once, or half as often).
    assert all(1 <= c.arrival <= 33 for c in crashes)
    assert max(c.arrival for c in crashes if c.point == "in_transaction") <= 16
    terminations = plan().terminations
    assert [t.progress for t in terminations] == sorted(t.progress for t in terminations)
    assert all(0.05 <= t.progress <= 0.35 for t in terminations)
    assert plan().restart_at is None
    assert 0.05 <= plan(restart=True).restart_at <= 0.35


def test_chaos_config_refuses_nonsense():
    with pytest.raises(ValueError, match="workers must be at least 1"):
        ChaosConfig(workers=0)
    with pytest.raises(ValueError, match="kills must be at least 0"):
        ChaosConfig(kills=-1)
    with pytest.raises(ValueError, match="visibility_timeout"):
        ChaosConfig(visibility_timeout=0)


# -- refusal -------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_run_refuses_a_database_with_other_jobs():
    record.enqueue("a real job")
    with pytest.raises(ChaosRefused, match="holds 1 jobs of other queues"):
        chaos_run.run(ChaosConfig(jobs=10, kills=0))
    assert "jobq_chaos_business_row" not in connection.introspection.table_names()


@pytest.mark.django_db(transaction=True)
def test_the_run_refuses_to_start_beside_a_worker(connect, monkeypatch):
    monkeypatch.setattr(chaos_run, "_OTHER_WORKERS_GRACE", 0.2)
    worker = connect()
    worker.execute("SET application_name = 'jobq worker elsewhere:1'")
    with pytest.raises(ChaosRefused, match=r"1 workers are connected .*jobq worker elsewhere:1"):
        chaos_run.run(ChaosConfig(jobs=10, kills=0))


# -- verdict -------------------------------------------------------------------------------


@pytest.fixture
def business_table(transactional_db):
    with connection.cursor() as cursor:
        cursor.execute(sql.DROP_CHAOS_BUSINESS_TABLE)
        cursor.execute(sql.CREATE_CHAOS_BUSINESS_TABLE)

    def add_row(job_id, attempt=1, *, key=True):
        with connection.cursor() as cursor:
            cursor.execute(sql.INSERT_CHAOS_BUSINESS_ROW, {"job_id": job_id, "attempt": attempt})
        if key:
            DedupKey.objects.create(
                kind=TRANSACTIONAL, key=f"job-{job_id}-{attempt}", job_id=job_id
            )

    yield add_row
    with connection.cursor() as cursor:
        cursor.execute(sql.DROP_CHAOS_BUSINESS_TABLE)


def supervisor(tmp_path, deaths=()):
    idle = Supervisor(
        workers=1,
        worker_args=[],
        env={},
        plan=Plan((), (), None),
        run_dir=tmp_path,
        prefix="chaos-test-",
        alias="default",
        stall_timeout=60,
    )
    idle.deaths.extend(deaths)
    return idle


def verdict(tmp_path, enqueued, effects=(), deaths=(), bound=2):
    report = Report(seed=1, jobs=len(enqueued), workers=1, per_death_bound=bound, kills_planned=0)
    return judge(
        report,
        enqueued=enqueued,
        supervisor=supervisor(tmp_path, deaths),
        effects=effects,
        alias="default",
    )


def killed(pid, point="in_handler", stranded=()):
    return Death(f"chaos-test-{pid}", pid, -9, point, frozenset(stranded))


def test_the_verdict_passes_effects_repeated_only_by_dead_workers(business_table, tmp_path):
    business_table(1)
    enqueued = {1: TRANSACTIONAL, 2: EXTERNAL}
    effects = [Effect(2, 1, 100), Effect(2, 2, 200)]  # attempt 1's worker died, 2 acked
    report = verdict(tmp_path, enqueued, effects, deaths=[killed(100)])
    assert report.ok, report.problems
    assert (report.finished, report.lost, report.external_duplicates) == (2, 0, 1)
    assert report.faults["in_handler"] == [1, 1]


def test_the_verdict_catches_a_duplicate_business_row_and_a_lost_job(business_table, tmp_path):
    business_table(1)
    business_table(1, attempt=2)
    report = verdict(tmp_path, {1: TRANSACTIONAL, 2: TRANSACTIONAL, 3: EXTERNAL})
    assert report.transactional_duplicates == 1
    assert report.lost == 2  # job 2 has no business row, job 3 no effect, and both are gone
    assert report.problems[:2] == [
        "1 duplicate business rows: jobs 1",
        "dedup keys do not match business rows: 1",
    ]
    assert re.fullmatch(
        r"2 jobs lost \(gone, no dead letter, no effect\): [23], [23]", report.problems[2]
    )


def test_the_verdict_catches_a_repeat_by_a_live_worker_and_one_beyond_the_bound(
    business_table, tmp_path
):
    enqueued = {3: EXTERNAL, 4: EXTERNAL, 5: EXTERNAL}
    effects = [
        Effect(3, 1, 300),  # pid 300 never died and lost no lease
        Effect(3, 2, 200),
        Effect(4, 1, 100),  # pid 100 died leaving two unacked effects; it held only one
        Effect(4, 2, 200),
        Effect(5, 1, 100),
        Effect(5, 2, 200),
    ]
    report = verdict(tmp_path, enqueued, effects, deaths=[killed(100)], bound=1)
    assert report.unexplained_duplicates == 1
    assert report.problems == [
        "worker chaos-test-100 died leaving 2 effects unacked, more than the 1 leases a "
        "worker holds",
        "1 external effects repeated by live workers that lost no lease: job 3 attempt 1",
    ]


def test_the_verdict_explains_a_dead_letter_only_by_faults_on_every_attempt(
    business_table, tmp_path
):
    for job_id, reason in [(6, "lease expired on final attempt"), (7, "max attempts exceeded")]:
        DeadLetter.objects.create(
            job_id=job_id,
            queue=QUEUE,
            kind=EXTERNAL,
            attempts=2,
            max_attempts=2,
            visibility_timeout=timedelta(seconds=2),
            created_at=timezone.now(),
            reason=reason,
        )
    deaths = [killed(100, stranded=[Lease(6, 1), Lease(7, 1)]), killed(101, stranded=[Lease(6, 2)])]
    report = verdict(tmp_path, {6: EXTERNAL, 7: EXTERNAL}, deaths=deaths)
    assert (report.dead_letters, report.dead_letters_explained, report.lost) == (2, 1, 0)
    assert report.problems == [
        "dead letters not explained by faults: job 7 (max attempts exceeded)"
    ]


# -- the command ---------------------------------------------------------------------------


def canned_report(**overrides):
    report = Report(seed=4, jobs=100, workers=2, per_death_bound=2, kills_planned=6, kills=6)
    report.faults = {
        point: [1, int(point in ("in_handler", "after_handler"))] for point in crash_points.POINTS
    }
    report.finished, report.wall_seconds = 100, 12.34
    return dataclasses.replace(report, **overrides)


def test_the_command_prints_the_report_table(monkeypatch):
    monkeypatch.setattr(f"{COMMAND}.run", lambda config, say: canned_report())
    out = StringIO()
    call_command("jobq_chaos", "--jobs", "100", "--workers", "2", "--kills", "6", stdout=out)
    text = out.getvalue()
    assert text.startswith("chaos run: seed 4, 100 jobs, 2 workers (concurrency 1, batch size 1)")
    assert re.search(r"^in_handler +1 +1$", text, re.MULTILINE)
    assert re.search(r"^before_claim +1 +0$", text, re.MULTILINE)
    assert re.search(r"^jobs finished +100 of 100$", text, re.MULTILINE)
    assert re.search(r"^wall time +12\.3 s$", text, re.MULTILINE)
    assert re.search(r"^result +PASS$", text, re.MULTILINE)


def test_the_command_exits_1_naming_the_problems(monkeypatch):
    failed = canned_report(lost=1, problems=["1 jobs lost (gone, no dead letter, no effect): 9"])
    monkeypatch.setattr(f"{COMMAND}.run", lambda config, say: failed)
    out = StringIO()
    with pytest.raises(CommandError, match=r"chaos run failed: 1 jobs lost .*: 9"):
        call_command("jobq_chaos", "--json", stdout=out)
    assert json.loads(out.getvalue())["ok"] is False


def test_the_command_refuses_bad_arguments():
    with pytest.raises(CommandError, match="jobs must be at least 1"):
        call_command("jobq_chaos", "--jobs", "0")


# -- docs/chaos.md and docs/guarantees.md -------------------------------------------------

DOC = (REPO_ROOT / "docs" / "guarantees.md").read_text()
CHAOS_DOC = (REPO_ROOT / "docs" / "chaos.md").read_text()


def test_the_documented_options_are_the_commands_own():
    from django_jobq.contrib.chaos.management.commands.jobq_chaos import Command

    parser = Command().create_parser("manage.py", "jobq_chaos")
    common = {"--version", "--verbosity", "--settings", "--pythonpath", "--traceback"}
    common |= {"--no-color", "--force-color", "--skip-checks", "--help"}
    own = {o for action in parser._actions for o in action.option_strings if o.startswith("--")}
    table = CHAOS_DOC.split("| option | default | |")[1].split("\n\n")[0]
    assert set(re.findall(r"`(--[a-z-]+)", table)) == own - common


def test_the_documented_crash_points_are_the_cores_in_order():
    section = CHAOS_DOC.split("## Crash points\n", 1)[1].split("```", 1)[0]
    assert tuple(re.findall(r"`([a-z_]+)`", section)) == crash_points.POINTS


def test_the_documented_report_has_the_commands_rows(monkeypatch):
    monkeypatch.setattr(f"{COMMAND}.run", lambda config, say: canned_report())
    out = StringIO()
    call_command("jobq_chaos", stdout=out)
    documented = DOC.split("$ python manage.py jobq_chaos\n")[1].split("```")[0]

    def checks(report):  # the labels of the second table
        return [line.split("  ")[0] for line in report.split("\n\n")[1].splitlines() if line]

    assert checks(documented) == checks(out.getvalue())
    for point in crash_points.POINTS:
        assert re.search(rf"^{point} +\d+ +\d+$", documented, re.MULTILINE)


def test_every_test_the_faults_table_names_exists():
    table = DOC.split("## Faults and what the worker does\n", 1)[1].split("\n## ", 1)[0]
    named = re.findall(r"`(tests/[\w/]+\.py)::(\w+)", table)
    assert len(named) >= 30
    missing = [
        f"{path}::{name}"
        for path, name in named
        if not re.search(rf"^def {name}\(", (REPO_ROOT / path).read_text(), re.MULTILINE)
    ]
    assert missing == []
