"""What a worker tells its operators: metrics, structured log fields, signals, history.

Per job, without any statement of its own: the claim's counts and pickup latencies
(:meth:`Observer.claimed`); each outcome's counters, duration, rollup entry and signal
(:meth:`Observer.record`, called by the completer after the outcome's write). Around each
handler, on its thread, the executor sends ``job_started`` and counts the thread busy
(:func:`django_jobq.metrics.instruments.handler_started`).

Periodically, from the worker's main loop (:meth:`Observer.tick`), on the worker's own
connection, each on a timer of its own (:class:`.timers.Every`): the registration beat
(:data:`.registration.BEAT_INTERVAL`), the rollup flush when outcomes wait
(:data:`.history.FLUSH_INTERVAL`) and the queue sample (tried every
:data:`.history.SAMPLE_INTERVAL` seconds; taken by one worker per minute).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import psycopg

from .. import registry, signals
from ..claims import ClaimedJob
from ..db import Cursor
from ..metrics import instruments
from ..outcomes import Action, Outcome
from .history import FLUSH_INTERVAL, SAMPLE_INTERVAL, OutcomeRollups, sample_queues
from .registration import BEAT_INTERVAL, Registration
from .timers import Every

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


def send_outcome_signal(outcome: Outcome, name: str) -> None:
    """Send the signal of a recorded outcome (``name`` as :func:`outcome_name`, not
    ``lease_lost``): ``job_succeeded``, ``job_failed`` or ``job_dead_lettered``; never raises
    (see :func:`django_jobq.signals.send`). Also used by :mod:`django_jobq.testing`."""
    job = outcome.job
    duration = outcome.duration if outcome.ran else None
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
        slots: int | None = None,
    ) -> None:
        """``concurrency``: the worker's threads (registered); ``slots``: its handler slots,
        threads and async ones, counted by the ``jobq_worker_threads`` gauge (default: the
        threads)."""
        self._slots = concurrency if slots is None else slots
        self._registration = Registration(
            worker_id=worker_id, queues=queues, concurrency=concurrency, kinds=kinds
        )
        self.rollups = OutcomeRollups()
        self._beat = Every(BEAT_INTERVAL)
        self._flush = Every(FLUSH_INTERVAL)
        self._sample = Every(SAMPLE_INTERVAL)

    def start(self, cursor: Cursor) -> None:
        """Register the worker and count its handler threads."""
        self._registration.register(cursor)
        self._beat.restart()  # registering is the first beat
        instruments.threads_started(self._slots)

    def claimed(self, jobs: Sequence[ClaimedJob]) -> None:
        """Count a claim's jobs, its reclaims and their pickup latencies."""
        if jobs:
            instruments.observe_claims(jobs)

    def record(self, outcome: Outcome, name: str) -> None:
        """Record an outcome the completer has just written (or found refused): metrics,
        the rollup, then the signal (receivers run last: their delay or failure cannot
        touch what was recorded)."""
        job = outcome.job
        if name == "lease_lost":
            instruments.observe_refused(_REFUSED_OPERATION.get(outcome.action, "ack"))
            return
        duration = outcome.duration if outcome.ran else None
        instruments.observe_outcome(
            job.queue, job.kind, name, duration=duration, reason=outcome.reason
        )
        self.rollups.add(job.queue, job.kind, name, duration)
        send_outcome_signal(outcome, name)

    def tick(self, cursor: Cursor) -> None:
        """Run the periodic writes that are due (a few statements a minute at most).

        Raises:
            psycopg.Error: a statement failed (the worker's connection is broken).
        """
        if self._beat.due():
            self._registration.beat(cursor)
        if self.rollups.pending and self._flush.due():
            self.rollups.flush(cursor)
        if self._sample.due():
            sample_queues(cursor)

    def seconds_until_due(self) -> float:
        """Seconds until :meth:`tick` has something to do (an idle worker wakes for it)."""
        timers = [self._beat, self._sample, *([self._flush] if self.rollups.pending else [])]
        return min(timer.seconds_left() for timer in timers)

    def stop(self, cursor: Cursor) -> None:
        """Flush the last outcomes and deregister; best effort, since the worker may be
        stopping because its connection broke (then its row goes stale, and is pruned)."""
        instruments.threads_stopped(self._slots)
        try:
            self.rollups.flush(cursor)
            self._registration.deregister(cursor)
        except psycopg.Error as exc:
            logger.warning("could not flush statistics or deregister the worker: %s", exc)
