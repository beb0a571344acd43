"""Test settings: the test project plus a SQLite alias.

The SQLite alias ``other`` stands for "the caller's data lives in another database": it
exercises enqueue's on_commit deferral and the non-PostgreSQL system check.
"""

from testproject.settings import *  # noqa: F403
from testproject.settings import DATABASES

DATABASES = {
    **DATABASES,
    "other": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
}
