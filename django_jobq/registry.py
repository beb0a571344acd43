"""The ``@job`` decorator and the registry of job kinds.

A kind is the name a handler is registered under: by default the function's dotted path
(``shop.jobs.send_welcome_email``), or ``@job(name=...)``. Workers look handlers up here by
kind; nothing is ever imported from a name found in the database.

Workers register handlers by importing each installed app's ``jobs`` module (and, with the
Tasks backend, its ``tasks`` module): a handler defined anywhere else exists in a worker
only if one of those imports its module. The registry notes, for each definition, the
modules being imported when it was registered (:func:`imported_by`), so the system check
``django_jobq.W002`` (``W003`` for tasks) can name the definitions no worker would import.

A renamed handler keeps its old kinds as aliases (``@job(name="new", aliases=["old"])``):
:func:`get` resolves an alias to the definition, so jobs stored under the old kind (by an
old release's web processes, or redriven from the dead letters) run on the new handler with
no data migration, and :func:`enqueue` under an alias stores the definition's own kind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import hashlib
import inspect
import json
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypedDict, Unpack, overload

from . import enqueueing as _enqueue
from . import schedules as _schedules
from .backoff import BackoffPolicy

if TYPE_CHECKING:
    from .models import Job

#: Every registered name, each kind and each alias, to its definition. One dict (not a
#: second one for aliases), so :func:`isolated` restores aliases with kinds.
_registry: dict[str, JobDefinition] = {}
#: For each registered definition, the modules whose bodies were running when it was
#: registered, innermost first (:func:`imported_by`).
_importers: weakref.WeakKeyDictionary[JobDefinition, tuple[str, ...]] = weakref.WeakKeyDictionary()


@dataclass(frozen=True, eq=False)
class JobDefinition:
    """A registered handler and its defaults. Made by :func:`job`; call it to run the handler
    directly (in tests, say), or use :meth:`enqueue` to run it on a worker.

    Compared and hashed by identity: the registered definition is the ``sender`` of the
    :mod:`django_jobq.signals` about its jobs.

    ``queue``, ``max_attempts`` and ``visibility_timeout`` of ``None`` fall back to the
    ``JOBQ`` setting at enqueue time. ``visibility_timeout``, ``max_runtime`` and
    ``expires_after`` are in seconds; ``backoff`` and ``retry_on`` are used by the worker;
    ``schedules`` by the schedulers (see :mod:`django_jobq.schedules`).
    With ``takes_context`` the handler's first parameter receives a
    :class:`~django_jobq.context.JobContext` and is not part of the payload. ``aliases`` are
    former kinds whose jobs this handler runs too (see the module docs).
    """

    func: Callable[..., Any]
    kind: str
    aliases: tuple[str, ...] = ()
    queue: str | None = None
    priority: int = 0
    max_attempts: int | None = None
    visibility_timeout: float | None = None
    max_runtime: float | None = None
    takes_context: bool = False
    backoff: BackoffPolicy | None = None
    retry_on: tuple[type[BaseException], ...] | None = None
    expires_after: float | None = None
    schedules: tuple[_schedules.Schedule, ...] = ()
    # A plain dict at run time; ``dict`` rather than ``EnqueueOptions`` as the factory because
    # this class is defined while ``enqueueing`` (which imports this module) may still load.
    options: _enqueue.EnqueueOptions = field(default_factory=dict)  # type: ignore[assignment]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs)

    @functools.cached_property
    def signature(self) -> inspect.Signature:
        """The handler's parameters that the payload fills (the context one left out)."""
        signature = inspect.signature(self.func)
        if self.takes_context:
            parameters = list(signature.parameters.values())[1:]
            signature = signature.replace(parameters=parameters)
        return signature

    @functools.cached_property
    def _payload_shape(self) -> tuple[frozenset[str], frozenset[str], bool]:
        """The payload's keys the handler takes, those it requires, and whether it takes
        any other (``**kwargs``). Handlers have no positional-only or ``*args`` parameters
        (refused at registration), so this is all a payload's fit depends on."""
        parameters = self.signature.parameters.values()
        named = [p for p in parameters if p.kind is not inspect.Parameter.VAR_KEYWORD]
        return (
            frozenset(p.name for p in named),
            frozenset(p.name for p in named if p.default is inspect.Parameter.empty),
            len(named) < len(parameters),
        )

    def check_payload(self, payload: Mapping[str, Any]) -> None:
        """Check that the handler can be called with ``payload`` as its keyword arguments
        (what binding them to its signature checks, without the cost).

        Raises:
            TypeError: a key the handler does not take, or a required one missing.
        """
        names, required, takes_any = self._payload_shape
        if not required.issubset(payload):
            missing = next(name for name in self.signature.parameters if name not in payload)
            raise TypeError(f"{self.kind}: missing a required argument: {missing!r}")
        if not takes_any and not names.issuperset(payload):
            unexpected = next(key for key in payload if key not in names)
            raise TypeError(f"{self.kind}: got an unexpected keyword argument {unexpected!r}")

    def payload_for(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """Map a call's arguments to the payload dict the handler will be called with.

        Raises:
            TypeError: the arguments do not fit the handler's signature.
        """
        if not args:  # keywords only, the usual call: the payload is the keywords
            self.check_payload(kwargs)
            return dict(kwargs)
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{self.kind}: {exc}") from None
        payload: dict[str, Any] = {}
        for name, value in bound.arguments.items():
            if self.signature.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
                payload.update(value)
            else:
                payload[name] = value
        return payload

    def using(self, **options: Unpack[_enqueue.EnqueueOptions]) -> JobDefinition:
        """Return a copy whose :meth:`enqueue` uses these options (as :func:`enqueue` takes).

        The copy is not registered; the registered definition is unchanged. Options are
        validated when the copy enqueues.
        """
        return dataclasses.replace(self, options={**self.options, **options})

    def prepare(self, *args: Any, **kwargs: Any) -> _enqueue.PreparedJob:
        """Validate a call and turn it into a job ready for :func:`~django_jobq.enqueue_many`.

        Raises:
            TypeError: the arguments do not fit the handler, or a value is not JSON.
            ValueError: an option set with :meth:`using` is invalid.
        """
        return _enqueue.prepare_job(self.kind, self.payload_for(args, kwargs), **self.options)

    def enqueue(self, *args: Any, **kwargs: Any) -> Job:
        """Enqueue a run of this handler with these arguments; return the :class:`Job`.

        The row is written in the current transaction on the queue's database (see
        :func:`django_jobq.enqueue` for the rules and the errors raised).
        """
        return _enqueue.enqueue_many([self.prepare(*args, **kwargs)])[0]


def _is_async(func: Any) -> bool:
    """A coroutine or async generator function, or a ``functools.partial`` of one, or an
    object whose ``__call__`` is one: calling it returns without running its body."""
    while isinstance(func, functools.partial):
        func = func.func
    if inspect.iscoroutinefunction(func) or inspect.isasyncgenfunction(func):
        return True
    if inspect.isroutine(func) or not callable(func):
        return False
    call = type(func).__call__  # an instance's: what calling it runs
    return inspect.iscoroutinefunction(call) or inspect.isasyncgenfunction(call)


def refuse_async(func: Callable[..., Any], what: str) -> None:
    """Refuse an async handler: workers call handlers synchronously, so the job would be
    acked with its body never run.

    Raises:
        TypeError: ``func`` is async (see :func:`_is_async`); ``what`` names it.
    """
    if _is_async(func):
        raise TypeError(
            f"{what} is an async function; django-jobq runs handlers synchronously and does "
            f"not support async handlers yet. Register a sync wrapper instead, e.g. "
            f"asgiref.sync.async_to_sync(handler) called from a plain def."
        )


def _validate_handler(func: Callable[..., Any], takes_context: bool) -> None:
    refuse_async(func, getattr(func, "__qualname__", repr(func)))
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
    schedule: str | _schedules.Schedule | Sequence[str | _schedules.Schedule]
    timezone: str


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
            so it lapses and another worker may take the job.
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

    Returns:
        A :class:`JobDefinition` wrapping the function.

    Raises:
        ValueError: an invalid name, alias or option, or a name or alias already
            registered (as a kind or an alias) by another function.
        TypeError: an option of the wrong type, a function with positional-only or
            ``*args`` parameters, or an async handler (``async def``, an async generator,
            a ``functools.partial`` of one or an object whose ``__call__`` is one): handlers
            run synchronously, so wrap it in a plain function (``async_to_sync``).

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
        kind = name or _origin(func)
        # Validate the defaults exactly as enqueue will (one set of rules).
        _enqueue.validate_options(
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
            schedules=_schedules.from_job_options(options.get("schedule"), options.get("timezone")),
        )
        return register(definition)

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
        _enqueue.validate_options(kind=alias)
    if kind in aliases:
        raise ValueError(f"{kind!r} is the kind itself; it cannot be one of its aliases.")
    if len(set(aliases)) < len(aliases):
        raise ValueError(f"aliases of {kind!r} name one kind twice: {list(aliases)!r}.")
    return tuple(aliases)


def register(definition: JobDefinition) -> JobDefinition:
    """Register ``definition`` under its kind and its aliases (``@job`` does this; so does
    the Tasks backend for each task, see :mod:`django_jobq.tasks_backend`); return it.

    Registering the same function again replaces its definition (and its aliases).

    Raises:
        ValueError: another function is registered under this kind or one of its aliases
            (as its kind or as an alias); nothing is registered then.
    """
    names = (definition.kind, *definition.aliases)
    for name in names:
        existing = _registry.get(name)
        if existing is not None and _origin(existing.func) != _origin(definition.func):
            raise ValueError(
                f"job kind {name!r} is already registered by {_origin(existing.func)}"
                f"{_as_what(existing, name)}; {_origin(definition.func)} cannot use it as "
                f"{'its kind' if name == definition.kind else 'an alias'}. Give one of them "
                f"another name with @job(name=...), or drop the alias."
            )
    previous = _registry.get(definition.kind)
    if previous is not None:
        for name in (previous.kind, *previous.aliases):
            _registry.pop(name, None)
    for name in names:
        _registry[name] = definition
    _importers[definition] = _modules_being_imported()
    return definition


def _as_what(definition: JobDefinition, name: str) -> str:
    return "" if name == definition.kind else f" as an alias of its kind {definition.kind!r}"


def _modules_being_imported() -> tuple[str, ...]:
    """The names of the modules whose top-level code is running on this thread's stack,
    innermost first: a module imported by ``app/jobs.py`` is registered with ``app.jobs``
    among them, wherever the import chain started."""
    names: list[str] = []
    frame = inspect.currentframe()
    while frame is not None:
        if frame.f_code.co_name == "<module>":
            names.append(str(frame.f_globals.get("__name__", "")))
        frame = frame.f_back
    return tuple(names)


def imported_by(definition: JobDefinition) -> tuple[str, ...]:
    """The modules that were being imported when ``definition`` was registered (its own
    module first, when it was defined at a module's top level, then the modules importing
    that one), innermost first; ``()`` for a definition never registered."""
    return _importers.get(definition, ())


def _positive_seconds(name: str, value: timedelta | float | None) -> float | None:
    if value is None:
        return None
    return _enqueue.seconds_option(name, value, minimum=0, inclusive=False)


def _origin(func: Callable[..., Any]) -> str:
    return f"{func.__module__}.{func.__qualname__}"


def get(kind: str) -> JobDefinition | None:
    """Return the definition registered under ``kind`` (its kind or one of its aliases),
    or ``None``."""
    return _registry.get(kind)


def closest(kind: str) -> str | None:
    """The registered kind most like ``kind`` (a typo, or a function's bare name), or
    ``None`` if none is close: for "did you mean ...?" messages."""
    names = list(_registry)
    tail = kind.rpartition(".")[2]
    same_name = [name for name in names if name.rpartition(".")[2] == tail]
    if len(same_name) == 1:
        return same_name[0]
    found = difflib.get_close_matches(kind, names, n=1, cutoff=0.6)
    return found[0] if found else None


def kinds_fingerprint(kinds: Sequence[str]) -> str:
    """A short hex digest (16 characters: the start of the SHA-256 of the sorted kinds as a
    JSON list) of a set of kinds: two workers with the same kinds, in any order, have the
    same fingerprint."""
    return hashlib.sha256(json.dumps(sorted(kinds)).encode()).hexdigest()[:16]


def definitions() -> list[JobDefinition]:
    """Every registered definition, in registration order (each once, aliases or not)."""
    return [definition for name, definition in _registry.items() if name == definition.kind]


def claimable_kinds() -> list[str]:
    """The kinds a worker of this process can run, sorted: every registered kind and every
    alias (the names a job row may carry for a handler registered here)."""
    return sorted(_registry)


@contextlib.contextmanager
def isolated(*, without: Iterable[str] = ()) -> Iterator[None]:
    """For tests: the registry is restored when the block ends, so what the block registers
    is forgotten; ``without`` names kinds (or aliases) left out inside the block, as in a
    process that does not import them. A worker made inside the block keeps the kinds it
    read then (:func:`claimable_kinds`)::

        with registry.isolated():
            job(name="tests.temporary")(handler)  # registered until the block ends

        with registry.isolated(without=["shop.jobs.refund"]):
            Worker(burst=True).run()  # a worker of a release without the kind

    Raises:
        KeyError: a name in ``without`` is not registered.
    """
    saved = dict(_registry)
    try:
        for name in without:
            del _registry[name]
        yield
    finally:
        _registry.clear()
        _registry.update(saved)
