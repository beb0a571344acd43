"""What a test enqueued, without running it: :func:`enqueued_jobs`, :func:`assert_enqueued`.

::

    client.post("/signup/", {"username": "ada", "email": "ada@example.com"})
    assert_enqueued(send_welcome_email, payload={"user_id": user.pk}, count=1)

They read the jobs table on the queue's database (``JOBQ['DATABASE']``) in the test's
transaction: the live jobs (ready, or running), whoever enqueued them. A job deferred to
another database's commit is not there until that commit (see docs/testing.md).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..conf import get_settings
from ..models import Job
from ..validation import encode_payload
from .kinds import KindOrDefinition, names_of

#: The most jobs an assertion's failure message lists.
LISTED = 50


def enqueued_jobs(
    kind: KindOrDefinition | None = None,
    *,
    queue: str | None = None,
    allow_unregistered: bool = False,
) -> list[Job]:
    """The live jobs (ready or running), in enqueue order (by id).

    Args:
        kind: only jobs of this kind (a string or a ``@job`` definition; its aliases
            count, as the registry resolves them); ``None``: every kind.
        queue: only jobs of this queue; ``None``: every queue.
        allow_unregistered: ``kind`` may be a string no definition of this process
            registers (another service's kind), as ``enqueue(..., allow_unregistered=True)``
            takes; also allowed everywhere by ``JOBQ['ENQUEUE_UNREGISTERED_KINDS']``.

    Raises:
        UnknownKind: ``kind`` is a string no definition registers, not allowed (a typo).
        TypeError: ``kind`` is neither a string nor a definition.
    """
    jobs = Job.objects.using(get_settings().DATABASE).order_by("id")
    if kind is not None:
        jobs = jobs.filter(kind__in=names_of(kind, allow_unregistered=allow_unregistered))
    if queue is not None:
        jobs = jobs.filter(queue=queue)
    return list(jobs)


def assert_enqueued(
    kind: KindOrDefinition,
    *,
    payload: Mapping[str, Any] | None = None,
    count: int | None = None,
    queue: str | None = None,
    priority: int | None = None,
    allow_unregistered: bool = False,
) -> list[Job]:
    """Assert that live jobs of ``kind`` (see :func:`enqueued_jobs`) match, and return them.

    Args:
        kind: a kind string or a ``@job`` definition (its aliases count).
        payload: the whole payload the jobs must have, compared after the JSON encoding
            enqueue applies (``DjangoJSONEncoder``: a date matches its ISO string, a
            ``Decimal`` its string); ``None``: any.
        count: how many must match exactly (``0``: none was enqueued); ``None``: at least one.
        queue, priority: what the jobs must have; ``None``: any.
        allow_unregistered: as :func:`enqueued_jobs`.

    Returns:
        The matching jobs, in enqueue order.

    Raises:
        AssertionError: they do not; the message lists the live jobs (the first
            :data:`LISTED`).
        UnknownKind: as :func:`enqueued_jobs` (so that a misspelt kind cannot make a
            ``count=0`` assertion pass).
        TypeError: ``payload`` cannot be JSON, or ``kind`` is neither a string nor a
            definition.
    """
    expected = None if payload is None else json.loads(encode_payload(dict(payload)))
    every = enqueued_jobs()
    names = names_of(kind, allow_unregistered=allow_unregistered)
    matching = [
        job
        for job in every
        if job.kind in names
        and (expected is None or job.payload == expected)
        and (queue is None or job.queue == queue)
        and (priority is None or job.priority == priority)
    ]
    if len(matching) == count or (count is None and matching):
        return matching
    wanted = _describe_wanted(names[0], expected, count, queue, priority)
    raise AssertionError(f"expected {wanted}; found {len(matching)}. {_listing(every)}")


def _describe_wanted(
    kind: str, payload: Any, count: int | None, queue: str | None, priority: int | None
) -> str:
    how_many = "at least 1" if count is None else str(count)
    noun = "job" if count == 1 else "jobs"
    wanted = f"{how_many} {noun} of kind {kind!r}"
    if payload is not None:
        wanted += f" with payload {payload!r}"
    if queue is not None:
        wanted += f" in queue {queue!r}"
    if priority is not None:
        wanted += f" at priority {priority}"
    return wanted


def _listing(jobs: list[Job]) -> str:
    """The live jobs, one a line, as an assertion's message lists them."""
    if not jobs:
        return "No job is enqueued."
    lines = [
        f"  job {job.pk} {job.kind} queue={job.queue!r} priority={job.priority} "
        f"status={job.status} payload={job.payload!r}"
        for job in jobs[:LISTED]
    ]
    if len(jobs) > LISTED:
        lines.append(f"  ... and {len(jobs) - LISTED} more")
    return f"Enqueued ({len(jobs)}):\n" + "\n".join(lines)
