"""The Django Tasks function, run by django-tasks-db (and, in the "tasks" scenario, by
django_jobq.tasks_backend.JobqBackend): one function for both backends.

``noop`` is defined on the ``default`` backend (django-tasks-db). Where the settings also
have the ``jobq`` backend (``JOBQ_BENCH_SYSTEM=tasks``), ``noop_on_jobq`` is the same task
on it: defining that variant here, in the app's ``tasks`` module, is what registers the
task with django-jobq in every process, the workers included (they import installed apps'
``tasks`` modules at start; see docs/tasks.md, "How workers find tasks").
"""

from django.conf import settings

try:  # Django 6+
    from django.tasks import task
except ImportError:  # Django 5.2 with the django-tasks backport
    from django_tasks import task

from .recorder import record

QUEUE = "bench"


@task(queue_name=QUEUE)
def noop(n: int) -> None:
    """A task that does nothing but record its start."""
    record(n)


noop_on_jobq = noop.using(backend="jobq") if "jobq" in settings.TASKS else None
