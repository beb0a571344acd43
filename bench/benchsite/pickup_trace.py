"""Where a django-jobq worker's pickup latency goes: timestamps of each step, for the harness.

Installed by :mod:`benchsite.jobs` in a worker process when ``JOBQ_BENCH_TRACE`` is set
(``bench/run.py --trace-pickup``); never in a measured run without that flag. It wraps four
of the worker's functions and appends one line per event to
``$JOBQ_BENCH_RECORD_DIR/<pid>.trace`` (``time.monotonic_ns()``, the clock of the producer's
commit times and of :mod:`benchsite.recorder`):

- ``notify <ns>``: the worker read a notification of a served queue (the listener's
  ``wake``, called on the main loop's thread, which waits on the listener's socket);
- ``turn <ns>``: a pass of the main loop starts (:meth:`Worker._turn`);
- ``claim <start ns> <end ns> <n>...``: a claim statement, and the numbers of the jobs it
  took (payload ``n``);
- ``run <ns> <n>``: a handler thread takes job ``n`` (:func:`executor.execute` starts).

:func:`breakdown` joins them with the commits and handler starts into per-job segments.
Each wrapper costs a ``monotonic_ns()`` and one ``os.write``: microseconds, small beside
the milliseconds measured, but a traced run is a profile, not a benchmark figure.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .recorder import record_line

#: The segments of a job's pickup, in order; their sum is its pickup latency.
SEGMENTS = (
    ("delivery", "commit -> the main loop reads the NOTIFY"),
    ("loop wake", "NOTIFY read -> the main loop's turn starts"),
    ("before claim", "turn start -> claim statement sent (outcomes flushed first)"),
    ("claim", "the claim statement's round trip"),
    ("thread handoff", "claim returned -> a handler thread takes the job"),
    ("before handler", "thread takes the job -> handler starts (hygiene, span, signal)"),
)


def install() -> None:
    """Wrap the worker's listener wake, loop turn, claim and execute (this process only)."""
    from django_jobq import claims
    from django_jobq.worker import executor, listener, worker

    original_init = listener.Listener.__init__

    def init(self: Any, *, wake: Callable[..., None], **kwargs: Any) -> None:
        def traced_wake(*args: Any) -> None:
            record_line(b"notify %d\n" % time.monotonic_ns(), suffix="trace")
            wake(*args)

        original_init(self, wake=traced_wake, **kwargs)

    listener.Listener.__init__ = init  # type: ignore[method-assign]

    original_turn = worker.Worker._turn

    def turn(self: Any, connection: Any) -> Any:
        record_line(b"turn %d\n" % time.monotonic_ns(), suffix="trace")
        return original_turn(self, connection)

    worker.Worker._turn = turn  # type: ignore[method-assign]

    original_claim = claims.claim

    def claim(*args: Any, **kwargs: Any) -> Any:
        started = time.monotonic_ns()
        jobs = original_claim(*args, **kwargs)
        if jobs:
            numbers = b" ".join(b"%d" % _number(job.payload) for job in jobs)
            line = b"claim %d %d %s\n" % (started, time.monotonic_ns(), numbers)
            record_line(line, suffix="trace")
        return jobs

    claims.claim = claim

    original_execute = executor.execute

    def execute(held: Any, extend: Any) -> Any:
        line = b"run %d %d\n" % (time.monotonic_ns(), _number(held.job.payload))
        record_line(line, suffix="trace")
        return original_execute(held, extend)

    executor.execute = execute


def _number(payload: Mapping[str, Any]) -> int:
    """The benchmark's job number ``n`` in a job's payload: a ``@job``'s own argument, or a
    Django task's keyword argument (its job's payload holds the call); -1 if neither."""
    kwargs = payload.get("kwargs")
    number = kwargs.get("n", -1) if isinstance(kwargs, dict) else payload.get("n", -1)
    return number if isinstance(number, int) else -1


def read(directory: Path) -> dict[str, Any]:
    """The events of every ``*.trace`` file in ``directory``: sorted ``notify`` and ``turn``
    times, and per job number its claim (start, end) and its thread's ``run`` time."""
    notifies: list[int] = []
    turns: list[int] = []
    claimed: dict[int, tuple[int, int]] = {}
    ran: dict[int, int] = {}
    for path in directory.glob("*.trace"):
        for line in path.read_text(encoding="ascii").splitlines():
            event, *fields = line.split()
            values = [int(field) for field in fields]
            if event == "notify":
                notifies.append(values[0])
            elif event == "turn":
                turns.append(values[0])
            elif event == "claim":
                for number in values[2:]:
                    claimed.setdefault(number, (values[0], values[1]))
            elif event == "run":
                ran.setdefault(values[1], values[0])
    return {"notify": sorted(notifies), "turn": sorted(turns), "claim": claimed, "run": ran}


def breakdown(
    directory: Path, commits: Mapping[int, int], starts: Mapping[int, int]
) -> dict[str, list[int]]:
    """Per segment (:data:`SEGMENTS`), the nanoseconds of each traced job.

    A job's notification is the first one heard after its commit; when the claim that took
    it started before that (the loop was already claiming), delivery and loop wake count 0
    and "before claim" runs from the commit. A turn counts from its start or from the
    notification, whichever is later (a turn already under way when it arrived)."""
    events = read(directory)
    notifies, turns = events["notify"], events["turn"]
    segments: dict[str, list[int]] = {name: [] for name, _ in SEGMENTS}
    for number, commit in commits.items():
        if number not in events["claim"] or number not in events["run"] or number not in starts:
            continue
        claim_start, claim_end = events["claim"][number]
        index = bisect.bisect_left(notifies, commit)
        notify = notifies[index] if index < len(notifies) else claim_start
        notify = min(notify, claim_start)
        turn_index = bisect.bisect_right(turns, claim_start) - 1
        turn = max(turns[turn_index] if turn_index >= 0 else notify, notify)
        values = (
            notify - commit,
            turn - notify,
            claim_start - turn,
            claim_end - claim_start,
            events["run"][number] - claim_end,
            starts[number] - events["run"][number],
        )
        for (name, _), value in zip(SEGMENTS, values, strict=True):
            segments[name].append(max(value, 0))
    return segments
