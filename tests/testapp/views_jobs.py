"""A ``@job`` and a ``@task`` defined where workers do not look: a views module, imported
by a URLconf (tests/testapp/urls_misplaced.py) and not by ``tests/testapp/jobs.py`` or
``tasks.py``. tests/test_mistakes.py proves that ``manage.py check`` warns of both
(``django_jobq.W002``, ``W003``), and what a worker does with the task's jobs."""

from typing import TYPE_CHECKING

from django_jobq import job

if TYPE_CHECKING:  # django-stubs describe the core module; the backport has the same API.
    from django.tasks import task
else:
    try:
        from django.tasks import task
    except ImportError:  # Django 5.2: the django-tasks backport
        from django_tasks import task


@job
def mistakes_misplaced_job(label: str) -> None:
    """Never run by a worker: no worker imports this module."""


@task
def mistakes_misplaced_task(label: str) -> str:
    return label
