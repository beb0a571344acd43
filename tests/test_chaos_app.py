"""The chaos suite is an opt-in app: a project without ``django_jobq.contrib.chaos`` has no
``jobq_chaos`` command and imports none of its code, even while a worker runs jobs through
every crash point of the core; ``JOBQ_TEST_CRASH_AT`` there is system check E019, which
stops the worker. With the app, the command exists and the variable kills the worker at
the armed point (docs/chaos.md)."""

import json
import os
import re
import subprocess
import sys

import pytest
from django.core.management import get_commands

from django_jobq import crash_points
from django_jobq.models import Job
from tests.conftest import REPO_ROOT, database_url
from tests.factories import JobFactory

#: Enqueue a plain job (acked by the worker's completer) and one that acks in its own
#: transaction (``ctx.atomic()``), run them with a burst worker, and say what was loaded.
#: Both pass every crash point of the core: before_claim, after_claim, after_handler and
#: after_ack (the completer's and ``ctx.atomic()``'s).
WORKER_SCRIPT = """
import json, sys
import django
django.setup()
from django.core.management import get_commands
from django_jobq import crash_points, enqueue, job
from django_jobq.worker import Worker

@job(name="optin.plain", queue="optin")
def plain():
    pass

@job(name="optin.atomic", queue="optin", takes_context=True)
def atomic(ctx):
    with ctx.atomic():
        pass

enqueue("optin.plain")
enqueue("optin.atomic")
stats = Worker(queues=["optin"], burst=True, scheduler=False, poll_interval=0.05).run()
print(json.dumps({
    "succeeded": stats.outcome_counts.succeeded,
    "command": "jobq_chaos" in get_commands(),
    "contrib": sorted(m for m in sys.modules if m.startswith("django_jobq.contrib")),
    "armed": crash_points.reach is not None,
}))
"""


def run_python(settings_module, *args, **extra_env):
    """Run ``python *args`` on the test database with ``settings_module``; no crash is armed
    unless ``extra_env`` arms one."""
    env = {key: value for key, value in os.environ.items() if key != crash_points.ENV_VAR}
    return subprocess.run(
        [sys.executable, *args],
        cwd=REPO_ROOT,
        env={
            **env,
            "DATABASE_URL": database_url(),
            "DJANGO_SETTINGS_MODULE": settings_module,
            "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "testproject")]),
            **extra_env,
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def manage(settings_module, *args, **extra_env):
    manage_py = str(REPO_ROOT / "testproject" / "manage.py")
    return run_python(settings_module, manage_py, *args, **extra_env)


@pytest.mark.django_db(transaction=True)
def test_without_the_app_there_is_no_command_and_no_chaos_code_after_a_worker_ran():
    done = run_python("testproject.settings", "-c", WORKER_SCRIPT)  # no chaos app
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen == {"succeeded": 2, "command": False, "contrib": [], "armed": False}


@pytest.mark.django_db(transaction=True)
def test_with_the_app_the_command_exists_and_its_app_is_loaded():
    assert get_commands()["jobq_chaos"] == "django_jobq.contrib.chaos"  # this process's
    done = run_python("tests.settings", "-c", WORKER_SCRIPT)  # the same script, with the app
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert (seen["succeeded"], seen["command"], seen["armed"]) == (2, True, False)
    assert "django_jobq.contrib.chaos.apps" in seen["contrib"]


@pytest.mark.django_db(transaction=True)
def test_the_crash_variable_without_the_app_is_e019_and_the_worker_refuses_to_start():
    # A kind of the test project's, so that a worker which started would claim it.
    JobFactory(kind="shop.jobs.send_welcome_email", payload={"user_id": 1})
    for command in (["check"], ["jobq_worker", "--burst", "--no-scheduler"]):
        done = manage("testproject.settings", *command, JOBQ_TEST_CRASH_AT="after_claim:1")
        assert done.returncode == 1, done.stdout + done.stderr
        assert "django_jobq.E019" in done.stderr
        assert "'django_jobq.contrib.chaos'" in done.stderr  # the hint names the app
    assert Job.objects.get().attempts == 0  # the worker claimed nothing


@pytest.mark.django_db(transaction=True)
def test_with_the_app_the_crash_variable_kills_the_worker_at_the_armed_point():
    JobFactory()  # a tests.testapp kind: the worker of tests.settings has it
    done = manage(
        "tests.settings",
        "jobq_worker",
        "--burst",
        "--no-scheduler",
        JOBQ_TEST_CRASH_AT="after_claim:1",
    )
    assert done.returncode == -9, done.stderr  # SIGKILL
    assert "jobq crash point: SIGKILL at after_claim (arrival 1)" in done.stderr
    job = Job.objects.get()
    assert (job.status, job.attempts) == (Job.Status.RUNNING, 1)  # claimed, never run


def test_the_documented_settings_module_adds_the_command_to_the_projects(tmp_path):
    """docs/chaos.md's ``settings_chaos.py``, verbatim, beside a project's settings (the test
    project's): ``manage.py help --settings`` lists ``jobq_chaos`` with it, not without."""
    doc = (REPO_ROOT / "docs" / "chaos.md").read_text()
    (snippet,) = re.findall(r"```python\n(# myproject/settings_chaos\.py.*?)```", doc, re.DOTALL)
    project = tmp_path / "myproject"
    project.mkdir()
    (project / "__init__.py").write_text("")
    (project / "settings.py").write_text("from testproject.settings import *  # noqa: F403\n")
    (project / "settings_chaos.py").write_text(snippet)
    path = os.pathsep.join([str(tmp_path), str(REPO_ROOT), str(REPO_ROOT / "testproject")])
    for settings_module, listed in [
        ("myproject.settings", False),
        ("myproject.settings_chaos", True),
    ]:
        done = manage(settings_module, "help", "--settings", settings_module, PYTHONPATH=path)
        assert done.returncode == 0, done.stderr
        assert ("jobq_chaos" in done.stdout) is listed
