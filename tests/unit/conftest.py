"""The unit tier: tests of pure logic, which need no PostgreSQL and start no process.

``scripts/test --unit`` runs only this directory, with ``DATABASE_URL`` pointing at a closed
port: nothing here may reach a database. pytest-django creates the test database only when
the first test that asks for one runs (``django_db``, ``db``, ``transactional_db``), and
refuses any other database access, so a test here that touches the database fails; asking
for one is refused at collection, below, rather than waiting for a server that is not there.
"""

from __future__ import annotations

from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if UNIT not in item.path.parents:
            continue
        fixtures = item.fixturenames if isinstance(item, pytest.Function) else []
        if item.get_closest_marker("django_db") or "django_db_setup" in fixtures:
            raise pytest.UsageError(
                f"{item.nodeid} asks for a database: tests/unit needs none (put it in tests/)."
            )
