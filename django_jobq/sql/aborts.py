"""Aborts: an operator's request that a running attempt stop (:func:`django_jobq.operations.abort`),
and the worker's look for requests between two heartbeats.

A request is a time in ``jobq_job.abort_requested_at``; the worker's heartbeat
(``sql.leases.HEARTBEAT_JOBS``) and the look below return whether each held job has one.
The handler sees it through its context (``JobContext.abort_requested``); the attempt then
ends as a dead letter with reason "aborted". A claim returns the request too
(``sql.claims``): a job claimed with one (a reclaim after its worker died, a retry written
as the request arrived) is dead-lettered without running. A redrive inserts a fresh job,
without the request (``sql.operations.REDRIVE_DEAD_LETTERS`` does not copy the column).
"""

from __future__ import annotations

from .leases import FENCED

#: Request an abort of the running jobs among ``%(ids)s``, in one statement. Only a running
#: job (its attempt holds a lease) can be aborted: a ready or waiting job is left as it is
#: (cancel deletes a ready one). A job already asked keeps its first request's time and is
#: counted again, so a repeated request is harmless. The row lock is waited for (an
#: operator's write, like cancel): the worker's statements hold it only for a statement.
#: Returns the ids of the running jobs, now with a request.
REQUEST_ABORTS = """
UPDATE jobq_job
SET abort_requested_at = COALESCE(abort_requested_at, now())
WHERE id = ANY(%(ids)s::bigint[]) AND status = 'running'
RETURNING id
"""

_ABORT_REQUESTED_TEMPLATE = """
SELECT job.id FROM jobq_job AS job
JOIN unnest(%(ids)s::bigint[], %(attempts)s::integer[]) AS fence (id, attempt)
    ON {fenced}
WHERE job.abort_requested_at IS NOT NULL
"""
#: The worker's look between two heartbeats: which of the leases it holds (``%(ids)s`` and
#: ``%(attempts)s``, zipped) have an abort requested. A read, fenced (a request on another
#: attempt of the job is not this one's: this lease is lost anyway) and taking no lock, so
#: it neither waits for a locked row nor writes. Returns the ids with a request.
ABORT_REQUESTED = _ABORT_REQUESTED_TEMPLATE.format(fenced=FENCED)
