"""Exceptions a handler raises to steer its job, and those enqueue raises for a mistake.

::

    from django_jobq.exceptions import Fail, Retry

    @job
    def charge(order_id: int) -> None:
        try:
            gateway.charge(order_id)
        except RateLimited as exc:
            raise Retry(delay=exc.retry_after) from exc     # wait as long as the API asks
        except CardDeclined as exc:
            raise Fail(f"card declined: {exc.code}") from exc  # retrying cannot help

    enqueue("shop.jobs.send_reciept")   # UnknownKind: ... did you mean 'shop.jobs.send_receipt'?
"""

from __future__ import annotations

from .conf import MAX_DURATION


class Retry(Exception):
    """Retry this job after ``delay`` seconds instead of the backoff policy's delay.

    The attempt still counts: on the final attempt the job becomes a dead letter
    ("max attempts exceeded") like any other failure.
    """

    def __init__(self, delay: float | None = None, message: str = "") -> None:
        if delay is not None and not 0 <= delay <= MAX_DURATION:  # also refuses NaN
            raise ValueError(f"Retry delay must be 0 to {MAX_DURATION:g} seconds, got {delay!r}.")
        self.delay = delay
        super().__init__(message or (f"retry in {delay:g} s" if delay is not None else "retry"))


class PermanentError(Exception):
    """Base for failures that retrying cannot fix: the job becomes a dead letter at once,
    with reason ``"failed: <message>"``. Subclass it for your own permanent errors."""


class Fail(PermanentError):
    """Dead-letter this job now: ``raise Fail("order was deleted")``."""


class MaxRuntimeExceeded(Exception):
    """The worker cancelled an async handler's task when it ran past its kind's
    ``max_runtime`` (raised by the worker, never by a handler). The attempt fails like one
    that raised: it retries after the kind's backoff, whatever ``retry_on`` says, or becomes
    a dead letter ("max attempts exceeded") on the final attempt. Its message: "max_runtime
    of N s exceeded; the task was cancelled"."""


class Aborted(Exception):
    """The handler stopped because an operator asked its attempt to stop
    (:func:`django_jobq.operations.abort`, the admin's "Abort the selected running jobs").

    Raised by :meth:`~django_jobq.context.JobContext.raise_if_aborted` once the worker has
    seen the request, and by the worker in an async handler whose task it cancelled for the
    request; a handler may raise it itself too. An attempt that raises it (or any exception)
    after the worker saw the request becomes a dead letter with reason "aborted" at once,
    whatever attempts remain. Raised with no request seen it is an ordinary exception: the
    attempt fails and retries as any failure does (docs/flow-control.md,
    "Aborting a running job")."""


class UnknownKind(LookupError):
    """Enqueue was given a kind that no ``@job`` (or task) registers in this process.

    Raised by :func:`~django_jobq.enqueue`, :func:`~django_jobq.enqueue_many` and
    :func:`~django_jobq.enqueueing.prepare_job`, so a typo fails at the call, not later in
    a worker as an "unknown kind" dead letter. Kinds defined in another service are
    enqueued with ``enqueue(kind, ..., allow_unregistered=True)``, or everywhere with
    ``JOBQ['ENQUEUE_UNREGISTERED_KINDS'] = True``.

    Attributes:
        kind: the kind given (str).
        suggestion: the registered kind closest to it, or ``None``.
    """

    def __init__(self, kind: str, suggestion: str | None) -> None:
        self.kind = kind
        self.suggestion = suggestion
        near = f"; did you mean {suggestion!r}?" if suggestion else "."
        super().__init__(
            f"no job kind {kind!r} is registered in this process{near} A kind is registered "
            f"when the module defining its @job (an installed app's jobs module) is imported. "
            f"To enqueue a kind that another service's workers run, pass "
            f"allow_unregistered=True, or set JOBQ['ENQUEUE_UNREGISTERED_KINDS'] = True."
        )


class UnknownQueue(LookupError):
    """An operator named a queue that nothing knows, to pause or limit it
    (:mod:`django_jobq.flow_control`): probably a typo, which would otherwise pause nothing.

    Known queues are those the code names (``JOBQ['DEFAULT_QUEUE']``, ``JOBQ['QUEUES']``,
    the registered kinds' queues, the ``TASKS`` backends' ``QUEUES``), those paused or
    limited before, those holding ready jobs and those live workers serve. A queue that none
    of them names yet is paused with ``allow_unknown=True`` (``jobq_queues pause
    --allow-unknown``).

    Attributes:
        queue: the queue given (str).
        suggestion: the known queue closest to it, or ``None``.
    """

    def __init__(self, queue: str, suggestion: str | None) -> None:
        self.queue = queue
        self.suggestion = suggestion
        near = f"; did you mean {suggestion!r}?" if suggestion else "."
        super().__init__(
            f"no queue {queue!r} is known{near} Known queues are those the settings and the "
            f"registered kinds name, those paused or limited before, those holding ready jobs "
            f"and those live workers serve. To name a queue nothing uses yet, pass "
            f"allow_unknown=True (jobq_queues: --allow-unknown)."
        )
