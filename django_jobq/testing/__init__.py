"""What a project needs to test its own jobs (docs/testing.md).

::

    from django_jobq.testing import assert_enqueued, eager, enqueued_jobs, run_jobs

- :func:`run_jobs`: run the jobs the test enqueued, to completion, in the test's own
  transaction, with the worker's claim, handler call and outcome recording;
- :func:`enqueued_jobs`, :func:`assert_enqueued`: what was enqueued, without running it;
- :class:`eager`: every enqueue runs its job at once (and why not to prefer it);
- the pytest plugin (:mod:`django_jobq.testing.plugin`, registered by the package's
  ``pytest11`` entry point): the ``jobq`` fixture (:class:`JobqFixture`) and the
  ``jobq_eager`` marker.

The names are imported on first use: pytest imports this package (through the plugin)
before Django's settings are configured.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .assertions import assert_enqueued, enqueued_jobs
    from .eager_mode import eager
    from .fixture import JobqFixture
    from .runs import JobDeadLettered, RanJob, TooManyJobs, run_jobs

_EXPORTS = {
    "run_jobs": "runs",
    "RanJob": "runs",
    "TooManyJobs": "runs",
    "JobDeadLettered": "runs",
    "enqueued_jobs": "assertions",
    "assert_enqueued": "assertions",
    "eager": "eager_mode",
    "JobqFixture": "fixture",
}

__all__ = [
    "JobDeadLettered",
    "JobqFixture",
    "RanJob",
    "TooManyJobs",
    "assert_enqueued",
    "eager",
    "enqueued_jobs",
    "run_jobs",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'django_jobq.testing' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
