"""Eager mode: every enqueue runs its job at once, in the enqueue call.

::

    @eager()                          # a TestCase class, a test function, or
    class SignupTests(TestCase): ...  # with eager(): ... ; pytest: @pytest.mark.jobq_eager

In eager mode ``enqueue()`` still validates the job and writes its row (so the payload
makes the JSON round trip a worker's handler sees), then, before returning, runs it as
:func:`~django_jobq.testing.run_jobs` would: claimed by the worker's claim, in the caller's
transaction, its outcome recorded, a failure's exception raised out of ``enqueue()`` (by
default). A job a handler enqueues runs inside that handler's run, nested.

Prefer running the jobs after the code under test returns (``run_jobs()``): eager mode
runs a job before the caller's transaction commits, so a test passes that a real worker
would fail: the job sees rows the caller later rolls back, or a job enqueued in the middle
of a view runs before the rest of the view has written what it needs, and jobs run in
enqueue order, nested, rather than in claim order (priority, then ``run_at``). A delayed
job runs at once too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from django.test.utils import TestContextDecorator

from .. import enqueueing, registry
from ..models import Job
from .runs import DEFAULT_MAX_JOBS, TooManyJobs, run_until

#: How deep eager jobs may nest (a job enqueued by an eager job's handler runs inside it):
#: deeper is a chain that never ends, stopped before Python's recursion limit.
MAX_DEPTH = 20


class eager(TestContextDecorator):  # lower case, as Django's override_settings
    """Run every job at its enqueue, while enabled: as a class decorator (a
    ``unittest.TestCase``: for each test), a function decorator, or a context manager.

    Args:
        raise_exceptions: ``True`` (the default): a failed attempt's exception is raised
            out of the ``enqueue()`` call once its outcome (retry, dead letter) is recorded;
            ``False``: outcomes are only recorded (see them with ``enqueued_jobs()`` and the
            dead letters).
        max_jobs: the most attempts one enqueue's run makes (see :func:`run_until`).

    Jobs of kinds this process does not register (another service's) are left enqueued.
    An enqueue deferred to another database's commit (see docs/testing.md) runs its job
    when that insert happens.

    Raises (out of ``enqueue()``):
        Exception, JobDeadLettered: as ``run_jobs``, with ``raise_exceptions``.
        TooManyJobs: jobs nested :data:`MAX_DEPTH` deep, or ``max_jobs`` attempts made.
    """

    def __init__(self, *, raise_exceptions: bool = True, max_jobs: int = DEFAULT_MAX_JOBS) -> None:
        super().__init__()
        self.raise_exceptions = raise_exceptions
        self.max_jobs = max_jobs
        self._replaced: list[Callable[[Sequence[Job]], None] | None] = []
        self._depth = 0

    def enable(self) -> None:
        self._replaced.append(enqueueing.after_insert)
        enqueueing.after_insert = self.run

    def disable(self) -> None:
        enqueueing.after_insert = self._replaced.pop()

    def run(self, jobs: Sequence[Job]) -> None:
        """Run each of ``jobs`` (just inserted) that a handler of this process runs."""
        if self._depth >= MAX_DEPTH:
            raise TooManyJobs(f"eager mode met jobs enqueued by jobs {MAX_DEPTH} levels deep", [])
        self._depth += 1
        try:
            for job in jobs:
                if registry.get(job.kind) is not None:
                    run_until(
                        job.pk,
                        queue=job.queue,
                        kind=job.kind,
                        raise_exceptions=self.raise_exceptions,
                        max_jobs=self.max_jobs,
                    )
        finally:
            self._depth -= 1
