"""What enqueue accepts, checked without a database: kind and queue names, option ranges,
durations and JSON payloads.

Used wherever a value meant for a job is declared: :func:`django_jobq.enqueue` and
``handler.prepare(...)`` for each job, ``@job(...)`` for a kind's defaults, ``Schedule(...)``
for a schedule's payload, the Tasks backend for a task's options and arguments. Each
function raises ``TypeError`` or ``ValueError`` with a message naming the value.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder

from .conf import KIND_NAME_RE, MAX_DURATION, QUEUE_NAME_RE, duration_seconds

_INT_RANGE = (-(2**31), 2**31 - 1)
_MAX_KEY_LENGTH = 200
_MAX_DEPTH = 100


def seconds_option(
    name: str, value: timedelta | float, *, minimum: float, inclusive: bool = True
) -> float:
    """Seconds in a duration option (a number of seconds or a timedelta), range-checked.

    The upper bound, ``MAX_DURATION`` (10 years), keeps every computed time within
    PostgreSQL's and Python's date ranges.

    Raises:
        TypeError: not a number or a timedelta (or NaN / infinite).
        ValueError: below ``minimum`` (or equal, unless ``inclusive``), or above 10 years.
    """
    seconds = duration_seconds(value)
    if seconds is None:
        raise TypeError(f"{name} must be a timedelta or a number of seconds, not {value!r}.")
    too_small = seconds < minimum if inclusive else seconds <= minimum
    if too_small or seconds > MAX_DURATION:
        bound = "at least" if inclusive else "more than"
        raise ValueError(
            f"{name} must be {bound} {minimum:g} s and at most 10 years, not {value!r}."
        )
    return seconds


def validate_options(
    *,
    kind: str,
    queue: str | None = None,
    priority: int | None = None,
    max_attempts: int | None = None,
    visibility_timeout: timedelta | float | None = None,
    idempotency_key: str | None = None,
    ordering_key: str | None = None,
) -> None:
    """Check enqueue options; ``None`` means "not given" and always passes.

    Raises:
        ValueError: a name, range or length is invalid.
        TypeError: a value has the wrong type.
    """
    if not isinstance(kind, str) or not KIND_NAME_RE.match(kind):
        raise ValueError(f"invalid job kind {kind!r}: expected {KIND_NAME_RE.pattern}.")
    if queue is not None and (not isinstance(queue, str) or not QUEUE_NAME_RE.match(queue)):
        raise ValueError(f"invalid queue name {queue!r}: expected {QUEUE_NAME_RE.pattern}.")
    for name, number, low in (
        ("priority", priority, _INT_RANGE[0]),
        ("max_attempts", max_attempts, 1),
    ):
        if number is None:
            continue
        if not isinstance(number, int) or isinstance(number, bool):
            raise TypeError(f"{name} must be an int, not {number!r}.")
        if not low <= number <= _INT_RANGE[1]:
            raise ValueError(f"{name} must be between {low} and {_INT_RANGE[1]}, not {number}.")
    if visibility_timeout is not None:
        seconds_option("visibility_timeout", visibility_timeout, minimum=0.001)
    for name, key in (("idempotency_key", idempotency_key), ("ordering_key", ordering_key)):
        if key is not None and (
            not isinstance(key, str)
            or not 0 < len(key) <= _MAX_KEY_LENGTH
            or not _is_storable_text(key)
        ):
            raise ValueError(
                f"{name} must be a non-empty str of at most {_MAX_KEY_LENGTH} characters "
                f"(no NUL, valid Unicode), not {key!r:.80}."
            )


def _is_storable_text(text: str) -> bool:
    """PostgreSQL text holds valid UTF-8 without NUL; lone surrogates cannot be encoded."""
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def find_unencodable(
    value: Any,
    path: str,
    depth: int = 0,
    *,
    encoder: type[json.JSONEncoder] = DjangoJSONEncoder,
) -> tuple[str, str] | None:
    """Return ``(path, problem)`` for the first part of ``value`` that JSON (as written by
    ``encoder``; jsonb refuses NUL and invalid Unicode too) cannot hold, or ``None``.

    ``path`` names ``value`` in the message (``"payload"``); parts are named below it
    (``payload['user']``). The default encoder turns dates, decimals and UUIDs into strings;
    ``json.JSONEncoder`` accepts only JSON's own types.
    """
    if depth > _MAX_DEPTH:
        return path, f"nesting deeper than {_MAX_DEPTH} levels (or a circular reference)"
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}[{key!r}]"
            if not isinstance(key, str):
                return where, f"key {key!r} (type {type(key).__name__}) is not a str"
            if not _is_storable_text(key):
                return where, "a key with NUL (\\x00) or invalid Unicode, which jsonb rejects"
            found = find_unencodable(item, where, depth + 1, encoder=encoder)
            if found:
                return found
        return None
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = find_unencodable(item, f"{path}[{index}]", depth + 1, encoder=encoder)
            if found:
                return found
        return None
    if isinstance(value, str):
        if _is_storable_text(value):
            return None
        return path, "a string with NUL (\\x00) or invalid Unicode, which jsonb rejects"
    try:
        json.dumps(value, cls=encoder, allow_nan=False)
    except (TypeError, ValueError):
        return path, f"{value!r} (type {type(value).__name__}) is not JSON-serialisable"
    return None


#: What :func:`encode_payload` writes with (one encoder: making one per call costs more
#: than encoding a small payload).
_ENCODER = DjangoJSONEncoder(allow_nan=False)
_CONTAINERS = (dict, list, tuple)


def encode_payload(payload: Any) -> str:
    """Encode a payload as JSON text with :class:`DjangoJSONEncoder`.

    Dates, times, decimals and UUIDs become strings (the handler receives strings).

    Raises:
        TypeError: ``payload`` is not a dict, or some value cannot be JSON; the message names
            the offending key, e.g. ``payload['user']``.
    """
    if not isinstance(payload, dict):
        raise TypeError(f"payload must be a dict of JSON values, not {type(payload).__name__}.")
    try:
        text = _ENCODER.encode(payload)
    except (TypeError, ValueError, RecursionError):
        text = None
    # The walk that names the offending value runs only when something is wrong: encoding
    # failed, the text has an escape jsonb may reject (NUL; a surrogate, which is fine only
    # in a valid pair, as ``json`` writes characters beyond the BMP), a key is not a str
    # (``json`` would turn ints and None into strings), or the nesting is too deep.
    suspect = text is None or "\\u0000" in text or "\\ud" in text
    if suspect or not _plain(payload):
        found = find_unencodable(payload, "payload")
        if found:
            path, problem = found
            raise TypeError(
                f"{path}: {problem}. Job payloads are JSON; pass ids or plain values instead."
            )
    if text is None:  # the walk names the culprit in every case known; this is a backstop
        raise TypeError("payload cannot be encoded as JSON.")
    return text


def _plain(value: Any, depth: int = 0) -> bool:
    """Whether every dict key at any depth is a str and nesting stays within
    :data:`_MAX_DEPTH`: what the encoding alone does not check."""
    if depth > _MAX_DEPTH:
        return False
    if isinstance(value, dict):
        if not all(isinstance(key, str) for key in value):
            return False
        items: Iterable[Any] = value.values()
    else:
        items = value
    return all(_plain(item, depth + 1) for item in items if isinstance(item, _CONTAINERS))
