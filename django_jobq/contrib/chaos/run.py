"""One chaos run, from the refusal checks to the clean-up::

    from django_jobq.contrib.chaos.run import ChaosConfig, run

    report = run(ChaosConfig(jobs=2000, workers=4, kills=50, seed=1))
    assert report.ok, report.problems

The run works on the queue database (``JOBQ['DATABASE']``) and touches only its own rows: the
jobs, dead letters and statistics (outcome rollups, queue samples) of queue ``jobq-chaos``,
the dedup keys of its kinds, its workers' registrations, and its own table
``jobq_chaos_business_row``, which it creates (no migration) and drops. It refuses to
start beside other jobs or workers (:class:`ChaosRefused`). After a successful run nothing
of it is left; after a failed one (or with ``keep``) its rows, the workers' logs and the
effect log stay for inspection, and the next run clears them.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.db import connections

from ... import crash_points
from ...conf import get_settings
from ...enqueueing import enqueue_many
from ...models import DeadLetter, DedupKey, Job, OutcomeRollup, QueueSample, WorkerProcess
from . import handlers, sql
from .handlers import EFFECT_LOG_ENV, QUEUE
from .plan import Plan, make_plan
from .supervisor import Supervisor
from .verdict import Report, judge
from .worker import DATABASE_ENV

#: Every this-many-th external job works for 0.4 visibility timeouts before its effect: long
#: enough to be heartbeated once (so heartbeat connections exist, and get terminated).
SLOW_JOB_EVERY = 10
SLOW_JOB_HOLD = 0.4
#: Every chaos worker's id starts with it (then the run's token, then a number).
WORKER_ID_PREFIX = "chaos-"
#: Seconds the refusal check waits for the sessions of workers that were just stopped.
_OTHER_WORKERS_GRACE = 5.0


class ChaosRefused(Exception):
    """The queue database is not the chaos run's alone: other jobs, or running workers."""


@dataclass(frozen=True)
class ChaosConfig:
    """What to run. ``kills`` crash kills and ``terminations`` terminated connections, with
    ``workers`` worker processes of ``concurrency`` threads claiming ``batch_size`` jobs at
    a time. ``restart_command`` (an argv) restarts PostgreSQL once, mid-run. Seconds:
    ``visibility_timeout`` of the chaos jobs, ``stall_timeout`` without any job finishing
    before the run gives up."""

    jobs: int = 2000
    workers: int = 4
    kills: int = 50
    seed: int = 1
    terminations: int = 5
    restart_command: tuple[str, ...] = ()
    concurrency: int = 1
    batch_size: int = 1
    visibility_timeout: float = 3.0
    max_attempts: int = 5
    stall_timeout: float = 120.0
    keep: bool = False

    def plan(self) -> Plan:
        """The seeded fault plan of a run with this configuration."""
        return make_plan(
            seed=self.seed,
            jobs=self.jobs,
            kills=self.kills,
            workers=self.workers,
            terminations=self.terminations,
            restart=bool(self.restart_command),
        )

    def __post_init__(self) -> None:
        for name in ("jobs", "workers", "concurrency", "batch_size", "max_attempts"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1.")
        for name in ("kills", "terminations"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be at least 0.")
        if not 0 < self.visibility_timeout <= 3600 or self.stall_timeout <= 0:
            raise ValueError("visibility_timeout (up to 3600) and stall_timeout must be > 0 s.")


def run(config: ChaosConfig, *, say: Callable[[str], None] = lambda line: None) -> Report:
    """Run the chaos suite on the queue database and return the report.

    ``say`` receives progress lines. Raises :class:`ChaosRefused` when other jobs are queued
    or other workers are connected, and the database errors of the set-up.
    """
    alias = get_settings().DATABASE
    _refuse_unless_alone(alias)
    if cleared := _clear(alias):
        say(f"cleared a previous run's leftovers: {cleared}")
    with connections[alias].cursor() as cursor:
        cursor.execute(sql.CREATE_CHAOS_BUSINESS_TABLE)
    run_dir = Path(tempfile.mkdtemp(prefix="jobq-chaos-"))
    effect_log = run_dir / "effects.log"
    enqueued = _enqueue(config)
    supervisor = Supervisor(
        workers=config.workers,
        worker_args=[
            *("--queue", QUEUE, "--no-scheduler", "--shutdown-timeout", "10"),
            *("--concurrency", str(config.concurrency), "--batch-size", str(config.batch_size)),
        ],
        env=_worker_env(alias, effect_log),
        plan=config.plan(),
        run_dir=run_dir,
        prefix=f"{WORKER_ID_PREFIX}{secrets.token_hex(3)}-",
        alias=alias,
        stall_timeout=config.stall_timeout,
        restart_command=config.restart_command,
    )
    say(
        f"{config.jobs} jobs enqueued; {config.workers} workers, {config.kills} kills, "
        f"{config.terminations} terminations{', 1 restart' if config.restart_command else ''}, "
        f"seed {config.seed}; logs in {run_dir}"
    )
    started = time.monotonic()
    supervisor.run(len(enqueued))
    report = judge(
        Report(
            seed=config.seed,
            jobs=len(enqueued),
            workers=config.workers,
            per_death_bound=config.concurrency + config.batch_size,
            kills_planned=config.kills,
            wall_seconds=time.monotonic() - started,
        ),
        enqueued=enqueued,
        supervisor=supervisor,
        effects=handlers.read_effects(effect_log),
        alias=alias,
    )
    if report.ok and not config.keep:
        _clear(alias)
        shutil.rmtree(run_dir, ignore_errors=True)
    else:
        report.notes.append(f"kept for inspection: the run's rows, and {run_dir}")
    return report


def _refuse_unless_alone(alias: str) -> None:
    others = Job.objects.using(alias).exclude(queue=QUEUE).count()
    if others:
        raise ChaosRefused(
            f"the queue database holds {others} jobs of other queues; run jobq_chaos on a "
            f"database of its own (a development or CI database), whose queue is empty."
        )
    deadline = time.monotonic() + _OTHER_WORKERS_GRACE
    while workers := _connections(alias, "jobq worker %"):
        if time.monotonic() > deadline:
            raise ChaosRefused(
                f"{len(workers)} workers are connected to the queue database "
                f"({', '.join(workers[:3])}); they would claim the chaos jobs. Stop them first."
            )
        time.sleep(0.1)


def _connections(alias: str, pattern: str) -> list[str]:
    with connections[alias].cursor() as cursor:
        cursor.execute(sql.SELECT_CONNECTIONS_NAMED, {"pattern": pattern})
        return [name for _, name in cursor.fetchall()]


def _clear(alias: str) -> str:
    """Delete every row of the chaos runs' (jobs, dead letters, dedup keys, the statistics
    of their queue, their workers' registrations, their table); describe what there was."""
    kinds = [handlers.transactional.kind, handlers.external.kind]
    chaos_workers = WorkerProcess.objects.using(alias).filter(
        worker_id__startswith=WORKER_ID_PREFIX, queues=[QUEUE]
    )
    counts = {
        "jobs": Job.objects.using(alias).filter(queue=QUEUE).delete()[0],
        "dead letters": DeadLetter.objects.using(alias).filter(queue=QUEUE).delete()[0],
        "dedup keys": DedupKey.objects.using(alias).filter(kind__in=kinds).delete()[0],
        "outcome rollups": OutcomeRollup.objects.using(alias).filter(queue=QUEUE).delete()[0],
        "queue samples": QueueSample.objects.using(alias).filter(queue=QUEUE).delete()[0],
        "worker registrations": chaos_workers.delete()[0],
    }
    with connections[alias].cursor() as cursor:
        cursor.execute(sql.DROP_CHAOS_BUSINESS_TABLE)
    return ", ".join(f"{count} {what}" for what, count in counts.items() if count)


def _enqueue(config: ChaosConfig) -> dict[int, str]:
    """The run's jobs, the two kinds alternating; returns ``{job id: kind}``."""
    vt, attempts = config.visibility_timeout, config.max_attempts
    transactional = handlers.transactional.using(visibility_timeout=vt, max_attempts=attempts)
    external = handlers.external.using(visibility_timeout=vt, max_attempts=attempts)
    slow = config.visibility_timeout * SLOW_JOB_HOLD
    prepared = [
        transactional.prepare()
        if n % 2 == 0
        else external.prepare(hold=slow if n % (2 * SLOW_JOB_EVERY) == 1 else 0.0)
        for n in range(config.jobs)
    ]
    return {job.pk: job.kind for job in enqueue_many(prepared)}


def _worker_env(alias: str, effect_log: Path) -> dict[str, str]:
    """The chaos workers' environment: this process's settings module, import path and queue
    database (see :mod:`django_jobq.contrib.chaos.worker`)."""
    if not settings.SETTINGS_MODULE:
        raise ChaosRefused("jobq_chaos needs DJANGO_SETTINGS_MODULE (its workers load it).")
    params = connections[alias].settings_dict
    database = {key: params[key] for key in ("NAME", "USER", "PASSWORD", "HOST", "PORT")}
    env = {key: value for key, value in os.environ.items() if key != crash_points.ENV_VAR}
    return {
        **env,
        "DJANGO_SETTINGS_MODULE": settings.SETTINGS_MODULE,
        "PYTHONPATH": os.pathsep.join(path or os.getcwd() for path in sys.path),
        DATABASE_ENV: json.dumps(database),
        EFFECT_LOG_ENV: str(effect_log),
        "PYTHONUNBUFFERED": "1",
    }
