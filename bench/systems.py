"""The queues the harness measures, each with its own database, workers and checks.

A :class:`System` knows how to create and empty its database, the command lines of its real
workers for a :class:`WorkerConfig`, how many of its jobs are unfinished, and what its tables
must look like after a run in which every job ran exactly once.

| name          | workers                                              | database                 |
| ------------- | ---------------------------------------------------- | ------------------------ |
| jobq          | ``manage.py jobq_worker`` (``--processes`` if known)  | jobq_bench_run           |
| procrastinate | ``procrastinate worker``                             | jobq_bench_procrastinate |
| tasksdb       | ``manage.py db_worker`` (django-tasks-db)            | jobq_bench_tasksdb       |
| tasks-jobq    | ``manage.py jobq_worker``, jobs enqueued through     | jobq_bench_tasks         |
|               | Django Tasks and ``django_jobq.tasks_backend``        |                          |
| tasks-db      | ``manage.py db_worker``, the same ``@task`` function  | jobq_bench_tasks         |
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import psycopg
from claims import ensure_database

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
MANAGE = REPO_DIR / "testproject" / "manage.py"
QUEUE = "bench"
#: The queue ``--limited-queue`` gives limits, served by django-jobq's workers and left empty.
LIMITED_QUEUE = "bench-limited"
#: django-tasks-db's worker sleeps this long (seconds) after finding no task. Its default
#: is 1 s; 0.1 s is a fast setting that still does not busy-poll (0 would).
TASKSDB_INTERVAL = 0.1


@dataclass(frozen=True)
class WorkerConfig:
    """Worker processes x handler slots per process, and django-jobq's claim batch size.

    Written ``PxC`` or ``PxC/B``: ``2x4/32`` is 2 processes of 4 threads (django-jobq), 4
    coroutines (procrastinate), claiming up to 32 jobs at once (django-jobq only).
    """

    processes: int
    concurrency: int
    batch_size: int | None = None

    @classmethod
    def parse(cls, text: str) -> WorkerConfig:
        match = re.fullmatch(r"(\d+)x(\d+)(?:/(\d+))?", text.strip())
        if not match or int(match[1]) < 1 or int(match[2]) < 1:
            raise ValueError(f"expected PROCESSESxCONCURRENCY[/BATCH], e.g. 2x4/32, not {text!r}")
        return cls(int(match[1]), int(match[2]), int(match[3]) if match[3] else None)

    def __str__(self) -> str:
        batch = f"/{self.batch_size}" if self.batch_size else ""
        return f"{self.processes}x{self.concurrency}{batch}"


def database_url(server_url: str, name: str) -> str:
    """``server_url`` (``postgres://user@host:port``) with database ``name``."""
    return f"{server_url.rstrip('/')}/{name}"


@cache
def jobq_worker_has_processes_option() -> bool:
    """Whether this checkout's ``jobq_worker`` supervises processes itself (``--processes``);
    otherwise the harness starts one ``jobq_worker`` per process."""
    env = Jobq("postgres://127.0.0.1").env()
    result = subprocess.run(
        [sys.executable, str(MANAGE), "jobq_worker", "--help"],
        env=env,
        cwd=REPO_DIR,
        capture_output=True,
        text=True,
        check=True,
    )
    return "--processes" in result.stdout


class System:
    """One queue implementation under test."""

    name: str
    label: str
    database: str
    #: The producer's system name (benchsite.produce) and the settings' JOBQ_BENCH_SYSTEM.
    settings_system: str = ""
    #: django-jobq's workers also serve the empty limited queue ``LIMITED_QUEUE``
    #: (``--limited-queue``).
    also_serves_limited: bool = False

    def __init__(self, server_url: str) -> None:
        self.url = database_url(server_url, self.database)

    def env(self, record_dir: Path | None = None) -> dict[str, str]:
        """Environment of this system's workers and producer."""
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(BENCH_DIR), str(REPO_DIR)]),
            "JOBQ_BENCH_DATABASE_URL": self.url,
            "PYTHONUNBUFFERED": "1",
        }
        if self.settings_system:
            env.update(Django.base_env(self.settings_system, self.url))
        if record_dir is not None:
            env["JOBQ_BENCH_RECORD_DIR"] = str(record_dir)
        return env

    def connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.url, autocommit=True, application_name="jobq-bench-harness")

    def prepare(self) -> None:
        """Create the database if missing and install the system's schema."""
        ensure_database(self.url)

    def check_alone(self, conn: psycopg.Connection[Any]) -> None:
        """Refuse to run while anything else is connected to this benchmark database
        (another harness, or workers of an interrupted one): they would take its jobs.

        Raises:
            RuntimeError: other sessions are connected; the message lists them.
        """
        rows = conn.execute(
            "SELECT pid, application_name FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
        if rows:
            sessions = ", ".join(f"{pid} ({name or '?'})" for pid, name in rows[:10])
            raise RuntimeError(
                f"{len(rows)} other sessions are connected to {self.database}: {sessions}. "
                "Is another benchmark (or a leftover worker) running?"
            )

    def reset(self, conn: psycopg.Connection[Any]) -> None:
        """Empty the system's tables (in its own benchmark database only)."""
        raise NotImplementedError

    def unfinished(self, conn: psycopg.Connection[Any]) -> int:
        """Jobs not yet finished (ready, running or being acked)."""
        raise NotImplementedError

    def leftovers(self, conn: psycopg.Connection[Any], jobs: int) -> list[str]:
        """What is wrong with the tables after ``jobs`` jobs all succeeded."""
        raise NotImplementedError

    def worker_commands(self, config: WorkerConfig) -> list[list[str]]:
        raise NotImplementedError

    def describe(self, config: WorkerConfig) -> str:
        """The worker settings, for the report."""
        raise NotImplementedError


def run_checked(command: list[str], env: Mapping[str, str]) -> None:
    result = subprocess.run(
        command, env=dict(env), cwd=REPO_DIR, capture_output=True, text=True, check=False
    )
    if result.returncode:
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stdout}\n{result.stderr}")


def result_problems(counts: Mapping[str, int], jobs: int) -> list[str]:
    """What is wrong with a Django Tasks backend's result rows (``status -> count``) after
    ``jobs`` tasks all succeeded: exactly ``jobs`` rows, all SUCCESSFUL."""
    problems = [
        f"{count} task results with status {status}"
        for status, count in counts.items()
        if status != "SUCCESSFUL"
    ]
    if counts.get("SUCCESSFUL", 0) != jobs:
        problems.append(f"{counts.get('SUCCESSFUL', 0)} successful task results, not {jobs}")
    return problems


class Django(System):
    """A system whose workers are Django management commands of benchsite.settings."""

    @staticmethod
    def base_env(settings_system: str, url: str) -> dict[str, str]:
        return {
            "DJANGO_SETTINGS_MODULE": "benchsite.settings",
            "JOBQ_BENCH_SYSTEM": settings_system,
            "JOBQ_BENCH_DATABASE_URL": url,
        }

    def manage(self, *args: str) -> list[str]:
        return [sys.executable, str(MANAGE), *args]

    def prepare(self) -> None:
        super().prepare()
        run_checked(self.manage("migrate", "--noinput", "--verbosity", "0"), self.env())


class Jobq(Django):
    name = "jobq"
    label = "django-jobq"
    database = "jobq_bench_run"
    settings_system = "jobq"

    def reset(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute("TRUNCATE jobq_job, jobq_dead_letter RESTART IDENTITY")

    def unfinished(self, conn: psycopg.Connection[Any]) -> int:
        row = conn.execute("SELECT count(*) FROM jobq_job").fetchone()
        return int(row[0]) if row else 0

    def leftovers(self, conn: psycopg.Connection[Any], jobs: int) -> list[str]:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM jobq_job), (SELECT count(*) FROM jobq_dead_letter)"
        ).fetchone()
        left, dead = row if row else (0, 0)
        problems = []
        if left:
            problems.append(f"{left} jobs left in jobq_job")
        if dead:
            problems.append(f"{dead} dead letters")
        return problems

    def worker_commands(self, config: WorkerConfig) -> list[list[str]]:
        command = self.manage(
            "jobq_worker",
            "--queue",
            QUEUE,
            "--concurrency",
            str(config.concurrency),
            "--no-scheduler",
        )
        if config.batch_size:
            command += ["--batch-size", str(config.batch_size)]
        if self.also_serves_limited:
            command += ["--queue", LIMITED_QUEUE]
        if config.processes > 1 and jobq_worker_has_processes_option():
            return [[*command, "--processes", str(config.processes)]]
        return [command for _ in range(config.processes)]

    def describe(self, config: WorkerConfig) -> str:
        supervised = config.processes > 1 and jobq_worker_has_processes_option()
        how = (
            f"`jobq_worker --processes {config.processes}`"
            if supervised
            else f"{config.processes} x `jobq_worker`"
        )
        batch = config.batch_size or config.concurrency
        return (
            f"{how} --concurrency {config.concurrency} --batch-size {batch}, "
            "poll interval: JOBQ default"
        )


class Procrastinate(System):
    name = "procrastinate"
    label = "procrastinate"
    database = "jobq_bench_procrastinate"

    APP = "benchsite.procrastinate_app.app"

    def prepare(self) -> None:
        super().prepare()
        with self.connect() as conn:
            exists = conn.execute("SELECT to_regclass('procrastinate_jobs')").fetchone()
        if not exists or exists[0] is None:
            run_checked(self.cli("schema", "--apply"), self.env())

    def cli(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "procrastinate", "--app", self.APP, *args]

    def reset(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute("TRUNCATE procrastinate_jobs RESTART IDENTITY CASCADE")

    def unfinished(self, conn: psycopg.Connection[Any]) -> int:
        row = conn.execute(
            "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')"
        ).fetchone()
        return int(row[0]) if row else 0

    def leftovers(self, conn: psycopg.Connection[Any], jobs: int) -> list[str]:
        rows = conn.execute(
            "SELECT status, count(*) FROM procrastinate_jobs GROUP BY status"
        ).fetchall()
        # --delete-jobs successful: a succeeded job's row is deleted at completion.
        return [f"{count} jobs left with status {status}" for status, count in rows]

    def worker_commands(self, config: WorkerConfig) -> list[list[str]]:
        command = self.cli(
            "worker",
            "--queues",
            QUEUE,
            "--concurrency",
            str(config.concurrency),
            "--delete-jobs",
            "successful",
        )
        return [command for _ in range(config.processes)]

    def describe(self, config: WorkerConfig) -> str:
        return (
            f"{config.processes} x `procrastinate worker --concurrency {config.concurrency} "
            "--delete-jobs successful`, async task, LISTEN/NOTIFY on (default), "
            "fetch polling 5 s (default)"
        )


class TasksDb(Django):
    name = "tasksdb"
    label = "django-tasks-db"
    database = "jobq_bench_tasksdb"
    settings_system = "tasksdb"
    #: The Django Tasks backend alias the jobs go through (benchsite.settings.TASKS).
    backend = "default"

    TABLE = "django_tasks_database_dbtaskresult"

    def reset(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute(f"TRUNCATE {self.TABLE}")

    def unfinished(self, conn: psycopg.Connection[Any]) -> int:
        row = conn.execute(
            f"SELECT count(*) FROM {self.TABLE}"  # noqa: S608 (a constant)
            " WHERE status IN ('READY', 'RUNNING') AND backend_name = %s",
            [self.backend],
        ).fetchone()
        return int(row[0]) if row else 0

    def leftovers(self, conn: psycopg.Connection[Any], jobs: int) -> list[str]:
        rows = conn.execute(
            f"SELECT status, count(*) FROM {self.TABLE}"  # noqa: S608 (a constant)
            " WHERE backend_name = %s GROUP BY status",
            [self.backend],
        ).fetchall()
        # django-tasks-db keeps a row per task as its result (prune_db_task_results
        # deletes old ones): all of them must have succeeded.
        return result_problems(dict(rows), jobs)

    def worker_commands(self, config: WorkerConfig) -> list[list[str]]:
        if config.concurrency != 1:
            raise ValueError("django-tasks-db's db_worker runs one task at a time: use Px1")
        command = self.manage(
            "db_worker",
            "--queue-name",
            QUEUE,
            "--backend",
            self.backend,
            "--interval",
            str(TASKSDB_INTERVAL),
            "--no-startup-delay",
            "--no-reload",
            "--verbosity",
            "0",
        )
        return [command for _ in range(config.processes)]

    def describe(self, config: WorkerConfig) -> str:
        return (
            f"{config.processes} x `db_worker --interval {TASKSDB_INTERVAL} "
            "--no-startup-delay --no-reload` (one task at a time per process), "
            "CONN_MAX_AGE 60"
        )


class TasksJobq(Jobq):
    """django-jobq's Django Tasks backend: the same ``@task`` as django-tasks-db's."""

    name = "tasks-jobq"
    label = "django-jobq (Django Tasks backend)"
    database = "jobq_bench_tasks"
    settings_system = "tasks"
    #: The backend alias of benchsite.settings.TASKS the tasks go through.
    backend = "jobq"

    RESULTS = "jobq_task_result"

    def reset(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute(f"TRUNCATE jobq_job, jobq_dead_letter, {self.RESULTS} RESTART IDENTITY")

    def leftovers(self, conn: psycopg.Connection[Any], jobs: int) -> list[str]:
        # The backend keeps a result row per task (JOBQ["TASK_RESULT_RETENTION"] prunes
        # them), written with the job's ack: all of them must say SUCCESSFUL.
        rows = conn.execute(
            f"SELECT status, count(*) FROM {self.RESULTS}"  # noqa: S608 (a constant)
            " WHERE backend = %s GROUP BY status",
            [self.backend],
        ).fetchall()
        return super().leftovers(conn, jobs) + result_problems(dict(rows), jobs)


class TasksDbBeside(TasksDb):
    """django-tasks-db in the "tasks" scenario's database, beside django-jobq's backend."""

    name = "tasks-db"
    label = "django-tasks-db (Django Tasks backend)"
    database = "jobq_bench_tasks"
    settings_system = "tasks"


def tasks_backend_available() -> bool:
    """Whether ``django_jobq.tasks_backend`` is importable (the "tasks" scenario needs it)."""
    import importlib.util

    try:
        return importlib.util.find_spec("django_jobq.tasks_backend") is not None
    except ModuleNotFoundError:
        return False


SYSTEMS: dict[str, type[System]] = {
    cls.name: cls for cls in (Jobq, Procrastinate, TasksDb, TasksJobq, TasksDbBeside)
}
