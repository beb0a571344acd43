"""The ``@job`` decorator, and the :class:`JobDefinition` it returns.

Usage::

    from django_jobq import enqueue_many, job


    @job(queue="emails", max_attempts=5)
    def send_welcome_email(user_id: int) -> None: ...


    send_welcome_email.enqueue(user_id=42)                        # -> Job
    send_welcome_email.using(delay=60).enqueue(user_id=42)        # options for this call
    await send_welcome_email.aenqueue(user_id=42)                 # from async code
    enqueue_many([send_welcome_email.prepare(user_id=n) for n in ids])

``@job`` checks the handler and its options, then registers a :class:`JobDefinition` under
its kind (:mod:`django_jobq.registry`, which workers and enqueue read); the definition's
:meth:`~JobDefinition.enqueue` and :meth:`~JobDefinition.prepare` go through
:mod:`django_jobq.enqueueing`.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypedDict, Unpack, overload

from . import registry
from .backoff import BackoffPolicy
from .conf import concurrency_limit_problem
from .enqueueing import EnqueueOptions, PreparedJob, aenqueue_many, enqueue_many, prepare_job
from .rates import parse_rate
from .schedules import Schedule, from_job_options
from .validation import seconds_option, validate_options

if TYPE_CHECKING:
    from .models import Job


@dataclass(frozen=True, eq=False)
class JobDefinition(registry.KindDefinition):
    """A registered handler and its defaults (:class:`~django_jobq.registry.KindDefinition`),
    made by :func:`job`: call it to run the handler directly (in tests, say), or use
    :meth:`enqueue` to run it on a worker. ``options`` are those :meth:`using` set.
    """

    options: EnqueueOptions = field(default_factory=EnqueueOptions)

    def using(self, **options: Unpack[EnqueueOptions]) -> JobDefinition:
        """Return a copy whose :meth:`enqueue` uses these options (as :func:`enqueue` takes).

        The copy is not registered; the registered definition is unchanged. Options are
        validated when the copy enqueues.
        """
        return dataclasses.replace(self, options={**self.options, **options})

    def prepare(self, *args: Any, **kwargs: Any) -> PreparedJob:
        """Validate a call and turn it into a job ready for :func:`~django_jobq.enqueue_many`.

        Raises:
            TypeError: the arguments do not fit the handler, or a value is not JSON.
            ValueError: an option set with :meth:`using` is invalid.
        """
        return prepare_job(self.kind, self.payload_for(args, kwargs), **self.options)

    def enqueue(self, *args: Any, **kwargs: Any) -> Job:
        """Enqueue a run of this handler with these arguments; return the :class:`Job`.

        The row is written in the current transaction on the queue's database (see
        :func:`django_jobq.enqueue` for the rules and the errors raised).
        """
        return enqueue_many([self.prepare(*args, **kwargs)])[0]

    async def aenqueue(self, *args: Any, **kwargs: Any) -> Job:
        """:meth:`enqueue` for async code: validated at once (the same errors), then
        inserted in Django's sync thread, as :func:`django_jobq.aenqueue` does (see it for
        what that means for transactions)."""
        return (await aenqueue_many([self.prepare(*args, **kwargs)]))[0]


def refuse_generator(func: Callable[..., Any], what: str) -> None:
    """Refuse a generator as a handler, plain or async: a worker calls (or awaits) the
    handler, and a generator is never iterated, so its body would never run and the job
    would be acked.

    Raises:
        TypeError: ``func`` is a generator or async generator function, or a
            ``functools.partial`` of one, or an object whose ``__call__`` is one; ``what``
            names it.
    """
    if registry.is_generator_handler(func):
        raise TypeError(
            f"{what} is a generator function; a job handler is a plain or async function "
            f"(def or async def) returning when its work is done, not yielding."
        )


def _validate_handler(func: Callable[..., Any], takes_context: bool) -> None:
    refuse_generator(func, getattr(func, "__qualname__", repr(func)))
    parameters = list(inspect.signature(func).parameters.values())
    if takes_context:
        if not parameters:
            raise TypeError(
                f"{func.__qualname__}: takes_context=True, so its first parameter receives "
                f"the JobContext, but it has no parameters."
            )
        parameters = parameters[1:]
    for parameter in parameters:
        if parameter.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.POSITIONAL_ONLY):
            raise TypeError(
                f"{func.__qualname__}: job handlers are called with keyword arguments from a "
                f"JSON payload; parameter {parameter.name!r} cannot be passed by keyword."
            )


class JobOptions(TypedDict, total=False):
    """What ``@job(...)`` accepts; see :func:`job`."""

    name: str
    aliases: Sequence[str]
    queue: str
    priority: int
    max_attempts: int
    visibility_timeout: float
    max_runtime: float
    takes_context: bool
    backoff: BackoffPolicy
    retry_on: tuple[type[BaseException], ...]
    expires_after: timedelta | float
    schedule: str | Schedule | Sequence[str | Schedule]
    timezone: str
    check_arguments: bool
    concurrency_limit: int
    rate_limit: str


@overload
def job(func: Callable[..., Any], /) -> JobDefinition: ...
@overload
def job(**options: Unpack[JobOptions]) -> Callable[[Callable[..., Any]], JobDefinition]: ...
def job(
    func: Callable[..., Any] | None = None, /, **options: Unpack[JobOptions]
) -> JobDefinition | Callable[[Callable[..., Any]], JobDefinition]:
    """Register a function as a job handler: ``@job`` or ``@job(queue="emails", ...)``.

    Options (all optional):
        name: the kind; defaults to ``module.qualname`` of the function.
        aliases: former kinds of this handler (a list of kind names): jobs stored under
            one run on this handler, and ``enqueue(alias, ...)`` stores ``name``. Keep an
            alias until no job, dead letter or old release uses it (docs/deploying.md).
        queue: default queue (``JOBQ['DEFAULT_QUEUE']`` if not given).
        priority: default priority; higher runs first.
        max_attempts: attempts before the job becomes a dead letter (>= 1).
        visibility_timeout: lease length in seconds (> 0); a worker heartbeats running jobs
            every third of it, so it bounds how long a crashed worker's job waits.
        max_runtime: seconds (> 0) after which a running job's lease is no longer extended,
            so it lapses and another worker may take the job; an async handler's task is
            cancelled then, and the attempt fails (retry, or dead letter on the last one).
        takes_context: pass a :class:`~django_jobq.context.JobContext` as first argument.
        backoff: retry delay policy, ``attempt -> seconds`` (see :mod:`django_jobq.backoff`);
            default ``ExponentialBackoff`` from the ``JOBQ`` setting.
        retry_on: exception classes that retry; any other exception dead-letters the job at
            once. Default: every exception retries (except ``PermanentError``).
        expires_after: seconds (or a timedelta) from enqueue after which a job that has not
            started is dead-lettered as "expired" instead of running late.
        schedule: run the job on a schedule: a cron expression (``"*/5 * * * *"``), a
            :class:`~django_jobq.schedules.Schedule` (with a payload, a name, ``catch_up``),
            or a list of them. Every worker's scheduler enqueues one job per tick.
        timezone: IANA name the schedules' cron fields are read in (default ``"UTC"``).
        check_arguments: check each enqueue's payload values against the handler's
            annotations (default ``True``): an ``int`` parameter refuses a ``datetime`` (the
            handler would receive a str), ``list[int]`` refuses ``["a"]``. Only JSON's basic
            types and their ``list``/``dict``/union forms are checked, others never; see
            :mod:`django_jobq.argument_checks`. ``False`` turns it off for this kind.
        concurrency_limit: the most jobs of this kind running at once across every worker
            (an int >= 1; docs/flow-control.md).
        rate_limit: the most jobs of this kind started per window across every worker,
            ``"<count>/<window>"`` such as ``"100/s"`` or ``"600/m"`` (:mod:`django_jobq.rates`).

    Returns:
        A :class:`JobDefinition` wrapping the function.

    Raises:
        ValueError: an invalid name, alias or option, or a name or alias already
            registered (as a kind or an alias) by another function.
        TypeError: an option of the wrong type, a function with positional-only or
            ``*args`` parameters, or a generator function, plain or async (or a partial
            of one, or an object whose ``__call__`` is one): its body would never run.

    The handler may be a plain function or a coroutine function (``async def``, a
    ``functools.partial`` of one, an object with an ``async def __call__``): the worker runs
    a plain one on a handler thread and awaits a coroutine one on its event loop
    (``definition.is_async``, fixed here; docs/async.md). ``max_runtime`` then cancels the
    task instead of letting the lease lapse.

    An invalid cron expression or timezone, or a schedule payload the handler cannot take,
    is reported by ``manage.py check`` (``django_jobq.E006``-``E009``) and stops workers
    from starting.
    """
    unknown = set(options) - set(JobOptions.__annotations__)
    if unknown:
        raise TypeError(f"@job got unknown options: {', '.join(sorted(unknown))}.")

    def decorate(func: Callable[..., Any]) -> JobDefinition:
        takes_context = options.get("takes_context", False)
        _validate_handler(func, takes_context)
        name = options.get("name")
        if name is None and "<" in func.__qualname__:
            raise ValueError(
                f"{func.__qualname__} is not a module-level function, so it has no importable "
                f"name to serve as its kind; give it one with @job(name=...)."
            )
        kind = name or registry.origin(func)
        # Validate the defaults exactly as enqueue will (one set of rules).
        validate_options(
            kind=kind,
            queue=options.get("queue"),
            priority=options.get("priority"),
            max_attempts=options.get("max_attempts"),
            visibility_timeout=options.get("visibility_timeout"),
        )
        max_runtime = _positive_seconds("max_runtime", options.get("max_runtime"))
        expires_after = _positive_seconds("expires_after", options.get("expires_after"))
        backoff = options.get("backoff")
        if backoff is not None and not callable(backoff):
            raise TypeError(f"backoff must be a callable attempt -> seconds, not {backoff!r}.")
        retry_on = options.get("retry_on")
        if retry_on is not None and not (
            isinstance(retry_on, tuple)
            and all(isinstance(c, type) and issubclass(c, BaseException) for c in retry_on)
        ):
            raise TypeError(f"retry_on must be a tuple of exception classes, not {retry_on!r}.")
        check_arguments = options.get("check_arguments", True)
        if not isinstance(check_arguments, bool):
            raise TypeError(f"check_arguments must be True or False, not {check_arguments!r}.")
        concurrency_limit = options.get("concurrency_limit")
        problem = concurrency_limit_problem(concurrency_limit)
        if problem:
            raise ValueError(f"concurrency_limit {problem}.")
        rate_limit = options.get("rate_limit")
        if rate_limit is not None:
            try:
                parse_rate(rate_limit)
            except ValueError as exc:
                raise ValueError(f"rate_limit: {exc}.") from None
        definition = JobDefinition(
            func=func,
            kind=kind,
            aliases=_aliases(kind, options.get("aliases", ())),
            queue=options.get("queue"),
            priority=options.get("priority", 0),
            max_attempts=options.get("max_attempts"),
            visibility_timeout=options.get("visibility_timeout"),
            max_runtime=max_runtime,
            takes_context=takes_context,
            backoff=backoff,
            retry_on=retry_on,
            expires_after=expires_after,
            schedules=from_job_options(options.get("schedule"), options.get("timezone")),
            check_arguments=check_arguments,
            concurrency_limit=concurrency_limit,
            rate_limit=rate_limit,
        )
        return registry.register(definition)

    return decorate(func) if func is not None else decorate


def _aliases(kind: str, aliases: object) -> tuple[str, ...]:
    """``@job(aliases=...)`` checked: kind names (``conf.KIND_NAME_RE``), none twice, none
    the kind itself.

    Raises:
        TypeError: not a list or tuple of str (a lone str is refused: it is not a list of
            one name).
        ValueError: an invalid name, a repeated one, or the kind itself.
    """
    if not isinstance(aliases, list | tuple) or not all(isinstance(a, str) for a in aliases):
        raise TypeError(f"aliases must be a list of kind names (str), not {aliases!r}.")
    for alias in aliases:
        validate_options(kind=alias)
    if kind in aliases:
        raise ValueError(f"{kind!r} is the kind itself; it cannot be one of its aliases.")
    if len(set(aliases)) < len(aliases):
        raise ValueError(f"aliases of {kind!r} name one kind twice: {list(aliases)!r}.")
    return tuple(aliases)


def _positive_seconds(name: str, value: timedelta | float | None) -> float | None:
    if value is None:
        return None
    return seconds_option(name, value, minimum=0, inclusive=False)
