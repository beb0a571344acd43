"""What a worker tells its operators: metrics, structured log fields, signals, history.

Per job, without any statement of its own: the claim's counts and pickup latencies
(:meth:`Observer.claimed`); each outcome's counters, duration, rollup entry and signal
(:meth:`Observer.record`, called by the completer after the outcome's write). Around each
handler, on its thread, the executor sends ``job_started`` and counts the thread busy
(:func:`django_jobq.metrics.handler_started`).

Periodically, from the worker's main loop (:meth:`Observer.tick`), on the worker's own
connection: the registration beat (every 10 s), the rollup flush (every 5 s when outcomes
wait) and the queue sample (tried every 20 s; taken by one worker per minute).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import psycopg

from .. import metrics, registry, signals
from ..claims import ClaimedJob
from ..db import Cursor
from ..outcomes import Action, Outcome
from .history import FLUSH_INTERVAL, SAMPLE_INTERVAL, OutcomeRollups, sample_queues
from .registration import BEAT_INTERVAL, Registration

logger = logging.getLogger("django_jobq.worker")

#: The operation a lost lease refused, by the action the outcome wanted.
_REFUSED_OPERATION = {
    Action.ACK: "ack",
    Action.LEASE_LOST: "ack",  # the handler's ctx.atomic() ack found another attempt
    Action.RETRY: "retry",
    Action.DEAD_LETTER: "dead_letter",
}


def outcome_name(outcome: Outcome, applied: bool) -> str:
    """``succeeded``, ``retried``, ``dead_lettered``, or ``lease_lost`` (not recorded)."""
    if not applied or outcome.action is Action.LEASE_LOST:
        return "lease_lost"
    if outcome.action is Action.RETRY:
        return "retried"
    if outcome.action is Action.DEAD_LETTER:
        return "dead_lettered"
    return "succeeded"  # ACK, ACKED_BY_HANDLER


def log_fields(outcome: Outcome, name: str) -> dict[str, Any]:
    """The structured fields of a job's log line (``extra=``; see docs/operations.md):
    ``job_id``, ``queue``, ``kind`` (as stored in the job's row), ``handler`` (the kind of
    the definition that runs it: ``kind`` itself, the new name when ``kind`` is an alias,
    ``None`` when no handler is registered), ``attempt``, ``max_attempts``, ``outcome`` (as
    :func:`outcome_name`), ``duration`` (seconds; ``None`` if the handler did not run),
    ``retry_delay`` (seconds, retries), ``reason`` (dead letters) and ``error``."""
    job = outcome.job
    return {
        "job_id": job.id,
        "queue": job.queue,
        "kind": job.kind,
        "handler": definition.kind if (definition := registry.get(job.kind)) else None,
        "attempt": job.attempt,
        "max_attempts": job.max_attempts,
        "outcome": name,
        "duration": outcome.duration if outcome.ran else None,
        "retry_delay": outcome.retry_delay if outcome.action is Action.RETRY else None,
        "reason": outcome.reason or None,
        "error": outcome.error or None,
    }


class _Every:
    """A deadline that comes round every ``interval`` seconds (``time.monotonic()``)."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.next = time.monotonic()

    def due(self, now: float) -> bool:
        if now < self.next:
            return False
        self.next = now + self.interval
        return True


class Observer:
    """A worker's observability; the worker calls :meth:`start`, :meth:`claimed`,
    :meth:`tick` and :meth:`stop`, its completer :meth:`record`."""

    def __init__(
        self,
        *,
        worker_id: str,
        queues: Sequence[str] | None,
        concurrency: int,
        kinds: Sequence[str],
    ) -> None:
        self._concurrency = concurrency
        self._registration = Registration(
            worker_id=worker_id, queues=queues, concurrency=concurrency, kinds=kinds
        )
        self.rollups = OutcomeRollups()
        self._beat = _Every(BEAT_INTERVAL)
        self._flush = _Every(FLUSH_INTERVAL)
        self._sample = _Every(SAMPLE_INTERVAL)

    def start(self, cursor: Cursor) -> None:
        """Register the worker and count its handler threads."""
        self._registration.register(cursor)
        self._beat.due(time.monotonic())
        metrics.threads_started(self._concurrency)

    def claimed(self, jobs: Sequence[ClaimedJob]) -> None:
        """Count a claim's jobs, its reclaims and their pickup latencies."""
        if jobs:
            metrics.observe_claims(jobs)

    def record(self, outcome: Outcome, name: str) -> None:
        """Record an outcome the completer has just written (or found refused): metrics,
        the rollup, then the signal (receivers run last: their delay or failure cannot
        touch what was recorded)."""
        job = outcome.job
        if name == "lease_lost":
            metrics.observe_refused(_REFUSED_OPERATION.get(outcome.action, "ack"))
            return
        duration = outcome.duration if outcome.ran else None
        metrics.observe_outcome(job.queue, job.kind, name, duration=duration, reason=outcome.reason)
        self.rollups.add(job.queue, job.kind, name, duration)
        if name == "succeeded":
            signals.send(signals.job_succeeded, job, duration=duration)
        elif name == "retried":
            signals.send(
                signals.job_failed,
                job,
                duration=duration,
                error=outcome.error,
                retry_delay=outcome.retry_delay,
            )
        else:
            signals.send(
                signals.job_dead_lettered,
                job,
                duration=duration,
                reason=outcome.reason,
                error=outcome.error,
            )

    def tick(self, cursor: Cursor) -> None:
        """Run the periodic writes that are due (a few statements a minute at most).

        Raises:
            psycopg.Error: a statement failed (the worker's connection is broken).
        """
        now = time.monotonic()
        if self._beat.due(now):
            self._registration.beat(cursor)
        if self.rollups.pending and self._flush.due(now):
            self.rollups.flush(cursor)
        if self._sample.due(now):
            sample_queues(cursor)

    def seconds_until_due(self) -> float:
        """Seconds until :meth:`tick` has something to do (an idle worker wakes for it)."""
        deadlines = [self._beat.next, self._sample.next]
        if self.rollups.pending:
            deadlines.append(self._flush.next)
        return max(min(deadlines) - time.monotonic(), 0.0)

    def stop(self, cursor: Cursor) -> None:
        """Flush the last outcomes and deregister; best effort, since the worker may be
        stopping because its connection broke (then its row goes stale, and is pruned)."""
        metrics.threads_stopped(self._concurrency)
        try:
            self.rollups.flush(cursor)
            self._registration.deregister(cursor)
        except psycopg.Error as exc:
            logger.warning("could not flush statistics or deregister the worker: %s", exc)
