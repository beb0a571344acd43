"""The Django Tasks function, run by django-tasks-db (and, in the "tasks" scenario, by
django_jobq.tasks_backend.JobqBackend): one function for both backends."""

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
