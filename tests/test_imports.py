"""The public API imports in any order, as a script or another service would use it."""

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
