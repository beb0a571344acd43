"""Payload values checked against the handler's annotations, at enqueue.

A job's payload is JSON: what the handler receives is the payload after the JSON round trip,
so that is what is checked. ``@job def charge(order_id: int)`` enqueued with a ``datetime``
would be stored as an ISO string and handed to the handler as a ``str``, failing on every
attempt until it is a dead letter; the check refuses it at the enqueue instead::

    TypeError: shop.jobs.charge: argument 'order_id' must be int, got a datetime:
    datetime.datetime(2026, 1, 1, 0, 0) (payloads are JSON: the handler would receive a str).

What each annotation accepts (what the handler will receive, not the Python object):

- ``int``: an int, not a bool (JSON ``true`` is not a number);
- ``float``: an int or a float, not a bool;
- ``str``: a str, and what ``DjangoJSONEncoder`` writes as one: datetime, date, time,
  timedelta, Decimal, UUID, a lazy translation string;
- ``bool``: a bool; ``None``: ``None``;
- ``list``, ``list[X]``: a list or a tuple (JSON has arrays), each item an ``X``;
  ``tuple[X, ...]``, ``tuple[X, Y]``: the same (of that length), received as a list;
- ``dict``, ``dict[str, X]``: a dict, each value an ``X`` (JSON keys are always str);
- ``X | Y``, ``Optional[X]``, ``Union[X, Y]``: a value one of the members accepts;
- ``Annotated[X, ...]``, a ``NewType`` of ``X``: what ``X`` accepts.

A parameter whose default is ``None`` accepts ``None`` too. Anything else is not checked:
``Any``, ``object``, classes of your own, ``TypedDict``, ``Literal``, abstract types
(``Sequence``, ``Mapping``), ``**kwargs``, and annotations that cannot be resolved (a
forward reference to a name the handler's module does not define, a string annotation under
``from __future__ import annotations`` naming a local class). A union with an unchecked
member is not checked; a container of unchecked items (``list[Any]``) checks the container.
An annotation never fails registration or enqueue by being unresolvable.

:func:`checker` builds the checks of a handler once (``KindDefinition`` caches them, see
:mod:`django_jobq.registry`); a handler with no checked parameter gets ``None``, and its
enqueues pay nothing.
``@job(check_arguments=False)`` turns the checks off for a kind.
"""

from __future__ import annotations

import datetime
import decimal
import functools
import inspect
import reprlib
import types
import typing
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from django.utils.functional import Promise

#: A check of one value: ``None`` when accepted, else where inside the value (``""`` for the
#: value itself, ``"[2]"``, ``"['key']"``) the first refused part is, and that part.
Check = Callable[[Any], tuple[str, Any] | None]

#: What ``DjangoJSONEncoder`` writes as a JSON string (``datetime`` is a ``date``).
_WRITTEN_AS_STR = (datetime.date, datetime.time, datetime.timedelta, decimal.Decimal, uuid.UUID)
_STR_IN_JSON = (str, *_WRITTEN_AS_STR, Promise)
_UNION_TYPES = (typing.Union, types.UnionType)
_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = 60


@dataclass(frozen=True, slots=True)
class Expected:
    """The check of one parameter: its name, the annotation as written in messages, and the
    check."""

    name: str
    description: str
    check: Check


class ArgumentChecks:
    """The checks of one handler's parameters; call :meth:`check` with a payload."""

    __slots__ = ("_expected",)

    def __init__(self, expected: tuple[Expected, ...]) -> None:
        self._expected = expected

    def check(self, kind: str, payload: Mapping[str, Any]) -> None:
        """Check each checked parameter's value in ``payload`` (absent ones are skipped).

        Raises:
            TypeError: a value the handler would not receive as its annotation says; the
                message names ``kind``, the parameter, the expected type and what was
                passed (and where inside it, for a container).
        """
        for expected in self._expected:
            if expected.name not in payload:
                continue
            value = payload[expected.name]
            refused = expected.check(value)
            if refused is not None:
                raise TypeError(_message(kind, expected, *refused))


def checker(func: Callable[..., Any], signature: inspect.Signature) -> ArgumentChecks | None:
    """The checks of ``func``'s parameters in ``signature`` (the payload's: the context
    parameter left out), or ``None`` if no parameter has a checked annotation. Never raises
    for an annotation: one that cannot be resolved is not checked."""
    namespace = _globals_of(func)
    expected: list[Expected] = []
    for parameter in signature.parameters.values():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            continue
        if parameter.annotation is inspect.Parameter.empty:
            continue
        annotation = _resolved(parameter.name, parameter.annotation, namespace)
        compiled = _compiled(annotation)
        if compiled is None:
            continue
        check, description = compiled
        if parameter.default is None:
            check = _union([check, _is_none])
        expected.append(Expected(parameter.name, description, check))
    return ArgumentChecks(tuple(expected)) if expected else None


def _globals_of(func: Callable[..., Any]) -> dict[str, Any]:
    """The module globals ``func``'s string annotations are resolved in: those of the
    function itself, of a ``functools.partial``'s function, or of a callable object's
    ``__call__``."""
    while isinstance(func, functools.partial):
        func = func.func
    target = inspect.unwrap(func) if inspect.isroutine(func) else type(func).__call__
    found = getattr(inspect.unwrap(target), "__globals__", None)
    return found if isinstance(found, dict) else {}


class _Annotated:
    """One annotation, as ``typing.get_type_hints`` reads it from an object's
    ``__annotations__``."""

    def __init__(self, name: str, annotation: Any) -> None:
        self.__annotations__ = {name: annotation}


def _resolved(name: str, annotation: Any, namespace: dict[str, Any]) -> Any:
    """``annotation`` with string and forward references resolved in ``namespace``
    (``typing.get_type_hints``, one parameter at a time so that one unresolvable annotation
    leaves the others checked), ``Annotated`` stripped; ``Any`` (not checked) if it cannot
    be resolved."""
    try:
        return typing.get_type_hints(_Annotated(name, annotation), globalns=namespace)[name]
    except Exception:  # an annotation may name anything, or fail in any way when evaluated
        return Any


def _compiled(annotation: Any) -> tuple[Check, str] | None:
    """The check of ``annotation`` and its description, or ``None`` if it is not checked
    (never raising: an annotation may be any object, unhashable or of an odd metaclass)."""
    try:
        check = _compile(annotation)
        return None if check is None else (check, _describe(annotation))
    except Exception:
        return None


def _compile(annotation: Any) -> Check | None:
    """The check of ``annotation``, or ``None`` if it is not a checked one."""
    if annotation is None or annotation is type(None):
        return _is_none
    simple = _SIMPLE.get(annotation)
    if simple is not None:
        return simple
    supertype = getattr(annotation, "__supertype__", None)  # typing.NewType
    if supertype is not None:
        return _compile(supertype)
    origin, arguments = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _compile(arguments[0])
    if origin in _UNION_TYPES:
        members = [_compile(argument) for argument in arguments]
        if any(member is None for member in members):
            return None
        return _union(typing.cast(list[Check], members))
    if origin is list:
        return _sequence(_compile(arguments[0]) if arguments else None)
    if origin is tuple:
        if len(arguments) == 2 and arguments[1] is Ellipsis:
            return _sequence(_compile(arguments[0]))
        if arguments == ((),):  # tuple[()]: the empty tuple
            return _fixed_sequence(())
        return _fixed_sequence(tuple(_compile(argument) for argument in arguments))
    if origin is dict:
        return _mapping(_compile(arguments[1]) if len(arguments) == 2 else None)
    return None


def _is_none(value: Any) -> tuple[str, Any] | None:
    return None if value is None else ("", value)


def _is_int(value: Any) -> tuple[str, Any] | None:
    return None if isinstance(value, int) and not isinstance(value, bool) else ("", value)


def _is_float(value: Any) -> tuple[str, Any] | None:
    accepted = isinstance(value, int | float) and not isinstance(value, bool)
    return None if accepted else ("", value)


def _is_str(value: Any) -> tuple[str, Any] | None:
    return None if isinstance(value, _STR_IN_JSON) else ("", value)


def _is_bool(value: Any) -> tuple[str, Any] | None:
    return None if isinstance(value, bool) else ("", value)


def _union(members: list[Check]) -> Check:
    def check(value: Any) -> tuple[str, Any] | None:
        inner: list[tuple[str, Any]] = []
        for member in members:
            refused = member(value)
            if refused is None:
                return None
            if refused[0]:
                inner.append(refused)
        # One member took the value's shape (a list for list[int] | None) and refused a part
        # of it: name that part; otherwise the value itself.
        return inner[0] if len(inner) == 1 else ("", value)

    return check


def _sequence(item: Check | None) -> Check:
    def check(value: Any) -> tuple[str, Any] | None:
        if not isinstance(value, list | tuple):
            return "", value
        if item is not None:
            for index, element in enumerate(value):
                refused = item(element)
                if refused is not None:
                    return f"[{index}]{refused[0]}", refused[1]
        return None

    return check


def _fixed_sequence(items: tuple[Check | None, ...]) -> Check:
    def check(value: Any) -> tuple[str, Any] | None:
        if not isinstance(value, list | tuple) or len(value) != len(items):
            return "", value
        for index, (item, element) in enumerate(zip(items, value, strict=True)):
            refused = None if item is None else item(element)
            if refused is not None:
                return f"[{index}]{refused[0]}", refused[1]
        return None

    return check


def _mapping(values: Check | None) -> Check:
    def check(value: Any) -> tuple[str, Any] | None:
        if not isinstance(value, dict):
            return "", value
        if values is not None:
            for key, element in value.items():
                refused = values(element)
                if refused is not None:
                    return f"[{key!r}]{refused[0]}", refused[1]
        return None

    return check


#: The checks of the bare types, by type.
_SIMPLE: dict[Any, Check] = {
    int: _is_int,
    float: _is_float,
    str: _is_str,
    bool: _is_bool,
    list: _sequence(None),
    tuple: _sequence(None),
    dict: _mapping(None),
}


def _describe(annotation: Any) -> str:
    """An annotation as written in code: ``int``, ``list[int]``, ``int | None``."""
    if annotation is None or annotation is type(None):
        return "None"
    origin, arguments = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _describe(arguments[0])
    if origin in _UNION_TYPES:
        return " | ".join(_describe(argument) for argument in arguments)
    if origin is not None and arguments:
        inner = ", ".join("..." if a is Ellipsis else _describe(a) for a in arguments)
        return f"{_describe(origin)}[{inner}]"
    if arguments == () and origin is tuple:
        return "tuple[()]"
    return getattr(annotation, "__name__", None) or repr(annotation)


def _received(value: Any) -> str | None:
    """What the handler would receive instead of ``value`` when the JSON round trip changes
    its type (``"a str"`` for a datetime), or ``None``."""
    if isinstance(value, str):
        return None
    if isinstance(value, _STR_IN_JSON):
        return "a str"
    if isinstance(value, tuple):
        return "a list"
    return None


def _message(kind: str, expected: Expected, where: str, part: Any) -> str:
    """``shop.jobs.charge: argument 'order_id' must be int, got a datetime: datetime...``;
    for a part of a container, ``got a str at tags[1]: 'x'``."""
    name = type(part).__name__
    passed = "None" if part is None else f"{'an' if name[0] in 'aeiouAEIOU' else 'a'} {name}"
    if where:
        passed += f" at {expected.name}{where}"
    if part is not None:
        passed += f": {_repr.repr(part)}"
    message = f"{kind}: argument {expected.name!r} must be {expected.description}, got {passed}"
    received = _received(part)
    if received is not None:
        message += f" (payloads are JSON: the handler would receive {received})"
    return message + "."
