"""Test settings: the test project plus a test app, the chaos app, more database aliases and
Django tasks.

``tests.testapp`` holds the handlers the tests enqueue (``tests/testapp/jobs.py``) and the
``@task`` functions (``tests/testapp/tasks.py``), which run on django-jobq through ``TASKS``.
The SQLite alias ``other`` stands for "the caller's data lives in another database": it
exercises enqueue's on_commit deferral and the non-PostgreSQL system check. The opt-in chaos
app (``django_jobq.contrib.chaos``) is installed for tests/test_chaos.py and the chaos runs of
tests/acceptance; ``testproject.settings`` is the project without it.
"""

import importlib.util
import os

from testproject.settings import *  # noqa: F403
from testproject.settings import DATABASES, INSTALLED_APPS, JOBQ

INSTALLED_APPS = [*INSTALLED_APPS, "django_jobq.contrib.chaos", "tests.testapp"]

# The tests enqueue kinds that no handler registers ("x", "some.kind"), as a project does the
# jobs of another service; tests/test_mistakes.py proves the default (refused) itself.
JOBQ = {**JOBQ, "ENQUEUE_UNREGISTERED_KINDS": True}

if os.environ.get("JOBQ_TEST_MISPLACED"):  # a URLconf importing a @job and a @task from views
    ROOT_URLCONF = "tests.testapp.urls_misplaced"

DATABASES = {
    # A test database per test run (pid), so runs from two checkouts on one server, or a run
    # beside a developer's, never share tables: their workers would claim each other's jobs.
    "default": {**DATABASES["default"], "TEST": {"NAME": f"test_jobq_{os.getpid()}"}},
    "other": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
    # A second PostgreSQL database, for tests that put the queue there (JOBQ["DATABASE"] =
    # "queue") while users and sessions stay in "default". pytest-django creates it only for
    # a run that has such a test (they ask for it: ``django_db(databases=[..., "queue"])``).
    "queue": {**DATABASES["default"], "TEST": {"NAME": f"test_jobq_{os.getpid()}_queue"}},
}

if os.environ.get("JOBQ_TEST_LISTEN_DATABASE_URL"):  # a worker whose listener connects apart
    import dj_database_url

    DATABASES["listener"] = dj_database_url.parse(os.environ["JOBQ_TEST_LISTEN_DATABASE_URL"])
    JOBQ = {**JOBQ, "LISTEN_DATABASE": "listener"}  # type: ignore[dict-item]

if importlib.util.find_spec("django.tasks") is None:  # Django 5.2: the django-tasks backport
    INSTALLED_APPS.append("django_tasks")

TASKS = {
    "default": {
        "BACKEND": "django_jobq.tasks_backend.JobqBackend",
        "QUEUES": ["default", "tasks", "crash"],
        # Short retry waits, so a task that fails twice succeeds within a test.
        "OPTIONS": {"RETRY_BACKOFF_BASE": 0.01, "RETRY_BACKOFF_CAP": 0.01},
    },
}

if os.environ.get("JOBQ_TEST_UNKNOWN_KIND_GRACE"):  # a worker that gives up on kinds sooner
    JOBQ = {**JOBQ, "UNKNOWN_KIND_GRACE": float(os.environ["JOBQ_TEST_UNKNOWN_KIND_GRACE"])}

if os.environ.get("JOBQ_TEST_ROOT_LOGGING"):  # a project that logs everything through root
    LOGGING = {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"root": {"format": "root-handler %(levelname)s %(name)s: %(message)s"}},
        "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "root"}},
        "root": {"handlers": ["stderr"], "level": "WARNING"},
    }

if os.environ.get("JOBQ_TEST_RENAMES_SCHEDULE"):  # one release's definition of a schedule
    import json

    _SCHEDULE = {
        "kind": "tests.testapp.jobs.renames_tick",
        **json.loads(os.environ["JOBQ_TEST_RENAMES_SCHEDULE"]),  # cron, payload, catch_up
    }
    # testproject's JOBQ holds only numbers, so mypy types its values as float.
    JOBQ = {**JOBQ, "SCHEDULES": {"renames-overlap": _SCHEDULE}}  # type: ignore[dict-item]
