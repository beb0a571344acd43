"""Async handlers (``async def``) for tests/test_async_jobs.py, on the queue ``async``.

Registered only in processes started with the environment variable ``JOBQ_TEST_ASYNC_JOBS``
set (``tests/testapp/jobs.py`` imports this module then): a worker that registers an async
kind runs an event loop whose slots add to its claim bound, and the other tests' workers
keep the bounds they assert. The tests enqueue these kinds by name.

The signal receivers at the end write Effect rows with the ORM's sync API: they run only
if the worker sends ``job_started`` and ``job_succeeded`` from a sync context.
"""

import asyncio
import os
import time
from typing import Any

from django_jobq import job, signals
from django_jobq.backoff import FixedBackoff
from django_jobq.context import JobContext
from django_jobq.registry import KindDefinition

from .models import Effect

QUEUE = "async"


@job(name="async.sleep", queue=QUEUE)
async def sleep(path: str, label: str, seconds: float) -> None:
    """Sleep ``seconds`` on the event loop; append ``"<label> <start> <end>"`` (wall-clock
    seconds around the sleep) as a line to the file ``path``."""
    started = time.time()
    await asyncio.sleep(seconds)
    ended = time.time()
    with open(path, "a") as lines:  # one short append: atomic, and quick on the loop
        lines.write(f"{label} {started} {ended}\n")


@job(name="async.fails", queue=QUEUE, max_attempts=3, backoff=FixedBackoff(0))
async def fails(label: str) -> None:
    """Fail every attempt after an await."""
    await asyncio.sleep(0)
    raise RuntimeError(f"{label} broke")


@job(
    name="async.overrun_retried",
    queue=QUEUE,
    max_runtime=0.3,
    max_attempts=2,
    visibility_timeout=300,
    backoff=FixedBackoff(3600),
)
async def overrun_retried(label: str) -> None:
    """Outlast ``max_runtime``; the line after the await records that the body went on."""
    await asyncio.sleep(60)
    await Effect.objects.acreate(label=f"{label} went on")


@job(
    name="async.overrun_final", queue=QUEUE, max_runtime=0.3, max_attempts=1, visibility_timeout=300
)
async def overrun_final(label: str) -> None:
    """:func:`overrun_retried` with a single attempt."""
    await asyncio.sleep(60)
    await Effect.objects.acreate(label=f"{label} went on")


@job(name="async.slow", queue=QUEUE, takes_context=True)
async def slow(ctx: JobContext, label: str, seconds: float) -> None:
    """Write ``"<label> started"``, sleep ``seconds``, write ``"<label> finished attempt
    <n>"``: what shutdown and heartbeats do to running async jobs."""
    await Effect.objects.acreate(label=f"{label} started")
    await asyncio.sleep(seconds)
    await Effect.objects.acreate(label=f"{label} finished attempt {ctx.attempt}")


@job(name="async.until_aborted", queue=QUEUE, takes_context=True, visibility_timeout=3)
async def until_aborted(ctx: JobContext, label: str) -> None:
    """Write ``"<label> started"`` and await for an hour; an abort cancels the await: write
    ``"<label> cancelled, abort_requested=<flag>"`` and let the cancellation go on."""
    await Effect.objects.acreate(label=f"{label} started")
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        await Effect.objects.acreate(
            label=f"{label} cancelled, abort_requested={ctx.abort_requested}"
        )
        raise
    await Effect.objects.acreate(label=f"{label} went on")


def _write(label: str) -> int:
    """Write an Effect with the ORM's sync API (run by ``ctx.aatomic``); return its id."""
    return Effect.objects.create(label=label).pk


@job(name="async.context", queue=QUEUE, takes_context=True, visibility_timeout=300)
async def with_context(ctx: JobContext, label: str) -> None:
    """Heartbeat, then write ``"<label> ..."`` in the job's own transaction (``aatomic``)."""
    before = ctx.deadline
    extended = await ctx.aheartbeat()
    moved = ctx.deadline > before
    effect_id = await ctx.aatomic(
        _write, f"{label} job {ctx.job_id} attempt {ctx.attempt} extended={extended} moved={moved}"
    )
    assert isinstance(effect_id, int)


def _write_then_fail(label: str) -> None:
    Effect.objects.create(label=label)
    raise RuntimeError(f"{label}: failed after its write")


@job(name="async.atomic_fails", queue=QUEUE, takes_context=True, max_attempts=1)
async def atomic_fails(ctx: JobContext, label: str) -> None:
    """Write in ``aatomic``, then raise there: the write is rolled back, nothing is acked."""
    await ctx.aatomic(_write_then_fail, label)


@job(name="async.orm", queue=QUEUE)
async def orm(label: str) -> None:
    """Django's async ORM: create a row, count it, and write the count."""
    await Effect.objects.acreate(label=label)
    count = await Effect.objects.filter(label=label).acount()
    await Effect.objects.acreate(label=f"{label} counted {count}")


def _announce(signal_name: str) -> Any:
    def receive(sender: KindDefinition | None, job: Any, **kwargs: Any) -> None:
        if sender is not None and sender.kind == "async.orm":
            Effect.objects.create(label=f"{signal_name} {job.payload['label']} pid {os.getpid()}")

    return receive


_started = _announce("job_started")
_succeeded = _announce("job_succeeded")
signals.job_started.connect(_started)
signals.job_succeeded.connect(_succeeded)
