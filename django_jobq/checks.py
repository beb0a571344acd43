"""System checks: configuration errors surface in ``manage.py check``, not at run time.

========================  ==============================================================
id                        meaning
========================  ==============================================================
``django_jobq.E001``      the queue database (``JOBQ['DATABASE']``, or the listeners'
                          ``JOBQ['LISTEN_DATABASE']``) is not PostgreSQL
``django_jobq.E002``      ``JOBQ`` is not a dict or has an unknown key
``django_jobq.E003``      a ``JOBQ`` value has the wrong type or range
``django_jobq.E004``      ``JOBQ['DATABASE']`` (or ``JOBQ['LISTEN_DATABASE']``) names an
                          alias missing from ``DATABASES``
``django_jobq.E005``      retired: no longer raised (it was "the admin is installed but
                          ``django_object_actions`` is not"); the id is not reused
``django_jobq.E006``      a schedule is malformed: ``JOBQ['SCHEDULES']`` is not a dict of
                          dicts with known keys, or a name, kind, payload or ``catch_up``
                          is invalid (the payload must fit the handler, its values the
                          handler's annotations)
``django_jobq.E007``      a schedule's cron expression is invalid
``django_jobq.E008``      a schedule's timezone is not an IANA timezone
``django_jobq.E009``      two schedules have the same name
``django_jobq.E010``      a ``TASKS`` entry using ``JobqBackend`` has invalid ``QUEUES`` or
                          ``OPTIONS``
``django_jobq.E011``      a ``TASKS`` entry names ``JobqBackend``, but Django's Tasks
                          framework is missing (Django 5.2 without the django-tasks backport)
``django_jobq.E012``      ``JOBQ['METRICS_TOKEN']`` is not ``None`` or a string of at least
                          16 characters without surrounding whitespace
``django_jobq.E013``      ``JOBQ['STATS_RETENTION']`` is shorter than an hour
``django_jobq.E014``      the environment's ``PROMETHEUS_MULTIPROC_DIR`` is not a writable
                          directory (prometheus-client would fail on the first metric)
``django_jobq.E015``      ``JOBQ['CONNECT_TIMEOUT']`` is not 2 to 3600 seconds
``django_jobq.E016``      ``JOBQ['STATEMENT_TIMEOUT']`` is not ``None`` or 0.1 to 3600 seconds
``django_jobq.E017``      ``JOBQ['ENQUEUE_UNREGISTERED_KINDS']`` is not a bool
``django_jobq.E018``      ``JOBQ['UNKNOWN_KIND_GRACE']`` is not ``None`` or 1 s to 10 years
``django_jobq.E019``      the test-only ``JOBQ_TEST_CRASH_AT`` is set, but no crash point is
                          armed: the chaos app (``django_jobq.contrib.chaos``) is not installed
``django_jobq.E020``      ``JOBQ['ASYNC_CONCURRENCY']`` is not an int from 1 to 10,000
``django_jobq.W001``      a ``JOBQ['SCHEDULES']`` entry's kind has no handler in this process
``django_jobq.W002``      a ``@job`` is defined in a module that workers do not import (not an
                          installed app's ``jobs`` module, nor imported by one)
``django_jobq.W003``      a Django ``@task`` on ``JobqBackend`` is defined in a module that
                          workers do not import (not an app's ``tasks`` or ``jobs`` module,
                          nor imported by one)
``django_jobq.W004``      autovacuum cannot clean the jobq tables: off for the server, or
                          ``track_counts`` off, or a jobq table's ``autovacuum_enabled`` is
                          false (database checks only)
``django_jobq.W005``      a transaction has held the xmin horizon back longer than
                          ``JOBQ['ALERT_HORIZON_AGE']`` (database checks only)
``django_jobq.W006``      the queue database's MVCC health could not be read (database
                          checks only)
========================  ==============================================================

W004-W006 run only with Django's database checks (``manage.py check --database default``,
naming the queue database's alias): they read the database (:mod:`django_jobq.mvcc`).
"""

from __future__ import annotations

import os
import sys
import types
from typing import Any

from django.apps import apps
from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning
from django.db import DatabaseError, connections
from django.urls import get_resolver

from . import conf, crash_points, mvcc, registry, scheduling, task_results


def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Report every problem in ``JOBQ`` and in the databases it names (the queue's and the
    listeners')."""
    raw = getattr(settings, "JOBQ", {})
    errors: list[CheckMessage] = [Error(msg, id=check_id) for check_id, msg in conf.validate(raw)]
    if errors:
        return errors
    config = conf.get_settings()
    for key, alias in (("DATABASE", config.DATABASE), ("LISTEN_DATABASE", config.LISTEN_DATABASE)):
        if alias is None:
            continue
        if alias not in settings.DATABASES:
            errors.append(
                Error(
                    f"JOBQ[{key!r}] = {alias!r} is not a key of DATABASES.",
                    hint=f"Use one of: {', '.join(sorted(settings.DATABASES))}.",
                    id="django_jobq.E004",
                )
            )
            continue
        vendor = connections[alias].vendor
        if vendor != "postgresql":
            errors.append(
                Error(
                    f"django-jobq needs PostgreSQL, but the database {alias!r} "
                    f"(JOBQ[{key!r}]) is {vendor}.",
                    hint=f"Point JOBQ[{key!r}] at a database using "
                    "django.db.backends.postgresql (PostgreSQL 13 or newer).",
                    id="django_jobq.E001",
                )
            )
    return errors


def check_metrics(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """prometheus-client's multiprocess mode writes to ``PROMETHEUS_MULTIPROC_DIR`` from the
    first metric a process records; a directory it cannot write breaks enqueues and workers."""
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if directory is None or (os.path.isdir(directory) and os.access(directory, os.W_OK | os.X_OK)):
        return []
    return [
        Error(
            f"PROMETHEUS_MULTIPROC_DIR={directory!r} is not a writable directory.",
            hint="Create it (empty) before the processes start, or unset the variable; "
            "see docs/operations.md, 'Metrics'.",
            id="django_jobq.E014",
        )
    ]


def check_crash_points(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """A process started with ``JOBQ_TEST_CRASH_AT`` expects to kill itself at a crash point;
    only the chaos app arms them (at ``django.setup()``). Without it the crash test would run
    and pass while testing nothing, so say so (E019): every management command, the worker
    included, then refuses to run (unless given ``--skip-checks``)."""
    value = os.environ.get(crash_points.ENV_VAR)
    if not value or crash_points.reach is not None:
        return []
    return [
        Error(
            f"{crash_points.ENV_VAR}={value!r} is set, but no crash point is armed: the chaos "
            f"app is not in INSTALLED_APPS.",
            hint="Add 'django_jobq.contrib.chaos' to INSTALLED_APPS to run crash tests (see "
            "docs/chaos.md), or unset the variable; never set it in production.",
            id="django_jobq.E019",
        )
    ]


def check_mvcc_health(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[CheckMessage]:
    """With the database checks of the queue database's alias: W004 for each reason
    autovacuum cannot clean the jobq tables, W005 for each transaction that has held the xmin
    horizon back longer than ``JOBQ['ALERT_HORIZON_AGE']`` (``None``: not checked), W006 if
    the health cannot be read. Nothing when ``JOBQ`` is invalid or the database is not
    PostgreSQL (``check_settings`` reports those)."""
    if not databases or conf.validate(getattr(settings, "JOBQ", {})):
        return []
    config = conf.get_settings()
    alias = config.DATABASE
    if alias not in databases or alias not in settings.DATABASES:
        return []
    if connections[alias].vendor != "postgresql":
        return []
    try:
        health = mvcc.read()
    except DatabaseError as exc:
        return [
            Warning(
                f"The MVCC health of the queue database {alias!r} could not be read: {exc}".strip(),
                hint="jobq_doctor reads the same; see docs/operations.md, 'MVCC health'.",
                id="django_jobq.W006",
            )
        ]
    hint = "manage.py jobq_doctor says more; docs/operations.md ('MVCC health') what to do."
    messages: list[CheckMessage] = [
        Warning(finding.text, hint=hint, id="django_jobq.W004")
        for finding in mvcc.autovacuum_findings(health)
    ]
    if config.ALERT_HORIZON_AGE is not None:
        held = mvcc.horizon_findings(
            health.holders, health.role, max_age=config.ALERT_HORIZON_AGE, max_transactions=None
        )
        messages += [
            Warning(finding.text, hint=hint, id="django_jobq.W005")
            for finding in held
            if finding.problem
        ]
    return messages


def check_schedules(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Report invalid schedules, declared with ``@job(schedule=...)`` or in settings."""
    if conf.validate(getattr(settings, "JOBQ", {})):
        return []  # check_settings reports those, and the schedules cannot be read
    _, problems = scheduling.declared()
    return [
        (Warning if ".W" in check_id else Error)(msg, id=check_id) for check_id, msg in problems
    ]


def check_tasks_backends(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Report invalid ``TASKS`` entries of ``django_jobq.tasks_backend.JobqBackend``."""
    try:
        backends = task_results.jobq_backends()
    except ImportError as exc:
        return [
            Error(
                str(exc),
                hint="On Django 5.2: pip install 'django-jobq[tasks]' (the django-tasks "
                "backport) and add 'django_tasks' to INSTALLED_APPS.",
                id="django_jobq.E011",
            )
        ]
    return [
        Error(message, id=check_id)
        for alias, params in backends.items()
        for check_id, message in conf.validate_tasks_backend(alias, params)
    ]


def check_definitions(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Warn of ``@job`` (W002) and ``@task`` (W003) definitions that a worker would not have:
    workers import each installed app's ``jobs`` module (and ``tasks`` module, with
    ``JobqBackend``), so a definition counts only if one of those was being imported when it
    was registered (:func:`django_jobq.registry.imported_by`). The URLconf is imported
    first, as Django's URL check does, so that jobs defined in views are seen whatever order
    the checks run in."""
    _import_urlconf()
    try:
        with_tasks = bool(task_results.jobq_backends())
    except ImportError:  # E011, reported by check_tasks_backends
        with_tasks = False
    names = ("jobs", "tasks") if with_tasks else ("jobs",)
    imported = {f"{config.name}.{name}" for config in apps.get_app_configs() for name in names}
    reached = _reached_from(imported)
    stray: dict[tuple[bool, str], list[str]] = {}
    for definition in registry.definitions():
        module = str(getattr(definition.func, "__module__", ""))
        # django_jobq's own handlers (the chaos app's) are imported by its own workers.
        if (
            module.startswith("django_jobq.")
            or module in reached
            or imported.intersection(registry.imported_by(definition))
        ):
            continue
        is_task = isinstance(definition.func, task_results.TaskJobHandler)
        stray.setdefault((is_task, module), []).append(definition.kind)
    return [
        _stray_warning(is_task, module, kinds) for (is_task, module), kinds in sorted(stray.items())
    ]


#: Top-level packages whose modules never define a project's jobs: not walked.
_NOT_A_PROJECTS = frozenset(sys.stdlib_module_names) | {"django", "django_jobq", "psycopg"}


def _reached_from(roots: set[str]) -> set[str]:
    """The modules that the already imported ``roots`` import, directly or through each
    other: those named by their globals (a module, or an object's ``__module__``). This
    catches a module that something else (``models.py``, ``AppConfig.ready``) imported
    first, so that ``jobs.py``'s own import of it did not run its body again."""
    reached: set[str] = set()
    todo = [name for name in roots if name in sys.modules]
    while todo:
        name = todo.pop()
        if name in reached:
            continue
        reached.add(name)
        for value in list(vars(sys.modules[name]).values()):
            target: object = (
                value.__name__
                if isinstance(value, types.ModuleType)
                else getattr(getattr(value, "func", value), "__module__", None)
            )
            if (
                isinstance(target, str)
                and target in sys.modules
                and target not in reached
                and target.partition(".")[0] not in _NOT_A_PROJECTS
            ):
                todo.append(target)
    return reached


def _import_urlconf() -> None:
    """Import ``ROOT_URLCONF`` (and the views it imports), as Django's URL check does."""
    if not getattr(settings, "ROOT_URLCONF", None):
        return
    try:
        get_resolver().url_patterns  # noqa: B018 - the property imports the URLconf
    except Exception:  # a broken URLconf is reported by Django's URL check
        return


def _stray_warning(is_task: bool, module: str, kinds: list[str]) -> CheckMessage:
    """W002 (jobs) or W003 (tasks) for the definitions of ``module`` no worker imports."""
    config = apps.get_containing_app_config(module)
    home = f"{config.name}.{'tasks' if is_task else 'jobs'}" if config else None
    what = "@task functions" if is_task else "@job handlers"
    listed = ", ".join(repr(kind) for kind in kinds)
    where = (
        f"{home} (or import {module} from it)"
        if home
        else (
            f"an installed app's {'tasks' if is_task else 'jobs'} module, or import {module} "
            f"from one"
        )
    )
    return Warning(
        f"{module} defines {what} that workers do not import: {listed}. Workers import "
        f"each installed app's jobs module{' and tasks module' if is_task else ''}, and "
        f"{module} is not one of them nor imported by one, so no worker has these kinds: "
        f"their jobs wait for one, then become 'unknown kind' dead letters after "
        f"JOBQ['UNKNOWN_KIND_GRACE'].",
        hint=f"Move them to {where}.",
        id="django_jobq.W003" if is_task else "django_jobq.W002",
    )
