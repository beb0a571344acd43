"""A chaos worker: ``python -m django_jobq.chaos.worker [jobq_worker options]``.

Exactly ``manage.py jobq_worker`` (the same command, options, signals and logging), plus the
chaos kinds (:mod:`django_jobq.chaos.handlers`) and the queue database the chaos run uses.
The run starts these processes itself, with this environment:

- ``DJANGO_SETTINGS_MODULE`` and ``PYTHONPATH``: the run's own;
- ``JOBQ_CHAOS_DATABASE``: JSON of the connection settings (``NAME``, ``USER``, ``PASSWORD``,
  ``HOST``, ``PORT``) of the queue database as the run sees it: what the settings say, or
  the test database a test runner made of them;
- ``JOBQ_CHAOS_EFFECT_LOG``: the file the external handler appends its effects to;
- ``JOBQ_TEST_CRASH_AT`` (for most workers): where the worker kills itself
  (:mod:`django_jobq.faults`).
"""

from __future__ import annotations

import json
import os
import sys

#: The environment variable holding the queue database's connection settings (JSON).
DATABASE_ENV = "JOBQ_CHAOS_DATABASE"


def main(argv: list[str]) -> None:
    import django
    from django.conf import settings
    from django.core.management import execute_from_command_line

    from ..conf import get_settings

    # Before django.setup(): no connection exists yet, so every one opened uses these.
    settings.DATABASES[get_settings().DATABASE].update(json.loads(os.environ[DATABASE_ENV]))
    django.setup()
    from . import handlers  # noqa: F401  (registers the chaos kinds)

    execute_from_command_line([sys.argv[0], "jobq_worker", *argv])


if __name__ == "__main__":
    main(sys.argv[1:])
