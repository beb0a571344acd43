"""The test project's URLconf plus a views module defining a ``@job`` and a ``@task``
(``JOBQ_TEST_MISPLACED=1`` selects it, see tests/settings.py)."""

from testproject.urls import urlpatterns

from . import views_jobs  # noqa: F401  (as a URLconf imports its views)

__all__ = ["urlpatterns"]
