"""The supervisor behind ``jobq_worker --processes N``: N worker processes, kept at N.

The supervisor forks N children, each running one :class:`~django_jobq.worker.Worker` with
its own threads and connections; it holds no database connection itself. A child that dies
(a crash, the OOM killer, a SIGKILL) is restarted, at once if it had run for
:data:`HEALTHY_RUN` seconds, else after a delay that doubles up to :data:`MAX_RESTART_DELAY`,
so a child that cannot start does not spin. Its jobs are not lost: their leases lapse and
any worker reclaims them.

SIGTERM or SIGINT to the supervisor is forwarded to every child as SIGTERM: each stops
gracefully, as a single worker does. A child ignores any further stop signal (Ctrl-C in a
terminal, or systemd, signals the whole process group: each child gets the signal itself and
again from the supervisor), so only the supervisor decides to hurry: a second signal to it
SIGKILLs the children (their leases lapse, as after any crash), as does the ``stop_timeout``
passing with a child still running (a worker that should have exited by then). The
supervisor exits when all
children have, with status 0 if every child exited 0. On Linux a child is sent SIGTERM if the
supervisor itself dies, so no worker is orphaned.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from types import FrameType

from django.db import connections

logger = logging.getLogger("django_jobq.worker")

#: Seconds a child must have run for its death to count as a one-off: restarted at once.
HEALTHY_RUN = 10.0
#: Seconds before restarting a child that died sooner: doubling from the first, capped.
FIRST_RESTART_DELAY = 0.5
MAX_RESTART_DELAY = 30.0
#: Linux ``prctl`` option: a signal the kernel sends a process when its parent dies.
_PR_SET_PDEATHSIG = 1


#: The signals the supervisor handles and forwards.
_STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})


def stop_with_parent() -> None:
    """In a new child process: ask the kernel to SIGTERM it when its parent dies (Linux
    only; elsewhere a no-op), so a supervisor that is itself killed leaves no workers
    behind. Safe between fork and exec (``subprocess.Popen(preexec_fn=...)``): it loads no
    library, ``prctl`` is looked up in the symbols the process already has."""
    if sys.platform == "linux":
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _exit_with_parent(parent: int) -> None:
    """:func:`stop_with_parent`, and exit if the supervisor died already (between the fork
    and this call)."""
    stop_with_parent()
    if os.getppid() != parent:
        os._exit(1)


def _child_main(run_worker: Callable[[int], int], slot: int, parent: int) -> None:
    """A child's first steps: the supervisor's signal handlers are not the child's (default
    actions until ``run_worker`` installs its own: a child stopped before it holds any job
    has nothing to finish), then the signals blocked across the fork are let through."""
    for signum in _STOP_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
    _exit_with_parent(parent)
    sys.exit(run_worker(slot))


@dataclass
class _Slot:
    """One of the N places a child fills."""

    number: int
    process: BaseProcess | None = None
    started: float = 0.0
    restart_at: float = 0.0
    restart_delay: float = 0.0
    exit_code: int | None = None


class Supervisor:
    """Keeps ``processes`` children running ``run_worker(slot)`` until signalled.

    Args:
        processes: how many children (>= 1).
        run_worker: runs one worker in the child and returns its exit status; it installs
            the child's own signal handlers. ``slot`` is 0 to ``processes - 1``.
        restart_finished: restart a child that exited with status 0 (a worker only does so
            when stopped; a burst worker when its queue is drained, and then it is done).
        on_exit: called with the pid of each child reaped (e.g.
            :func:`django_jobq.metrics.multiprocess.mark_process_dead`).
        stop_timeout: seconds after the first signal by which every child must have
            exited; those still running are SIGKILLed (``None``: wait however long).
    """

    def __init__(
        self,
        processes: int,
        run_worker: Callable[[int], int],
        *,
        restart_finished: bool = True,
        on_exit: Callable[[int], None] | None = None,
        stop_timeout: float | None = None,
    ) -> None:
        if processes < 1:
            raise ValueError(f"processes must be >= 1, not {processes}.")
        self._slots = [_Slot(n) for n in range(processes)]
        self._run_worker = run_worker
        self._restart_finished = restart_finished
        self._on_exit = on_exit
        self._context = multiprocessing.get_context("fork")
        self._signals = 0
        self._stop_timeout = stop_timeout
        self._kill_at: float | None = None  # time.monotonic(): the stop timeout passes
        # A self-pipe: a signal wakes the wait for children, to plan the stop timeout.
        self._wakeup_read, self._wakeup_write = os.pipe()
        self.restarts = 0

    def _forward(self, signum: int, frame: FrameType | None) -> None:
        self._signals += 1
        hurry = self._signals > 1
        if self._signals == 1 and self._stop_timeout is not None:
            self._kill_at = time.monotonic() + self._stop_timeout
            os.write(self._wakeup_write, b"x")
        logger.info(
            "supervisor: %s, %s %s worker process(es)",
            signal.Signals(signum).name,
            "killing" if hurry else "stopping",
            len(self._running()),
        )
        for slot in self._running():
            assert slot.process is not None and slot.process.pid is not None
            with contextlib.suppress(ProcessLookupError):  # exited just now
                os.kill(slot.process.pid, signal.SIGKILL if hurry else signal.SIGTERM)

    def _running(self) -> list[_Slot]:
        return [s for s in self._slots if s.process is not None and s.exit_code is None]

    def _start(self, slot: _Slot) -> None:
        connections.close_all()  # a child must never share the supervisor's connections
        process = self._context.Process(
            target=_child_main,
            args=(self._run_worker, slot.number, os.getpid()),
            name=f"jobq-worker-{slot.number}",
        )
        # Blocked across the fork, so the child never runs the supervisor's handler.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        try:
            process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        slot.process, slot.started, slot.exit_code = process, time.monotonic(), None
        logger.info("supervisor: started worker process %s (pid %s)", slot.number, process.pid)

    def _kill_overdue(self) -> None:
        """SIGKILL the children still running when the stop timeout passed (once)."""
        self._kill_at = None
        for slot in self._running():
            assert slot.process is not None and slot.process.pid is not None
            logger.warning(
                "supervisor: worker process %s (pid %s) still running %g s after the stop "
                "signal: killing it",
                slot.number,
                slot.process.pid,
                self._stop_timeout,
            )
            with contextlib.suppress(ProcessLookupError):
                os.kill(slot.process.pid, signal.SIGKILL)

    def _reap(self, slot: _Slot) -> None:
        """Record a child's exit and decide whether (and when) to restart it."""
        assert slot.process is not None
        slot.process.join()
        slot.exit_code = code = slot.process.exitcode
        if self._on_exit is not None and slot.process.pid is not None:
            self._on_exit(slot.process.pid)
        ran = time.monotonic() - slot.started
        if self._signals:
            return
        if code == 0 and not self._restart_finished:
            logger.info("supervisor: worker process %s finished", slot.number)
            return
        slot.restart_delay = (
            0.0
            if ran >= HEALTHY_RUN
            else min(max(slot.restart_delay * 2, FIRST_RESTART_DELAY), MAX_RESTART_DELAY)
        )
        slot.restart_at = time.monotonic() + slot.restart_delay
        how = f"signal {signal.Signals(-code).name}" if code is not None and code < 0 else code
        logger.warning(
            "supervisor: worker process %s (pid %s) exited (%s) after %.1f s; restarting it "
            "in %.2g s",
            slot.number,
            slot.process.pid,
            how,
            ran,
            slot.restart_delay,
        )

    def _awaiting_restart(self) -> list[_Slot]:
        return [
            s
            for s in self._slots
            if s.exit_code is not None
            and not self._signals
            and (s.exit_code != 0 or self._restart_finished)
        ]

    def run(self) -> int:
        """Run until every child has exited after a signal (or, without restarts of finished
        children, until all are done); return 0 if every child's last exit status was 0,
        else 1. Installs SIGTERM and SIGINT handlers."""
        signal.signal(signal.SIGTERM, self._forward)
        signal.signal(signal.SIGINT, self._forward)
        for slot in self._slots:
            self._start(slot)
        while self._running() or self._awaiting_restart():
            now = time.monotonic()
            for slot in self._awaiting_restart():
                if slot.restart_at <= now:
                    self.restarts += 1
                    self._start(slot)
            pending = [s.restart_at - now for s in self._awaiting_restart()]
            if self._kill_at is not None and now >= self._kill_at:
                self._kill_overdue()
            if self._kill_at is not None:
                pending.append(self._kill_at - now)
            sentinels = {s.process.sentinel: s for s in self._running() if s.process is not None}
            ready = wait(
                [*sentinels, self._wakeup_read], timeout=max(min(pending), 0) if pending else None
            )
            for sentinel in ready:
                if sentinel == self._wakeup_read:
                    os.read(self._wakeup_read, 64)
                else:
                    self._reap(sentinels[sentinel])  # type: ignore[index]
        codes = [slot.exit_code for slot in self._slots]
        logger.info("supervisor: all worker processes exited (%s)", codes)
        return 0 if all(code == 0 for code in codes) else 1
