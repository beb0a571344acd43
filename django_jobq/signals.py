"""Signals the worker sends about each job, for your own hooks (Django signals).

::

    from django.dispatch import receiver

    from django_jobq.signals import job_dead_lettered
    from shop.jobs import charge_card


    @receiver(job_dead_lettered, sender=charge_card)  # one kind; leave out sender for all
    def tell_the_on_call(sender, job, reason, error, **kwargs):
        ...

=====================  ==================================================  ===================
signal                 sent                                                keyword arguments
=====================  ==================================================  ===================
``job_started``        on the handler thread, just before the handler      ``job``
                       runs
``job_succeeded``      after the ack is recorded (or the handler's         ``job, duration``
                       ``ctx.atomic()`` committed it)
``job_failed``         after a retry is recorded: the handler raised and   ``job, duration,
                       the job will run again                              error, retry_delay``
``job_dead_lettered``  after the job moved to the dead letters (a final    ``job, duration,
                       failure, or dead-lettered unrun: expired, unknown   reason, error``
                       kind, lease lapsed on its last attempt)
=====================  ==================================================  ===================

Each outcome the worker records sends exactly one of the last three; an outcome it cannot
record (another attempt holds the lease) sends none. ``sender`` is the kind's
:class:`~django_jobq.JobDefinition` (what ``@job`` returned), or ``None`` for a kind
not registered in the worker. ``job`` is a :class:`~django_jobq.claims.ClaimedJob` (``id``,
``queue``, ``kind``, ``payload``, ``attempt``, ``max_attempts``...). ``duration`` and
``retry_delay`` are seconds (``duration`` is ``None`` for a job dead-lettered unrun);
``error`` is the exception as text (``"ValueError: ..."``).

Receivers are your code, so the worker guards against them: a receiver's exception is logged
(Django logs it on ``django.dispatch``) and ignored, the other receivers still run, and the
outcome, recorded before the signal is sent, stands. The outcome signals are sent on the
worker's main thread, which also claims jobs: keep receivers quick (enqueue a job for slow
work).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from django.dispatch import Signal

from . import registry

if TYPE_CHECKING:
    from .claims import ClaimedJob

logger = logging.getLogger("django_jobq.signals")

job_started = Signal()
job_succeeded = Signal()
job_failed = Signal()
job_dead_lettered = Signal()


def send(signal: Signal, job: ClaimedJob, **arguments: Any) -> None:
    """Send ``signal`` about ``job`` to its receivers, with the kind's definition as sender.

    Never raises: receivers' exceptions are caught (``send_robust``), and so is anything
    that escapes it (``SystemExit`` from a receiver, say), which is logged here.
    """
    try:
        signal.send_robust(registry.get(job.kind), job=job, **arguments)
    except BaseException:
        logger.exception("job %s %s: a signal receiver failed", job.id, job.kind)
