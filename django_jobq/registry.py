"""The registry of job kinds: each kind's handler and defaults, as workers look them up.

A kind is the name a handler is registered under: by default the function's dotted path
(``shop.jobs.send_welcome_email``), or ``@job(name=...)``. Workers look handlers up here by
kind; nothing is ever imported from a name found in the database. ``@job``
(:mod:`django_jobq.decorator`) and the Tasks backend (:mod:`django_jobq.tasks_backend`)
register them; enqueue reads a kind's defaults here.

Workers register handlers by importing each installed app's ``jobs`` module (and, with the
Tasks backend, its ``tasks`` module): a handler defined anywhere else exists in a worker
only if one of those imports its module. The registry notes, for each definition, the
modules being imported when it was registered (:func:`imported_by`), so the system check
``django_jobq.W002`` (``W003`` for tasks) can name the definitions no worker would import.

A renamed handler keeps its old kinds as aliases (``@job(name="new", aliases=["old"])``):
:func:`get` resolves an alias to the definition, so jobs stored under the old kind (by an
old release's web processes, or redriven from the dead letters) run on the new handler with
no data migration, and :func:`~django_jobq.enqueue` under an alias stores the definition's
own kind.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import hashlib
import inspect
import json
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from . import argument_checks
from .backoff import BackoffPolicy
from .schedules import Schedule

#: Every registered name, each kind and each alias, to its definition. One dict (not a
#: second one for aliases), so :func:`isolated` restores aliases with kinds.
_registry: dict[str, KindDefinition] = {}
#: For each registered definition, the modules whose bodies were running when it was
#: registered, innermost first (:func:`imported_by`).
_importers: weakref.WeakKeyDictionary[KindDefinition, tuple[str, ...]] = weakref.WeakKeyDictionary()


@dataclass(frozen=True, eq=False)
class KindDefinition:
    """A registered handler and its defaults: what workers, enqueue and the schedulers read
    for a kind. ``@job`` makes a :class:`~django_jobq.JobDefinition` (this, plus its
    enqueue methods); call either to run the handler directly.

    Compared and hashed by identity: the registered definition is the ``sender`` of the
    :mod:`django_jobq.signals` about its jobs.

    ``queue``, ``max_attempts`` and ``visibility_timeout`` of ``None`` fall back to the
    ``JOBQ`` setting at enqueue time. ``visibility_timeout``, ``max_runtime`` and
    ``expires_after`` are in seconds; ``backoff`` and ``retry_on`` are used by the worker;
    ``schedules`` by the schedulers (see :mod:`django_jobq.scheduling`).
    With ``takes_context`` the handler's first parameter receives a
    :class:`~django_jobq.context.JobContext` and is not part of the payload. ``aliases`` are
    former kinds whose jobs this handler runs too (see the module docs). :attr:`is_async`
    says whether the worker awaits the handler on its event loop. With
    ``check_arguments`` (the default) enqueue checks payload values against the handler's
    annotations (:mod:`django_jobq.argument_checks`). ``concurrency_limit`` and ``rate_limit``
    (``"100/s"``) bound the kind's jobs across the fleet (docs/flow-control.md).
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
    schedules: tuple[Schedule, ...] = ()
    check_arguments: bool = True
    concurrency_limit: int | None = None
    rate_limit: str | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs)

    @functools.cached_property
    def is_async(self) -> bool:
        """Whether the handler is a coroutine function (:func:`is_coroutine_handler`): the
        worker runs its jobs on its event loop (:mod:`django_jobq.worker.async_executor`)
        instead of a handler thread. Computed once, when the definition is registered."""
        return is_coroutine_handler(self.func)

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

    @functools.cached_property
    def _argument_checks(self) -> argument_checks.ArgumentChecks | None:
        """The checks of the payload's values against the handler's annotations, built
        once; ``None`` when there is nothing to check (or ``check_arguments`` is off)."""
        if not self.check_arguments:
            return None
        return argument_checks.checker(self.func, self.signature)

    def check_payload(self, payload: Mapping[str, Any]) -> None:
        """Check that the handler can be called with ``payload`` as its keyword arguments
        (what binding them to its signature checks, without the cost), and that each value
        is what its annotation says the handler receives (:mod:`django_jobq.argument_checks`,
        unless ``check_arguments`` is off).

        Raises:
            TypeError: keys the handler does not take and required ones missing (the
                message names them all, with the closest parameter for a misspelt key:
                ``got an unexpected keyword argument 'usr_id' (did you mean 'user_id'?);
                missing a required argument: 'user_id'``), or a value of the wrong type
                (naming the parameter, the expected type and what was passed).
        """
        names, required, takes_any = self._payload_shape
        if not (required.issubset(payload) and (takes_any or names.issuperset(payload))):
            unexpected = [] if takes_any else [key for key in payload if key not in names]
            missing = [name for name in required if name not in payload]
            missing.sort(key=list(self.signature.parameters).index)
            raise TypeError(f"{self.kind}: {_misfit(unexpected, missing, self.signature, payload)}")
        checks = self._argument_checks
        if checks is not None:
            checks.check(self.kind, payload)

    def payload_for(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """Map a call's arguments to the payload dict the handler will be called with.

        Keywords alone are the payload as given: :meth:`check_payload` checks it (enqueue
        does, after checking that it is JSON).

        Raises:
            TypeError: positional arguments that do not fit the handler's signature.
        """
        if not args:  # keywords only, the usual call: the payload is the keywords
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


def _what_runs(func: Any) -> Any:
    """What calling ``func`` runs: the function inside ``functools.partial`` layers, or an
    instance's ``__call__``."""
    while isinstance(func, functools.partial):
        func = func.func
    if inspect.isroutine(func) or not callable(func):
        return func
    return type(func).__call__


def is_coroutine_handler(func: Any) -> bool:
    """Whether calling ``func`` returns a coroutine without running its body: an
    ``async def``, a ``functools.partial`` of one, or an object whose ``__call__`` is one."""
    return inspect.iscoroutinefunction(_what_runs(func))


def is_generator_handler(func: Any) -> bool:
    """Whether ``func`` (or what a partial of it or its ``__call__`` runs) is a generator
    function, plain or async: calling it runs none of its body, and a worker would never
    iterate it."""
    runs = _what_runs(func)
    return inspect.isgeneratorfunction(runs) or inspect.isasyncgenfunction(runs)


def _misfit(
    unexpected: Sequence[str],
    missing: Sequence[str],
    signature: inspect.Signature,
    payload: Mapping[str, Any],
) -> str:
    """The message for payload keys a handler does not take and required ones missing:
    each unexpected key with the closest parameter not given (a misspelling), then the
    missing ones."""
    unfilled = [
        parameter.name
        for parameter in signature.parameters.values()
        if parameter.kind is not inspect.Parameter.VAR_KEYWORD and parameter.name not in payload
    ]
    parts = []
    if unexpected:
        described = []
        for key in unexpected:
            close = difflib.get_close_matches(key, unfilled, n=1, cutoff=0.6)
            described.append(f"{key!r} (did you mean {close[0]!r}?)" if close else repr(key))
        plural = (
            "an unexpected keyword argument"
            if len(unexpected) == 1
            else ("unexpected keyword arguments")
        )
        parts.append(f"got {plural} {', '.join(described)}")
    if missing:
        plural = "a required argument" if len(missing) == 1 else "required arguments"
        parts.append(f"missing {plural}: {', '.join(map(repr, missing))}")
    return "; ".join(parts)


#: A definition of any class, as :func:`register` returns it.
D = TypeVar("D", bound=KindDefinition)


def register(definition: D) -> D:
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
        if existing is not None and origin(existing.func) != origin(definition.func):
            raise ValueError(
                f"job kind {name!r} is already registered by {origin(existing.func)}"
                f"{_as_what(existing, name)}; {origin(definition.func)} cannot use it as "
                f"{'its kind' if name == definition.kind else 'an alias'}. Give one of them "
                f"another name with @job(name=...), or drop the alias."
            )
    previous = _registry.get(definition.kind)
    if previous is not None:
        for name in (previous.kind, *previous.aliases):
            _registry.pop(name, None)
    definition.is_async  # noqa: B018 - computed now: a kind's nature is fixed at registration
    for name in names:
        _registry[name] = definition
    _importers[definition] = _modules_being_imported()
    return definition


def _as_what(definition: KindDefinition, name: str) -> str:
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


def imported_by(definition: KindDefinition) -> tuple[str, ...]:
    """The modules that were being imported when ``definition`` was registered (its own
    module first, when it was defined at a module's top level, then the modules importing
    that one), innermost first; ``()`` for a definition never registered."""
    return _importers.get(definition, ())


def origin(func: Callable[..., Any]) -> str:
    """``module.qualname`` of ``func``: its kind unless ``@job(name=...)`` gives one."""
    return f"{func.__module__}.{func.__qualname__}"


def get(kind: str) -> KindDefinition | None:
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


def definitions() -> list[KindDefinition]:
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
