"""The ``jobq`` pytest fixture's object: the testing helpers at hand in a test.

::

    def test_signup(client, jobq):
        client.post("/signup/", {"username": "ada", "email": "ada@example.com"})
        jobq.assert_enqueued(send_welcome_email, count=1)
        jobq.run()
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

from ..models import Job
from .assertions import assert_enqueued, enqueued_jobs
from .kinds import KindOrDefinition
from .runs import DEFAULT_MAX_JOBS, RanJob, run_jobs


class JobqFixture:
    """:func:`~django_jobq.testing.run_jobs`, :func:`~django_jobq.testing.enqueued_jobs`
    and :func:`~django_jobq.testing.assert_enqueued` as methods, with the same arguments,
    returns and exceptions."""

    def run(
        self,
        *,
        queues: Collection[str] | None = None,
        kinds: Iterable[KindOrDefinition] | None = None,
        include_scheduled: bool = False,
        raise_exceptions: bool = True,
        max_jobs: int = DEFAULT_MAX_JOBS,
    ) -> list[RanJob]:
        """:func:`~django_jobq.testing.run_jobs`."""
        return run_jobs(
            queues=queues,
            kinds=kinds,
            include_scheduled=include_scheduled,
            raise_exceptions=raise_exceptions,
            max_jobs=max_jobs,
        )

    def enqueued(
        self, kind: KindOrDefinition | None = None, *, queue: str | None = None
    ) -> list[Job]:
        """:func:`~django_jobq.testing.enqueued_jobs`."""
        return enqueued_jobs(kind, queue=queue)

    def assert_enqueued(
        self,
        kind: KindOrDefinition,
        *,
        payload: Mapping[str, Any] | None = None,
        count: int | None = None,
        queue: str | None = None,
        priority: int | None = None,
    ) -> list[Job]:
        """:func:`~django_jobq.testing.assert_enqueued`."""
        return assert_enqueued(kind, payload=payload, count=count, queue=queue, priority=priority)
