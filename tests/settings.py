"""Test settings: the test project plus a test app and a SQLite alias.

``tests.testapp`` holds the handlers the tests enqueue (``tests/testapp/jobs.py``). The SQLite
alias ``other`` stands for "the caller's data lives in another database": it exercises
enqueue's on_commit deferral and the non-PostgreSQL system check.
"""

import os

from testproject.settings import *  # noqa: F403
from testproject.settings import DATABASES, INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.testapp"]

DATABASES = {
    # A test database per test run (pid), so runs from two checkouts on one server, or a run
    # beside a developer's, never share tables: their workers would claim each other's jobs.
    "default": {**DATABASES["default"], "TEST": {"NAME": f"test_jobq_{os.getpid()}"}},
    "other": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
}
