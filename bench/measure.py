"""What the harness (bench/run.py) observes: worker processes, handler records, percentiles.

- :class:`WorkerGroup` starts worker subprocesses, waits until they are idle (their CPU time
  stops growing: imports done, connections open, waiting for work) and stops them.
- :class:`Records` reads the handler-start files that :mod:`benchsite.recorder` appends to,
  as they grow, and checks that every job ran exactly once.
- :func:`summary_ms` gives the p50/p95/p99/max of latencies.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from claims import percentile

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class HarnessError(Exception):
    """A run could not be carried out, or broke a guarantee (the message says which)."""


# -- worker processes ---------------------------------------------------------------------


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it, from ``/proc/<pid>/task/*/children``."""
    found: list[int] = []
    stack = [pid]
    while stack:
        current = stack.pop()
        found.append(current)
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                children = Path(f"/proc/{current}/task/{task}/children").read_text()
            except OSError:
                continue
            stack.extend(int(child) for child in children.split())
    return found


def cpu_ticks(pids: Sequence[int]) -> int:
    """User + system CPU time of the processes, in clock ticks (gone processes count 0)."""
    total = 0
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "(comm)", which may hold spaces
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total


@dataclass
class WorkerGroup:
    """Worker subprocesses of one run, each in its own session (so a hung one and whatever
    it spawned can be killed as a group), with stdout and stderr in ``log_dir``."""

    commands: Sequence[Sequence[str]]
    env: Mapping[str, str]
    log_dir: Path
    cwd: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for index, command in enumerate(self.commands):
            log = open(self.log_dir / f"worker-{index}.log", "wb")  # noqa: SIM115
            self.processes.append(
                subprocess.Popen(
                    list(command),
                    env=dict(self.env),
                    cwd=self.cwd,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
            log.close()  # the child holds its own descriptor

    def pids(self) -> list[int]:
        return [pid for process in self.processes for pid in descendants(process.pid)]

    def check_alive(self) -> None:
        for index, process in enumerate(self.processes):
            if process.poll() is not None:
                raise HarnessError(
                    f"worker {index} exited with status {process.returncode}:\n"
                    + self.log_tail(index)
                )

    def log_tail(self, index: int, lines: int = 30) -> str:
        path = self.log_dir / f"worker-{index}.log"
        try:
            text = path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def wait_idle(
        self, *, minimum: float = 1.0, window: float = 0.5, timeout: float = 90.0
    ) -> float:
        """Wait until the workers have used under 10% of a CPU per process over ``window``
        seconds (after at least ``minimum`` seconds); return the seconds waited.

        Raises:
            HarnessError: a worker exited, or they were still busy after ``timeout``.
        """
        started = time.monotonic()
        time.sleep(minimum)
        budget = max(2, math.ceil(0.10 * window * CLOCK_TICKS * len(self.processes)))
        while True:
            self.check_alive()
            before = cpu_ticks(self.pids())
            time.sleep(window)
            used = cpu_ticks(self.pids()) - before
            if used <= budget:
                self.check_alive()
                return time.monotonic() - started
            if time.monotonic() - started > timeout:
                raise HarnessError(f"workers still busy after {timeout:.0f} s ({used} ticks)")

    def wait_exit(
        self, timeout: float, *, tick: Callable[[], None] | None = None, every: float = 10.0
    ) -> list[tuple[int, int]]:
        """Wait until every worker has exited by itself (a ``--burst`` worker, once its queue
        is drained), calling ``tick`` every ``every`` seconds meanwhile; return each one's
        exit status and exit time (``time.monotonic_ns()``, within 10 ms).

        Raises:
            HarnessError: some were still running after ``timeout`` seconds (they are
                stopped first).
        """
        deadline = time.monotonic() + timeout
        next_tick = time.monotonic() + every
        exits: dict[int, tuple[int, int]] = {}
        while len(exits) < len(self.processes):
            for index, process in enumerate(self.processes):
                if index not in exits and process.poll() is not None:
                    exits[index] = (process.returncode, time.monotonic_ns())
            if time.monotonic() > deadline:
                self.stop(timeout=10)
                raise HarnessError(f"workers still running after {timeout:.0f} s")
            if tick is not None and time.monotonic() >= next_tick:
                tick()
                next_tick = time.monotonic() + every
            time.sleep(0.01)
        return [exits[index] for index in range(len(self.processes))]

    def stop(self, timeout: float = 60.0) -> list[int]:
        """SIGTERM every worker (a graceful stop in all three systems), wait, SIGKILL the
        session of any still running after ``timeout``; return the exit statuses."""
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        statuses: list[int] = []
        for process in self.processes:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            statuses.append(process.returncode)
        return statuses


# -- handler records ----------------------------------------------------------------------


class Records:
    """The handler starts recorded in a directory, read incrementally (each ``poll`` reads
    only what was appended since the last)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._offsets: dict[Path, int] = {}
        self._partial: dict[Path, bytes] = {}
        self.starts: dict[int, int] = {}  # job number -> first start, monotonic ns
        self.duplicates: list[int] = []
        self.count = 0

    def poll(self) -> int:
        """Read what was appended; return the number of handler starts seen so far."""
        for path in sorted(self.directory.glob("*.rec")):
            offset = self._offsets.get(path, 0)
            with open(path, "rb") as stream:
                stream.seek(offset)
                data = self._partial.pop(path, b"") + stream.read()
                self._offsets[path] = stream.tell()
            complete, _, rest = data.rpartition(b"\n")
            if rest:
                self._partial[path] = rest
            for line in complete.split(b"\n") if complete else ():
                number_text, ns_text = line.split()
                self.add(int(number_text), int(ns_text))
        return self.count

    def add(self, number: int, ns: int) -> None:
        """Count one handler start of job ``number`` at ``ns`` (a subclass may watch them)."""
        self.count += 1
        if number in self.starts:
            self.duplicates.append(number)
            self.starts[number] = min(self.starts[number], ns)
        else:
            self.starts[number] = ns

    def processes(self) -> int:
        """How many processes ran handlers."""
        return len(self._offsets)

    def problems(self, expected: int) -> list[str]:
        """Every job 0..expected-1 ran exactly once: what is wrong, if anything."""
        problems: list[str] = []
        missing = [n for n in range(expected) if n not in self.starts]
        unexpected = sorted(n for n in self.starts if not 0 <= n < expected)
        if missing:
            problems.append(f"{len(missing)} jobs never ran, e.g. {missing[:10]}")
        if unexpected:
            problems.append(f"{len(unexpected)} unknown job numbers ran, e.g. {unexpected[:10]}")
        if self.duplicates:
            problems.append(
                f"{len(self.duplicates)} jobs ran more than once, e.g. {self.duplicates[:10]}"
            )
        return problems


def wait_for(condition: Callable[[], bool], *, timeout: float, interval: float, what: str) -> float:
    """Poll ``condition`` every ``interval`` seconds; return ``time.monotonic_ns()`` (in ns)
    when it first held.

    Raises:
        HarnessError: it did not hold within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return time.monotonic_ns()
        if time.monotonic() > deadline:
            raise HarnessError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def read_commits(path: Path) -> dict[int, int]:
    """The producer's output: job number -> commit time (monotonic ns)."""
    commits: dict[int, int] = {}
    for line in path.read_text(encoding="ascii").splitlines():
        if not line:
            continue
        first, count, ns = (int(part) for part in line.split())
        for number in range(first, first + count):
            commits[number] = ns
    return commits


# -- statistics ---------------------------------------------------------------------------


def summary_ms(latencies_ns: Sequence[int]) -> dict[str, float]:
    """p50, p95, p99 and max of latencies given in ns, in ms."""
    if not latencies_ns:
        return {"p50": math.nan, "p95": math.nan, "p99": math.nan, "max": math.nan}
    return {
        "p50": percentile(latencies_ns, 0.50) / 1e6,
        "p95": percentile(latencies_ns, 0.95) / 1e6,
        "p99": percentile(latencies_ns, 0.99) / 1e6,
        "max": max(latencies_ns) / 1e6,
    }
