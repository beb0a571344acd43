"""A chaos worker: ``python -m django_jobq.contrib.chaos.worker [jobq_worker options]``.

Exactly ``manage.py jobq_worker`` (the same command, options, signals and logging), plus the
chaos kinds (:mod:`django_jobq.contrib.chaos.handlers`) and the queue database the chaos run
uses. The run starts these processes itself, with this environment:

- ``DJANGO_SETTINGS_MODULE`` and ``PYTHONPATH``: the run's own;
- ``JOBQ_CHAOS_DATABASE``: JSON of the connection settings (``NAME``, ``USER``, ``PASSWORD``,
  ``HOST``, ``PORT``) of the queue database as the run sees it: what the settings say, or
  the test database a test runner made of them;
- ``JOBQ_CHAOS_EFFECT_LOG``: the file the external handler appends its effects to;
- ``JOBQ_TEST_CRASH_AT`` (for most workers): where the worker kills itself
  (:mod:`django_jobq.contrib.chaos.crashes`; the chaos app, installed in those settings, arms
  it at ``django.setup()``).

Raises (from :func:`main`):
    django.core.exceptions.ImproperlyConfigured: the settings do not install the chaos app:
        its kinds would be registered but no crash point armed.
"""

from __future__ import annotations

import json
import os
import sys

#: The environment variable holding the queue database's connection settings (JSON).
DATABASE_ENV = "JOBQ_CHAOS_DATABASE"


def main(argv: list[str]) -> None:
    import django
    from django.apps import apps
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    from ...conf import get_settings
    from .apps import ChaosAppConfig

    # Before django.setup(): no connection exists yet, so every one opened uses these.
    settings.DATABASES[get_settings().DATABASE].update(json.loads(os.environ[DATABASE_ENV]))
    django.setup()
    if not apps.is_installed(ChaosAppConfig.name):
        raise ImproperlyConfigured(
            f"a chaos worker needs {ChaosAppConfig.name!r} in INSTALLED_APPS "
            f"({settings.SETTINGS_MODULE})."
        )
    from . import handlers  # noqa: F401  (registers the chaos kinds)

    execute_from_command_line([sys.argv[0], "jobq_worker", *argv])


if __name__ == "__main__":
    main(sys.argv[1:])
