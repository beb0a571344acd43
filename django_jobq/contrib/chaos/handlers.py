"""The chaos suite's two job kinds, one per kind of business effect.

They are registered only in the processes that import this module: the chaos run
(``manage.py jobq_chaos``) and the workers it starts (``python -m
django_jobq.contrib.chaos.worker``), so only where the chaos app is installed, and never in a
project's own workers (the app has no ``jobs`` module for the autodiscovery to find). Their
jobs go to their own queue, :data:`QUEUE`.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from django.db import connections

from ... import crash_points
from ...backoff import FixedBackoff
from ...conf import get_settings
from ...context import JobContext
from ...decorator import job
from . import sql

#: The queue of every chaos job; the run touches no other queue's rows.
QUEUE = "jobq-chaos"
#: The environment variable naming the effect log file (set by the chaos run for its workers).
EFFECT_LOG_ENV = "JOBQ_CHAOS_EFFECT_LOG"


@job(name="jobq.chaos.transactional", queue=QUEUE, takes_context=True, backoff=FixedBackoff(0.5))
def transactional(ctx: JobContext) -> None:
    """Business row, dedup key and ack in one transaction: exactly one row per job.

    Order inside the transaction: the dedup key, the business row, crash point
    ``in_transaction``, then ``ctx.atomic()``'s fenced ack, then the commit.
    """
    with ctx.atomic(), ctx.idempotent() as first_time:
        if first_time:
            with connections[get_settings().DATABASE].cursor() as cursor:
                cursor.execute(
                    sql.INSERT_CHAOS_BUSINESS_ROW, {"job_id": ctx.job_id, "attempt": ctx.attempt}
                )
            if crash_points.reach is not None:
                crash_points.reach("in_transaction")


@job(name="jobq.chaos.external", queue=QUEUE, takes_context=True, backoff=FixedBackoff(0.5))
def external(ctx: JobContext, hold: float = 0.0) -> None:
    """Work for ``hold`` seconds, then an effect outside the database (a line appended to the
    effect log, standing for an email), then crash point ``in_handler``.

    At least once per job: a crash after the effect and before the ack repeats it.
    """
    time.sleep(hold)  # the job's work: long enough, for some jobs, to need a heartbeat
    append_effect(Path(os.environ[EFFECT_LOG_ENV]), ctx.job_id, ctx.attempt)
    if crash_points.reach is not None:
        crash_points.reach("in_handler")


@dataclass(frozen=True)
class Effect:
    """One line of the effect log: attempt ``attempt`` of job ``job_id`` ran its effect in
    process ``pid``."""

    job_id: int
    attempt: int
    pid: int


def append_effect(path: Path, job_id: int, attempt: int) -> None:
    """Append one effect line with a single ``write(2)`` on an ``O_APPEND`` descriptor: it
    lands whole, even if the process is killed right after, and workers never interleave."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{job_id} {attempt} {os.getpid()}\n".encode())
    finally:
        os.close(fd)


def read_effects(path: Path) -> list[Effect]:
    """Every effect in the log (none if it does not exist)."""
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    return [Effect(*(int(field) for field in line.split())) for line in lines]
