"""django-jobq's pytest plugin, registered by the package (entry point ``pytest11``,
name ``django_jobq``; ``-p no:django_jobq`` turns it off).

- the ``jobq`` fixture: a :class:`~django_jobq.testing.JobqFixture` (``jobq.run()``,
  ``jobq.enqueued()``, ``jobq.assert_enqueued()``); it asks for pytest-django's ``db``
  fixture unless the test already has database access (``django_db``, ``transactional_db``);
- the ``jobq_eager`` marker: the test (or, as ``pytestmark``, each test of the module or
  class) runs in eager mode (:class:`~django_jobq.testing.eager`); its keyword arguments
  are eager's (``@pytest.mark.jobq_eager(raise_exceptions=False)``).

pytest imports this module before Django's settings are configured, and in projects
without pytest-django: it imports nothing of Django (nor of django_jobq's models) until a
fixture runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from .fixture import JobqFixture

#: Fixtures of pytest-django that give a test database access.
_DATABASE_FIXTURES = frozenset({"db", "transactional_db", "django_db_reset_sequences"})


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "jobq_eager(raise_exceptions=True, max_jobs=1000): run every job at its enqueue "
        "(django_jobq.testing.eager)",
    )


@pytest.fixture
def jobq(request: pytest.FixtureRequest) -> JobqFixture:
    """The testing helpers of django_jobq.testing, with database access (pytest-django)."""
    has_access = request.node.get_closest_marker("django_db") is not None or bool(
        _DATABASE_FIXTURES & set(request.fixturenames)
    )
    if not has_access and request.config.pluginmanager.hasplugin("django"):
        request.getfixturevalue("db")
    from .fixture import JobqFixture

    return JobqFixture()


@pytest.fixture(autouse=True)
def _jobq_eager_marker(request: pytest.FixtureRequest) -> Iterator[None]:
    """Eager mode for a test marked ``jobq_eager`` (nothing for the others)."""
    marker = request.node.get_closest_marker("jobq_eager")
    if marker is None:
        yield
        return
    from .eager_mode import eager

    with eager(**marker.kwargs):
        yield
