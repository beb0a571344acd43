"""Django settings of the benchmark's workers and producers (``DJANGO_SETTINGS_MODULE``).

Chosen by two environment variables, which bench/run.py sets for each subprocess:

- ``JOBQ_BENCH_SYSTEM``: ``jobq`` (django-jobq alone), ``tasksdb`` (django-tasks-db alone)
  or ``tasks`` (both Django Tasks backends, for the "tasks" scenario);
- ``JOBQ_BENCH_DATABASE_URL``: the system's own benchmark database;
- ``JOBQ_BENCH_QUEUE_LIMITS`` (optional, ``--queue-limits``): the bench queue's
  ``JOBQ['QUEUES']`` limits, as JSON;
- ``JOBQ_BENCH_LIMITED_QUEUE`` (optional, ``--limited-queue``): the limits, as JSON, of the
  queue ``bench-limited``, which the workers serve too and nothing fills.

Both systems get what a production deployment would have: ``DEBUG = False`` (no query log,
no autoreloader) and persistent connections (``CONN_MAX_AGE = 60``; with Django's default 0,
django-tasks-db's worker would reconnect for every task).
"""

import json
import os

import dj_database_url

SYSTEM = os.environ.get("JOBQ_BENCH_SYSTEM", "jobq")

SECRET_KEY = "benchmark-only"  # noqa: S105 (never served)
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get(
            "JOBQ_BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/jobq_bench_run"
        ),
        conn_max_age=60,
    )
}

_APPS = {
    "jobq": ["django_jobq", "benchsite"],
    "tasksdb": ["django_tasks", "django_tasks_db", "benchsite"],
    "tasks": ["django_jobq", "django_tasks", "django_tasks_db", "benchsite"],
}
INSTALLED_APPS = _APPS[SYSTEM]

JOBQ = {"DATABASE": "default", "DEFAULT_QUEUE": "bench", "QUEUES": {}}
if os.environ.get("JOBQ_BENCH_QUEUE_LIMITS"):
    JOBQ["QUEUES"]["bench"] = json.loads(os.environ["JOBQ_BENCH_QUEUE_LIMITS"])
if os.environ.get("JOBQ_BENCH_LIMITED_QUEUE"):
    JOBQ["QUEUES"]["bench-limited"] = json.loads(os.environ["JOBQ_BENCH_LIMITED_QUEUE"])

_TASKS_DB = {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["bench"]}
TASKS = {
    "jobq": {"default": _TASKS_DB},
    "tasksdb": {"default": _TASKS_DB},
    "tasks": {
        "default": _TASKS_DB,
        "jobq": {"BACKEND": "django_jobq.tasks_backend.JobqBackend", "QUEUES": ["bench"]},
    },
}[SYSTEM]
