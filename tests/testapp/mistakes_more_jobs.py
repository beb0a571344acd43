"""A ``@job`` in a module that ``tests/testapp/jobs.py`` imports: workers have it (their
import of ``jobs`` imports this module), so ``manage.py check`` does not warn of it."""

from django_jobq import job


@job
def mistakes_imported_by_jobs(label: str) -> None:
    """Registered whenever ``tests.testapp.jobs`` is imported."""
