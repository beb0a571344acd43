"""The public API imports in any order, as a script or another service would use it; every
migration imports in a bare project."""

import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

SCRIPT = """
import django
from django.conf import settings

settings.configure(INSTALLED_APPS=["django_jobq"], DATABASES={{}})
django.setup()
from django_jobq import {name}
print({name}.__name__)
"""


@pytest.mark.parametrize("name", ["enqueue", "enqueue_many", "prepare_job", "job", "Schedule"])
def test_each_public_name_imports_first(name):
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(name=name)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == name


MIGRATIONS_SCRIPT = """
import importlib, pkgutil
import django
from django.conf import settings

settings.configure(INSTALLED_APPS=["django_jobq"], DATABASES={})
django.setup()
import django_jobq.migrations as package
names = [info.name for info in pkgutil.iter_modules(package.__path__)]
for name in names:
    importlib.import_module(f"django_jobq.migrations.{name}")
print(len(names))
"""


def test_every_migration_imports_in_a_project_without_the_tests_apps():
    """Without the test settings' apps: the django-tasks backport imports django_stubs_ext,
    which makes ``models.Field[...]`` valid at run time, so a migration that relied on it
    would pass the tests and fail in a project."""
    result = subprocess.run(
        [sys.executable, "-c", MIGRATIONS_SCRIPT],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) >= 10
