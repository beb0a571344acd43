"""django-jobq: a PostgreSQL-backed, at-least-once job queue for Django.

Public API::

    from django_jobq import job, enqueue, enqueue_many, prepare_job, Schedule
    from django_jobq import aenqueue, aenqueue_many   # from async code

The names are imported on first use, so ``INSTALLED_APPS`` can load this package before
the models are ready. See docs/quickstart.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .decorator import JobDefinition, job
    from .enqueueing import (
        PreparedJob,
        aenqueue,
        aenqueue_many,
        enqueue,
        enqueue_many,
        prepare_job,
    )
    from .schedules import Schedule

_EXPORTS = {
    "aenqueue": "enqueueing",
    "aenqueue_many": "enqueueing",
    "enqueue": "enqueueing",
    "enqueue_many": "enqueueing",
    "prepare_job": "enqueueing",
    "PreparedJob": "enqueueing",
    "job": "decorator",
    "JobDefinition": "decorator",
    "Schedule": "schedules",
}

__all__ = [
    "JobDefinition",
    "PreparedJob",
    "Schedule",
    "aenqueue",
    "aenqueue_many",
    "enqueue",
    "enqueue_many",
    "job",
    "prepare_job",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'django_jobq' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
