"""Run the jobs a test enqueued, to completion, in the test's own transaction.

::

    @pytest.mark.django_db
    def test_signup_sends_the_welcome_email(client, mailoutbox):
        client.post("/signup/", {"username": "ada", "email": "ada@example.com"})
        ran = run_jobs()                                  # -> [RanJob(...)]
        assert [job.kind for job in ran] == ["shop.jobs.send_welcome_email"]
        assert mailoutbox[0].to == ["ada@example.com"]

:func:`run_jobs` is a worker that lives in the test: it claims due jobs with the worker's
own claim statement, on Django's connection to the queue database (``JOBQ['DATABASE']``),
so inside the test's transaction, where the jobs the test enqueued are visible; runs each
handler as a worker's handler thread does (:func:`django_jobq.worker.executor.execute`:
``takes_context``, ``Retry``, ``Fail``, ``retry_on``, backoff, Django tasks); and records
each outcome with the worker's outcome recorder (ack, retry at now + backoff, dead letter;
a task's result with it) and sends the same signals. Jobs the handlers enqueue run too,
until no due job is left.

What differs from a worker, because the test's transaction never commits:

- PostgreSQL's ``now()`` is the time the test's transaction began, for the whole test: a
  retry's ``run_at`` is counted from it, and a job enqueued with a delay is not due until
  :func:`run_jobs` is told ``include_scheduled=True``;
- each attempt runs in a savepoint, so that a handler whose SQL statement fails does not
  break the test's transaction (a worker's handler runs in autocommit, where it would not
  either): after such a failure the attempt's writes are rolled back, and its outcome is
  recorded;
- ``ctx.atomic()`` becomes a savepoint of the test's transaction (see
  :meth:`django_jobq.context.JobContext.atomic`);
- ``task_finished`` and the ``job_*`` signals are sent at once (a worker sends them once
  the outcome committed); no metrics are counted and nothing is logged per job;
- leases never lapse and heartbeats always succeed: a sync handler's ``max_runtime`` is
  not enforced (an async handler's is: its task is cancelled, as on a worker).

Called outside a transaction (a ``transaction=True`` test, a ``TransactionTestCase``), it
runs on Django's connection in autocommit, as a worker would: each write commits.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
from asgiref.sync import async_to_sync
from django.db import connections, transaction
from psycopg.pq import TransactionStatus

from .. import claims, lanes, operations, outcomes, registry, sql, task_results
from ..claims import ClaimedJob
from ..conf import get_settings
from ..outcomes import Action, Outcome
from ..worker import executor
from ..worker.held import HeldJob
from ..worker.observer import outcome_name, send_outcome_signal
from .kinds import KindOrDefinition, registered_names

#: The worker id the testing helpers' claims record on a job's row.
WORKER_ID = "django_jobq.testing"

#: The most attempts one :func:`run_jobs` makes unless told otherwise: far more than a test
#: enqueues, far fewer than a job that enqueues itself forever would make.
DEFAULT_MAX_JOBS = 1000


@dataclass(frozen=True)
class RanJob:
    """One attempt :func:`run_jobs` made, and how it ended.

    Attributes:
        job_id: the job's id.
        kind: the kind stored in the job's row (an alias stays as it was enqueued).
        queue: the job's queue.
        payload: the payload the handler was called with (decoded from the stored JSON).
        attempt: this attempt's number, 1 for the first run.
        outcome: ``"succeeded"``, ``"retried"`` (ready again at ``now() + retry_delay``),
            ``"dead_lettered"`` (see :attr:`reason`), or ``"lease_lost"`` (the handler
            raised ``LeaseLost``; nothing recorded).
        returned: what the handler returned (a Django task's: its return value as JSON
            text, as stored in its result); ``None`` for a failed attempt.
        error: the failed attempt's error (``"ValueError: ..."``), else ``""``.
        reason: a dead letter's reason, else ``""``.
        retry_delay: seconds until the retry, for ``"retried"``.
        exception: the exception the handler raised, else ``None``.
    """

    job_id: int
    kind: str
    queue: str
    payload: dict[str, Any]
    attempt: int
    outcome: str
    returned: Any = None
    error: str = ""
    reason: str = ""
    retry_delay: float = 0.0
    exception: BaseException | None = field(default=None, repr=False, compare=False)


class TooManyJobs(RuntimeError):
    """The testing helpers stopped a chain of jobs at their cap: :func:`run_jobs` made
    ``max_jobs`` attempts and a due job was still left, or eager mode met jobs enqueued by
    jobs :data:`~django_jobq.testing.eager_mode.MAX_DEPTH` levels deep. Most likely a job that
    enqueues another without end (or, with ``include_scheduled``, retries forever). The job
    claimed last, if any, is left running, unrun. Attribute: ``ran`` (the attempts made, a
    list of :class:`RanJob`)."""

    def __init__(self, message: str, ran: list[RanJob]) -> None:
        self.ran = ran
        kinds = sorted({job.kind for job in ran[-20:]})
        last = f" The last kinds run: {', '.join(kinds)}." if kinds else ""
        super().__init__(f"{message}: does a job enqueue another without end?{last}")


def _too_many(max_jobs: int, ran: list[RanJob]) -> TooManyJobs:
    return TooManyJobs(
        f"run_jobs(max_jobs={max_jobs}) made {max_jobs} attempts and due jobs are still left "
        f"(pass a larger max_jobs if the test really enqueues more)",
        ran,
    )


class JobDeadLettered(AssertionError):
    """A job became a dead letter without an exception of its handler's to show for it:
    refused unrun (expired, a row enqueue never writes, no attempt left) or a handler that
    returned an awaitable. Attribute: ``ran`` (the :class:`RanJob`)."""

    def __init__(self, ran: RanJob) -> None:
        self.ran = ran
        super().__init__(
            f"job {ran.job_id} {ran.kind} attempt {ran.attempt} was dead-lettered: {ran.reason}"
        )


def run_jobs(
    *,
    queues: Collection[str] | None = None,
    kinds: Iterable[KindOrDefinition] | None = None,
    include_scheduled: bool = False,
    raise_exceptions: bool = True,
    max_jobs: int = DEFAULT_MAX_JOBS,
) -> list[RanJob]:
    """Run due jobs in the caller's transaction, one at a time in claim order (priority,
    then ``run_at``, then id), until none is left, and return what ran.

    Args:
        queues: run only the jobs of these queues; ``None``: every queue.
        kinds: run only the jobs of these kinds (strings or ``@job`` definitions; a kind's
            aliases are included; a Django task's kind is its ``module_path``); ``None``:
            every kind registered in this process. Jobs of other kinds stay enqueued.
        include_scheduled: also run ready jobs whose ``run_at`` is in the future (a
            delayed job, or a retry waiting for its backoff): before each claim they are
            made due, as the admin's "run now" does. Without it a retry with a backoff is
            left for the test to see (or to run with a second call).
        raise_exceptions: ``True`` (the default): once a failed attempt's outcome is
            recorded (a retry, or a dead letter), the handler's exception is raised in the
            test (with a note naming the job and the outcome), and nothing after it runs.
            ``False``: every attempt's outcome is only reported.
        max_jobs: the most attempts to make (each retry counts).

    Returns:
        A :class:`RanJob` per attempt, in the order they ran; ``[]`` when nothing was due.

    Raises:
        Exception: with ``raise_exceptions``, the exception a handler raised (any type;
            the outcome was recorded first).
        JobDeadLettered: with ``raise_exceptions``, a job dead-lettered without an
            exception (refused unrun, say).
        TooManyJobs: ``max_jobs`` attempts were made and a due job was still left.
        UnknownKind: a kind in ``kinds`` is not registered in this process.
    """
    names = None if kinds is None else registered_names(kinds)
    return _run(queues, names, include_scheduled, raise_exceptions, max_jobs)


def run_until(
    job_id: int, *, queue: str, kind: str, raise_exceptions: bool, max_jobs: int
) -> list[RanJob]:
    """Run the jobs of ``kind`` in ``queue`` until the job ``job_id`` has run once (made
    due first if scheduled); those ahead of it in claim order run first. Eager mode's run
    (:mod:`django_jobq.testing.eager_mode`). Raises as :func:`run_jobs`."""
    operations.run_now([job_id])
    return _run([queue], [kind], False, raise_exceptions, max_jobs, last=job_id)


def _run(
    queues: Collection[str] | None,
    kinds: list[str] | None,
    include_scheduled: bool,
    raise_exceptions: bool,
    max_jobs: int,
    *,
    last: int | None = None,
) -> list[RanJob]:
    """:func:`run_jobs` with the kinds resolved (``None``: those registered here), stopping
    once the job ``last`` (if given) has run."""
    ran: list[RanJob] = []
    while (job := _claim_one(queues, kinds, include_scheduled)) is not None:
        if len(ran) >= max_jobs:
            raise _too_many(max_jobs, ran)
        ran.append(_attempt(job, raise_exceptions=raise_exceptions))
        if job.id == last:
            break
    return ran


def _claim_one(
    queues: Collection[str] | None, kinds: list[str] | None, include_scheduled: bool
) -> ClaimedJob | None:
    """Lease the first due job (of ``queues`` and ``kinds``; ``None``: any, of the kinds
    registered here) with the worker's claim, in the caller's transaction; ``None`` if none
    is due. Jobs enqueued in that transaction are made due first (``sql.testing``)."""
    alias = get_settings().DATABASE
    with _driver_cursor(alias) as cursor:
        cursor.execute(
            sql.testing.MAKE_JOBS_DUE,
            {
                "scheduled": include_scheduled,
                "kinds": registry.claimable_kinds() if kinds is None else kinds,
                "queues": None if queues is None else list(queues),
            },
        )
        claimed = claims.claim(cursor, worker_id=WORKER_ID, limit=1, queues=queues, kinds=kinds)
    return claimed[0] if claimed else None


@contextlib.contextmanager
def _driver_cursor(alias: str) -> Iterator[psycopg.Cursor[Any]]:
    """A psycopg cursor on Django's connection ``alias`` (the test's transaction, if open),
    as the claim and outcome functions take one."""
    connection = connections[alias]
    connection.ensure_connection()
    with connection.connection.cursor() as cursor:
        yield cursor


def _attempt(job: ClaimedJob, *, raise_exceptions: bool) -> RanJob:
    """Run one claimed job's attempt and record its outcome, in the caller's transaction.

    Raises:
        Exception, JobDeadLettered: as :func:`run_jobs`, with ``raise_exceptions``.
    """
    outcome = _execute(job)
    alias = get_settings().DATABASE
    with _driver_cursor(alias) as cursor:
        recorder = outcomes.Recorder(task_results.TaskOutcomes())
        recorded = recorder.record(cursor, outcome)
        if job.ordering_key is not None and job.id in recorded:  # as a worker moves it on
            lanes.promote(cursor, [job.ordering_key])
    recorder.announce(recorded)
    name = outcome_name(outcome, applied=job.id in recorded)
    if name != "lease_lost":
        send_outcome_signal(outcome, name)
    ran = _ran(outcome, name)
    if raise_exceptions and outcome.exception is not None:
        outcome.exception.add_note(_note(ran))
        raise outcome.exception
    if raise_exceptions and outcome.action is Action.DEAD_LETTER:
        raise JobDeadLettered(ran)
    return ran


def _execute(job: ClaimedJob) -> Outcome:
    """The outcome of one attempt of ``job``, its handler run in a savepoint of the caller's
    transaction (when one is open), rolled back if a statement of the handler's failed."""
    alias = get_settings().DATABASE
    connection = connections[alias]
    definition = registry.get(job.kind)
    asynchronous = definition is not None and definition.is_async
    in_transaction = connection.in_atomic_block
    with transaction.atomic(using=alias) if in_transaction else contextlib.nullcontext():
        held = HeldJob(
            job, asynchronous=asynchronous, outer_atomic_blocks=len(connection.atomic_blocks)
        )
        if asynchronous:
            # Awaited on an event loop of asgiref's, whose sync_to_async calls (the async
            # ORM, ctx.aatomic) come back to this thread: the test's connection.
            outcome = async_to_sync(executor.execute_async)(held, _extend)
        else:
            outcome = executor.execute(held, _extend)
        if in_transaction and _transaction_failed(alias):
            transaction.set_rollback(True, using=alias)  # back to the savepoint
    return outcome


def _extend(held: HeldJob) -> bool:
    """``JobContext.heartbeat`` in a test: the lease is the test's, it always holds."""
    return True


def _transaction_failed(alias: str) -> bool:
    """The handler left the transaction failed (a statement of its raised, outside a
    savepoint of its own) or marked for rollback."""
    connection = connections[alias]
    status = connection.connection.info.transaction_status
    return status is TransactionStatus.INERROR or connection.needs_rollback


def _ran(outcome: Outcome, name: str) -> RanJob:
    job = outcome.job
    return RanJob(
        job_id=job.id,
        kind=job.kind,
        queue=job.queue,
        payload=job.payload,
        attempt=job.attempt,
        outcome=name,
        returned=outcome.returned,
        error=outcome.error,
        reason=str(outcome.reason),
        retry_delay=outcome.retry_delay if outcome.action is Action.RETRY else 0.0,
        exception=outcome.exception,
    )


def _note(ran: RanJob) -> str:
    """What the test's traceback says of the attempt whose exception it shows."""
    if ran.outcome == "retried":
        what = f"recorded as a retry in {ran.retry_delay:.3g} s"
    elif ran.outcome == "dead_lettered":
        what = f"recorded as a dead letter ({ran.reason})"
    else:
        what = f"recorded as {ran.outcome.replace('_', ' ')}"
    return (
        f"django_jobq.testing: raised by job {ran.job_id} {ran.kind} attempt {ran.attempt}; "
        f"{what}. run_jobs(raise_exceptions=False) reports failures instead of raising them."
    )
