"""The chaos supervisor: keeps ``workers`` worker processes running, arms their crashes,
strikes from outside, and records every death.

Each worker process is an *incarnation* with its own worker id (``chaos-<run>-<n>``). The
first incarnations, and each replacement, carry the next crash plan of the run until every
planned kill has happened; an incarnation that dies any other way (its connection was
terminated, PostgreSQL restarted) hands its plan on to its replacement. When a worker dies,
the supervisor reads which leases it held (they are "stranded" until their visibility
timeout passes) and starts a replacement at once, or after :data:`RESPAWN_DELAY` if the
dead one lived less than a second (PostgreSQL is probably down).
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from django.db import DatabaseError, connections

from ... import crash_points
from ...leases import Lease
from ...models import Job
from ...worker.supervisor import stop_with_parent
from . import sql
from .handlers import QUEUE
from .plan import CrashPlan, Plan, Termination

#: Seconds between two rounds of the supervisor's loop.
POLL = 0.05
#: Seconds before replacing a worker that died less than a second after it started.
RESPAWN_DELAY = 0.5
#: Seconds a termination waits for a connection of its planned kind before it takes another.
ROLE_WAIT = 3.0
#: Seconds workers get to stop after SIGTERM at the end, before they are killed.
STOP_TIMEOUT = 30.0

#: The line a :class:`~django_jobq.contrib.chaos.crashes.Crash` writes before it kills the process.
_CRASH_LINE = re.compile(rb"jobq crash point: SIGKILL at (\w+)")
#: The worker's "lease lost" warnings (heartbeat refused; outcome not recorded), see
#: django_jobq/worker/heartbeat.py and completer.py.
_LEASE_LOST_LINE = re.compile(r"job (\d+) \S+ attempt (\d+): (?:heartbeat refused, )?lease lost")
#: A live worker's main loop or listener got its connection back (worker.py, listener.py).
_RECONNECTED_LINE = re.compile(r"database connection restored|listener reconnected")


@dataclass
class Incarnation:
    """One worker process. ``started`` is ``time.monotonic()`` seconds."""

    worker_id: str
    crash: CrashPlan | None
    process: subprocess.Popen[bytes]
    log_path: Path
    log: IO[bytes]
    started: float

    @property
    def pid(self) -> int:
        return self.process.pid

    def lease_losses(self) -> set[Lease]:
        """The leases this worker logged as lost (it was alive, but another attempt took
        over: a stall, or a database outage longer than the lease)."""
        text = self.log_path.read_text(errors="replace")
        return {Lease(int(job), int(attempt)) for job, attempt in _LEASE_LOST_LINE.findall(text)}

    def reconnects(self) -> int:
        """How often this worker's main loop or listener reconnected (as it logged)."""
        return len(_RECONNECTED_LINE.findall(self.log_path.read_text(errors="replace")))


@dataclass
class Death:
    """A worker process that ended other than by a clean stop. ``crash_point`` is set when
    it died at its armed crash point; ``stranded`` holds the leases it held then (``None``
    until the supervisor could read them)."""

    worker_id: str
    pid: int
    returncode: int
    crash_point: str | None
    stranded: frozenset[Lease] | None = None

    @property
    def cause(self) -> str:
        if self.crash_point is not None:
            return self.crash_point
        if self.returncode == -signal.SIGKILL:
            return "killed at the end"
        return f"exited ({self.returncode})"


@dataclass(frozen=True)
class Strike:
    """A fault from outside: a terminated connection (``what`` is its application name) or a
    PostgreSQL restart (``seconds`` it took, the command's ``returncode``). ``progress`` is the
    fraction of jobs finished when it struck."""

    kind: str  # "terminate <role>" or "restart"
    what: str
    progress: float
    seconds: float = 0.0
    returncode: int = 0


@dataclass
class Supervisor:
    """Runs the workers until the queue is drained (or nothing moved for ``stall_timeout``
    seconds). ``worker_args`` are the ``jobq_worker`` options every incarnation gets, besides
    its worker id; ``env`` is every incarnation's environment."""

    workers: int
    worker_args: Sequence[str]
    env: dict[str, str]
    plan: Plan
    run_dir: Path
    prefix: str  # every worker id starts with it: chaos-<run>-
    alias: str
    stall_timeout: float
    restart_command: Sequence[str] = ()
    deaths: list[Death] = field(default_factory=list)
    strikes: list[Strike] = field(default_factory=list)
    incarnations: list[Incarnation] = field(default_factory=list)
    stalled: bool = False

    def __post_init__(self) -> None:
        self._crashes: deque[CrashPlan] = deque(self.plan.crashes)
        self._terminations = list(self.plan.terminations)
        self._due_since: dict[int, float] = {}  # termination index -> when it fell due
        self._struck: set[int] = set()  # indexes of the terminations done
        self._restart_at = self.plan.restart_at if self.restart_command else None

    def run(self, total: int) -> None:
        """Supervise until the ``total`` jobs of the run have left the queue."""
        slots: list[Incarnation | None] = [self._start() for _ in range(self.workers)]
        due: list[float] = [0.0] * self.workers
        remaining, moved = total, time.monotonic()
        try:
            while True:
                for n, incarnation in enumerate(slots):
                    if incarnation is None and time.monotonic() >= due[n]:
                        slots[n] = self._start()
                    elif incarnation is not None and incarnation.process.poll() is not None:
                        slots[n] = None
                        due[n] = self._bury(incarnation)
                self._read_stranded()
                counted = self._remaining()
                if counted is not None and counted != remaining:
                    remaining, moved = counted, time.monotonic()
                if remaining == 0:
                    return
                self._strike(1 - remaining / total)
                if time.monotonic() - moved > self.stall_timeout:
                    self.stalled = True
                    return
                time.sleep(POLL)
        finally:
            self._stop([i for i in slots if i is not None])
            self._read_stranded()

    @property
    def kills(self) -> int:
        return sum(death.crash_point is not None for death in self.deaths)

    def _start(self) -> Incarnation:
        number = len(self.incarnations) + 1
        worker_id = f"{self.prefix}{number}"
        crash = self._crashes.popleft() if self._crashes else None
        env = dict(self.env)
        if crash is not None:
            env[crash_points.ENV_VAR] = crash.env_value
        log_path = self.run_dir / f"worker-{number}.log"
        log = log_path.open("wb")
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "django_jobq.contrib.chaos.worker",
                "--worker-id",
                worker_id,
                *self.worker_args,
            ],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            process_group=0,  # a Ctrl-C reaches the run only, which then stops the workers
            preexec_fn=stop_with_parent,  # a chaos run that is killed leaves no workers
        )
        incarnation = Incarnation(worker_id, crash, process, log_path, log, time.monotonic())
        self.incarnations.append(incarnation)
        return incarnation

    def _bury(self, incarnation: Incarnation) -> float:
        """Record a dead worker; return when its replacement may start."""
        incarnation.log.close()
        returncode = incarnation.process.returncode
        crashed = _CRASH_LINE.search(incarnation.log_path.read_bytes())
        crash_point = crashed.group(1).decode() if crashed else None
        if crash_point is None and incarnation.crash is not None:
            self._crashes.appendleft(incarnation.crash)  # its replacement carries the plan
        now = time.monotonic()
        self.deaths.append(Death(incarnation.worker_id, incarnation.pid, returncode, crash_point))
        if crash_point is None and now - incarnation.started < 1.0:
            return now + RESPAWN_DELAY
        return now

    def _read_stranded(self) -> None:
        """Read the leases each dead worker held, as soon as the database answers (they stay
        its leases for a visibility timeout, so this sees them all)."""
        for death in self.deaths:
            if death.stranded is not None:
                continue
            try:
                held = Job.objects.using(self.alias).filter(
                    worker_id=death.worker_id, status=Job.Status.RUNNING
                )
                death.stranded = frozenset(
                    Lease(job_id=row["id"], attempt=row["attempts"])
                    for row in held.values("id", "attempts")
                )
            except DatabaseError:
                connections[self.alias].close()
                return

    def _remaining(self) -> int | None:
        """Jobs of the run still in the queue; ``None`` while the database is unreachable."""
        try:
            return Job.objects.using(self.alias).filter(queue=QUEUE).count()
        except DatabaseError:
            connections[self.alias].close()
            return None

    def _strike(self, progress: float) -> None:
        for n, termination in enumerate(self._terminations):
            if n in self._struck or termination.progress > progress:
                continue
            due_since = self._due_since.setdefault(n, time.monotonic())
            if self._terminate(termination, due_since, progress):
                self._struck.add(n)
        if self._restart_at is not None and self._restart_at <= progress:
            self._restart_at = None
            self._restart(progress)

    def _terminate(self, termination: Termination, due_since: float, progress: float) -> bool:
        """``pg_terminate_backend`` one of the run's connections of the planned role, or, once
        none has shown up for :data:`ROLE_WAIT` seconds since the termination fell due, any
        of them (a worker opens its heartbeat connection at its first heartbeat only; a kind
        may not exist at all). ``False``: nothing terminated yet, try again later."""
        try:
            with connections[self.alias].cursor() as cursor:
                cursor.execute(sql.SELECT_CONNECTIONS_NAMED, {"pattern": f"jobq % {self.prefix}%"})
                ours: list[tuple[int, str]] = cursor.fetchall()  # (pid, application name)
                of_role = [
                    (pid, name) for pid, name in ours if name.split(" ")[1] == termination.role
                ]
                waited = time.monotonic() - due_since > ROLE_WAIT
                candidates = of_role or (ours if waited else [])
                if not candidates:
                    return False
                pid, name = candidates[termination.pick % len(candidates)]
                cursor.execute(sql.TERMINATE_CONNECTION, {"pid": pid, "application_name": name})
        except DatabaseError:
            connections[self.alias].close()
            return False
        self.strikes.append(Strike(f"terminate {name.split(' ')[1]}", name, progress))
        return True

    def _restart(self, progress: float) -> None:
        started = time.monotonic()
        # Output to a file, not a pipe: a server the command starts may keep the descriptor
        # open for its whole life, and a pipe would then never reach end-of-file.
        with (self.run_dir / "restart.log").open("wb") as log:
            returncode = subprocess.run(
                list(self.restart_command),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=300,
                check=False,
            ).returncode
        connections[self.alias].close()  # its server is gone
        self.strikes.append(
            Strike(
                "restart",
                " ".join(self.restart_command),
                progress,
                time.monotonic() - started,
                returncode,
            )
        )

    def _stop(self, running: list[Incarnation]) -> None:
        """SIGTERM the live workers, wait for them, kill those that do not stop in time."""
        for incarnation in running:
            if incarnation.process.poll() is None:
                incarnation.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        for incarnation in running:
            try:
                incarnation.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                incarnation.process.kill()
                incarnation.process.wait()
            if incarnation.process.returncode != 0:
                self._bury(incarnation)
            else:
                incarnation.log.close()
