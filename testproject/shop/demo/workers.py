"""Real ``manage.py jobq_worker`` subprocesses, as a deployment runs them."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO
from urllib.parse import quote, urlencode

from django.db import connections

MANAGE_PY = Path(__file__).resolve().parents[2] / "manage.py"

#: The summary line a worker logs when it stops (see django_jobq.worker.worker).
_STOPPED_RE = re.compile(
    r"worker (?P<worker_id>\S+) stopped after [\d.]+ s: (?P<succeeded>\d+) succeeded, "
    r"(?P<retried>\d+) retried, (?P<dead_lettered>\d+) dead-lettered, "
    r"(?P<released>\d+) released, (?P<lease_lost>\d+) lease lost"
)


def database_url(alias: str = "default", *, hide_password: bool = False) -> str:
    """A ``DATABASE_URL`` for the database this process uses, so the workers use it too
    (whatever the settings or a test runner made of ``DATABASE_URL``). ``hide_password``
    shows a password as ``****``, for printing."""
    params = connections[alias].settings_dict
    user = quote(params.get("USER") or "", safe="")
    password = params.get("PASSWORD") or ""
    secret = "****" if hide_password else quote(password, safe="")
    auth = f"{user}:{secret}" if password else user
    host = quote(params.get("HOST") or "", safe="")
    port = f":{params['PORT']}" if params.get("PORT") else ""
    url = f"postgres://{auth + '@' if auth else ''}{host}{port}/{quote(params['NAME'], safe='')}"
    options = {
        key: value
        for key, value in (params.get("OPTIONS") or {}).items()
        if isinstance(value, str | int) and not isinstance(value, bool)
    }
    return f"{url}?{urlencode(options)}" if options else url


@dataclass
class WorkerResult:
    """How one worker process ended. ``tally`` is parsed from its stop summary log line
    (``succeeded``, ``retried``, ``dead_lettered``, ...), empty if it logged none."""

    worker_id: str
    returncode: int | None
    killed: bool
    log_path: Path
    tally: dict[str, int]

    @property
    def clean_exit(self) -> bool:
        return self.returncode == 0 and not self.killed


class WorkerProcess:
    def __init__(self, worker_id: str, args: list[str], env: dict[str, str], log_path: Path):
        self.worker_id = worker_id
        self.log_path = log_path
        self.killed = False
        self._log: IO[bytes] = log_path.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, str(MANAGE_PY), "jobq_worker", "--worker-id", worker_id, *args],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            # Out of the terminal's process group: a Ctrl-C reaches the demo only, which
            # then stops the workers with one SIGTERM (a second signal makes them exit now).
            process_group=0,
        )

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def terminate(self) -> None:
        if self.running:
            self.process.send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> WorkerResult:
        """Wait up to ``timeout`` seconds for the process to end; kill it after that."""
        try:
            self.process.wait(timeout=max(timeout, 0))
        except subprocess.TimeoutExpired:
            self.killed = True
            self.process.kill()
            self.process.wait()
        self._log.close()
        return WorkerResult(
            worker_id=self.worker_id,
            returncode=self.process.returncode,
            killed=self.killed,
            log_path=self.log_path,
            tally=self._parse_tally(),
        )

    def _parse_tally(self) -> dict[str, int]:
        match = _STOPPED_RE.search(self.log_path.read_text(errors="replace"))
        if match is None:
            return {}
        return {key: int(value) for key, value in match.groupdict().items() if key != "worker_id"}

    def log_tail(self, lines: int = 15) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


class WorkerPool:
    """``count`` worker processes with ``concurrency`` threads each, claiming only from
    ``queues``, logging to ``log_dir``.

    ``env`` is added to this process's environment; the workers always get this process's
    database as ``DATABASE_URL``.
    """

    def __init__(
        self,
        *,
        count: int,
        concurrency: int,
        queues: list[str],
        env: dict[str, str],
        log_dir: Path,
    ):
        full_env = {**os.environ, "DATABASE_URL": database_url(), "PYTHONUNBUFFERED": "1", **env}
        args = ["--concurrency", str(concurrency)]
        for queue in queues:
            args += ["--queue", queue]
        self.workers = [
            WorkerProcess(f"demo-worker-{n}", args, full_env, log_dir / f"worker-{n}.log")
            for n in range(1, count + 1)
        ]

    def exited(self) -> list[WorkerProcess]:
        """The workers that have ended on their own (a running demo never stops them)."""
        return [worker for worker in self.workers if not worker.running]

    def stop(self, timeout: float) -> list[WorkerResult]:
        """SIGTERM every worker (a graceful stop), wait up to ``timeout`` seconds in all,
        kill any still running after that."""
        for worker in self.workers:
            worker.terminate()
        deadline = time.monotonic() + timeout
        return [worker.wait(deadline - time.monotonic()) for worker in self.workers]
