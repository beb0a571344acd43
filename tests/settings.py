"""Test settings: the test project plus a test app and a SQLite alias.

``tests.testapp`` holds the handlers the tests enqueue (``tests/testapp/jobs.py``). The SQLite
alias ``other`` stands for "the caller's data lives in another database": it exercises
enqueue's on_commit deferral and the non-PostgreSQL system check.
"""

from testproject.settings import *  # noqa: F403
from testproject.settings import DATABASES, INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.testapp"]

DATABASES = {
    **DATABASES,
    "other": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
}
