"""Bounded text: what the worker writes into a text column always fits it.

Every text a worker stores about a job (a dead letter's reason, an attempt's error and
traceback, a worker id) goes through :func:`fit`, which makes it storable by PostgreSQL
(NUL bytes escaped, invalid Unicode replaced) and cuts it to its column's bound with a
visible marker::

    >>> bounded("x" * 600, 40)
    'xxxxxxxxxxxxxxxxxxx… [581 more characters]'

The bounds come from the models' ``max_length`` (``DeadLetter.reason``: 500 characters) or,
for unbounded ``text`` columns, :data:`MAX_ERROR_LENGTH` (64 KiB of characters), so an
oversized message never makes a write fail. A text already within its bound is unchanged,
so fitting twice is fitting once.
"""

from __future__ import annotations

import unicodedata

from .models import DeadLetter, Job

#: Error messages and tracebacks (``text`` columns) are kept up to this many characters.
MAX_ERROR_LENGTH = 64 * 1024
#: A dead letter's reason: ``DeadLetter.reason``'s ``max_length``.
MAX_REASON_LENGTH: int = DeadLetter._meta.get_field("reason").max_length  # type: ignore[assignment]
#: A worker id: ``Job.worker_id``'s ``max_length``.
MAX_WORKER_ID_LENGTH: int = Job._meta.get_field("worker_id").max_length  # type: ignore[assignment]
#: Unicode categories :func:`printable` replaces: control (escape, newline, tab, NUL, ...),
#: format (zero-width and bidirectional marks), surrogates, line and paragraph separators.
UNPRINTABLE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def _marker(dropped: int) -> str:
    return f"… [{dropped} more characters]"


def bounded(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters (the marker included), its tail replaced
    by ``"… [N more characters]"``; unchanged if it fits. ``limit`` must leave room for the
    marker (at least 40 characters)."""
    if len(text) <= limit:
        return text
    keep = limit - len(_marker(len(text)))  # the marker can only be shorter than this one
    return text[:keep] + _marker(len(text) - keep)


def storable(text: str) -> str:
    """``text`` as PostgreSQL can store it: NUL bytes escaped, invalid Unicode replaced."""
    return text.replace("\x00", "\\x00").encode("utf-8", "replace").decode("utf-8")


def fit(text: str, limit: int = MAX_ERROR_LENGTH) -> str:
    """``text`` storable and within ``limit`` characters (see :func:`bounded`)."""
    return bounded(storable(text), limit)


def reason(text: str) -> str:
    """A dead letter's reason, fitted to its column."""
    return fit(text, MAX_REASON_LENGTH)


def first_line(text: str, limit: int = 300) -> str:
    """The first line of ``text``, within ``limit`` characters and followed by ``" …"`` if
    more lines follow: for one-line log messages and reasons."""
    line, _, rest = text.strip().partition("\n")
    return bounded(line + " …", limit) if rest.strip() else bounded(line, limit)


def printable(text: str) -> str:
    """``text`` with each character of :data:`UNPRINTABLE_CATEGORIES` replaced by ``?``: safe
    to print on a terminal or a log line when someone else chose it (another session's
    application name or query), which could otherwise move the cursor, forge a line or
    reverse what follows."""
    return "".join(
        "?" if unicodedata.category(character) in UNPRINTABLE_CATEGORIES else character
        for character in text
    )
