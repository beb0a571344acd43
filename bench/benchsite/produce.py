"""Enqueue the benchmark's jobs: ``python -m benchsite.produce SYSTEM MODE [options]``.

Each job's payload is ``{"n": <number>}``, numbers ``--first`` (0) to ``--first`` + N - 1:
the key that joins a job's commit time here to its handler's start time
(:mod:`benchsite.recorder`). Modes:

- ``bulk``: N jobs as fast as the system's API allows, in one transaction where the API
  has one (django-jobq: ``enqueue_many`` of ``--batch`` jobs per statement in one
  ``atomic()``; django-tasks-db: one ``enqueue()`` per job in one ``atomic()``; procrastinate:
  ``batch_defer`` of ``--batch`` jobs, each call its own transaction).
- ``paced``: ``--rate`` jobs/s, ``--batch`` jobs per transaction; transaction k is due at
  t0 + k * batch / rate (open loop: a late transaction does not delay the next one's due
  time).
- ``unpaced``: transactions of ``--batch`` jobs, back to back.
- ``rate``: like ``unpaced``, timed: the enqueue-rate scenario.

``--handler write`` enqueues the job that also writes a row (``bench.write``) instead of
the no-op (django-jobq and procrastinate).

One line per transaction goes to ``--out`` as it commits (flushed, so the harness can follow
it): ``<first n> <count> <commit ns>``, the ``time.monotonic_ns()`` read right after the
commit returned: in a Django ``atomic()`` block, by its first ``on_commit`` callback, which
runs before those the enqueue registered (Django Tasks' ``task_enqueued``, sent by
django-jobq's backend and django-tasks-db's after the commit); read after them, the commit
time would be late by their run, and the pickup latency short by as much. SIGTERM stops the
producer after the transaction under way (the jobs it committed are in ``--out``). A JSON
summary goes to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from typing import IO, Any


class Enqueuer:
    """Enqueues jobs ``ns`` for one system; ``enqueue`` is one transaction, and returns the
    ``time.monotonic_ns()`` of its commit when it reads it itself (``None``: the caller
    reads the clock when it returns)."""

    def enqueue(self, ns: Sequence[int]) -> int | None:
        raise NotImplementedError

    def bulk(self, ns: Sequence[int], chunk: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


def chunks(ns: Sequence[int], size: int) -> list[Sequence[int]]:
    return [ns[start : start + size] for start in range(0, len(ns), size)]


def committed_at(atomic: Any, insert: Callable[[], None]) -> int:
    """Run ``insert`` in a Django ``atomic()`` block; the ``time.monotonic_ns()`` right after
    its commit returned (the block's first ``on_commit`` callback reads it)."""
    from django.db import transaction

    stamp: list[int] = []
    with atomic():
        transaction.on_commit(lambda: stamp.append(time.monotonic_ns()))
        insert()
    return stamp[0]


class JobqEnqueuer(Enqueuer):
    def __init__(self, handler: str) -> None:
        import django

        django.setup()
        from django.db import connection, transaction

        from benchsite import jobs
        from django_jobq import enqueue_many

        self.atomic = transaction.atomic
        self.noop = getattr(jobs, handler)
        self.enqueue_many = enqueue_many
        connection.ensure_connection()

    def _insert(self, ns: Sequence[int]) -> None:
        if len(ns) == 1:
            self.noop.enqueue(n=ns[0])
        else:
            self.enqueue_many([self.noop.prepare(n=n) for n in ns])

    def enqueue(self, ns: Sequence[int]) -> int:
        return committed_at(self.atomic, lambda: self._insert(ns))

    def bulk(self, ns: Sequence[int], chunk: int) -> None:
        with self.atomic():
            for part in chunks(ns, chunk):
                self._insert(part)


class TasksEnqueuer(Enqueuer):
    """Django Tasks' ``Task.enqueue()`` on one backend (there is no bulk enqueue)."""

    def __init__(self, backend: str) -> None:
        import django

        django.setup()
        from django.db import connection, transaction

        from benchsite import tasks

        self.atomic = transaction.atomic
        self.task = tasks.noop if backend == "default" else tasks.noop_on_jobq
        connection.ensure_connection()

    def enqueue(self, ns: Sequence[int]) -> int:
        def insert() -> None:
            for n in ns:
                self.task.enqueue(n=n)

        return committed_at(self.atomic, insert)

    def bulk(self, ns: Sequence[int], chunk: int) -> None:
        self.enqueue(ns)


class ProcrastinateEnqueuer(Enqueuer):
    def __init__(self, handler: str) -> None:
        from benchsite import procrastinate_app

        self.app = procrastinate_app.app.open()
        self.noop = getattr(procrastinate_app, handler)

    def enqueue(self, ns: Sequence[int]) -> None:  # each call its own transaction
        if len(ns) == 1:
            self.noop.defer(n=ns[0])
        else:
            self.noop.batch_defer(*({"n": n} for n in ns))

    def bulk(self, ns: Sequence[int], chunk: int) -> None:
        for part in chunks(ns, chunk):
            self.enqueue(part)

    def close(self) -> None:
        self.app.close()


def make_enqueuer(system: str, handler: str = "noop") -> Enqueuer:
    if system == "jobq":
        return JobqEnqueuer(handler)
    if system == "procrastinate":
        return ProcrastinateEnqueuer(handler)
    if handler != "noop":
        raise SystemExit(f"{system} has only the noop handler")
    if system == "tasksdb":
        return TasksEnqueuer("default")
    if system == "tasks-jobq":
        return TasksEnqueuer("jobq")
    if system == "tasks-db":
        return TasksEnqueuer("default")
    raise SystemExit(f"unknown system {system!r}")


class Stop:
    """Set by SIGTERM: the producer stops after the transaction under way."""

    requested = False

    @classmethod
    def request(cls, signum: int, frame: object) -> None:
        cls.requested = True


def produce(enqueuer: Enqueuer, args: argparse.Namespace, out: IO[str]) -> dict[str, Any]:
    """Enqueue as ``args`` say, one line per transaction to ``out``; return the summary."""
    numbers = range(args.first, args.first + args.jobs)
    started = time.monotonic_ns()
    if args.mode == "bulk":
        enqueuer.bulk(numbers, args.batch)
        out.write(f"{args.first} {args.jobs} {time.monotonic_ns()}\n")
        seconds = (time.monotonic_ns() - started) / 1e9
        return {"seconds": seconds, "late_ms": 0.0, "jobs": args.jobs, "transactions": 1}
    interval_ns = args.batch * 1e9 / args.rate if args.mode == "paced" else 0.0
    late_ns = 0.0
    jobs = transactions = 0
    for k, part in enumerate(chunks(numbers, args.batch)):
        if interval_ns:
            due = started + k * interval_ns
            wait = due - time.monotonic_ns()
            if wait > 0:
                time.sleep(wait / 1e9)
            else:
                late_ns = max(late_ns, -wait)
        if Stop.requested:
            break
        commit_ns = enqueuer.enqueue(part)
        if commit_ns is None:
            commit_ns = time.monotonic_ns()
        out.write(f"{part[0]} {len(part)} {commit_ns}\n")
        out.flush()
        jobs += len(part)
        transactions += 1
    seconds = (time.monotonic_ns() - started) / 1e9
    return {
        "seconds": seconds,
        "late_ms": late_ns / 1e6,
        "jobs": jobs,
        "transactions": transactions,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("system")
    parser.add_argument("mode", choices=["bulk", "paced", "unpaced", "rate"])
    parser.add_argument("--jobs", type=int, required=True)
    parser.add_argument("--first", type=int, default=0, help="the first job's number (0)")
    parser.add_argument("--batch", type=int, default=1, help="jobs per transaction")
    parser.add_argument("--rate", type=float, default=0.0, help="jobs/s (paced)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--handler", choices=["noop", "write"], default="noop")
    args = parser.parse_args(argv)
    if args.mode == "paced" and args.rate <= 0:
        parser.error("paced needs --rate")
    signal.signal(signal.SIGTERM, Stop.request)
    enqueuer = make_enqueuer(args.system, args.handler)
    try:
        with open(args.out, "w", encoding="ascii") as out:
            summary = produce(enqueuer, args, out)
    finally:
        enqueuer.close()
    summary.update(pid=os.getpid())
    json.dump(summary, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
