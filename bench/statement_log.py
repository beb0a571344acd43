"""The server's own timing of every claim, probe and ack statement, read from its log.

bench/backlog.py starts its clusters with :data:`LOG_SETTINGS`: every statement's duration
is logged (``log_min_duration_statement = 0``), each record prefixed with a millisecond
timestamp in UTC and the backend's pid (``log_line_prefix = '%m [%p] '``), without the
parameter values (``log_parameter_max_length = 0``: an ack's id arrays would fill the log).

django-jobq sends its statements with the extended protocol (psycopg's server-side
parameters; nothing prepared), which the server logs as three records per statement, each
``duration: <ms> ms  <phase> <unnamed>: <statement text>``: ``parse``, ``bind`` (where an
unnamed statement is planned) and ``execute``. A statement's latency here is the sum of its
three phases, timed at its ``execute`` record (the end of the statement). It is the
server's work on the statement; the commit that follows in autocommit (its WAL flush) and
the round trips are not in it.

Statements are recognised by their whole text: each of :data:`WATCHED` with its
``%(name)s`` placeholders numbered as psycopg sends them (``$1`` for the first name, the
same number for each later use of it) and its whitespace collapsed, as the log's text is.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from pathlib import Path

#: The server settings that make it log what :func:`read` parses.
LOG_SETTINGS = {
    "log_min_duration_statement": "0",
    "log_line_prefix": "%m [%p] ",
    "log_timezone": "UTC",
    "log_parameter_max_length": "0",
}

#: Statement groups: the prefix of the ``django_jobq.sql.claims`` / ``.outcomes`` constants'
#: names in each.
WATCHED = {
    "claim": "CLAIM_JOBS_",  # the front and the walk (CLAIM_JOBS_WALK_*)
    "probe": "PROBE_CLAIM_POSITIONS_",
    "ack": "ACK_JOBS",
}

_RECORD = re.compile(
    rb"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}) UTC \[(\d+)\] LOG:  "
    rb"duration: ([0-9.]+) ms  (parse|bind|execute) [^:]*: ?(.*)$"
)
_PREFIX = re.compile(rb"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} UTC \[\d+\] ")
_PLACEHOLDER = re.compile(r"%%|%\((\w+)\)[sbt]")


@dataclass(frozen=True)
class Statement:
    """One watched statement as the server timed it."""

    #: When its execute phase ended: nanoseconds since the epoch (the log's clock, UTC).
    at_ns: int
    #: The ``django_jobq.sql`` constant, e.g. ``CLAIM_JOBS_ONE_QUEUE``.
    name: str
    #: Its group in :data:`WATCHED`: ``claim``, ``probe`` or ``ack``.
    group: str
    #: Parse + bind + execute, in milliseconds.
    ms: float


def as_sent(statement: str) -> str:
    """``statement`` as psycopg sends it: ``%(name)s`` -> ``$n`` (numbered by first use),
    ``%%`` -> ``%``; whitespace collapsed."""
    numbers: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        if match[1] is None:
            return "%"
        return f"${numbers.setdefault(match[1], len(numbers) + 1)}"

    return collapse(_PLACEHOLDER.sub(number, statement))


def collapse(text: str) -> str:
    return " ".join(text.split())


@cache
def watched_texts() -> dict[str, tuple[str, str]]:
    """``{text as sent: (constant name, group)}`` for every watched statement (of
    ``django_jobq.sql.claims`` and ``django_jobq.sql.outcomes``)."""
    from django_jobq import sql

    texts: dict[str, tuple[str, str]] = {}
    for module in (sql.claims, sql.outcomes):
        for name in dir(module):
            value = getattr(module, name)
            if not isinstance(value, str) or name.startswith("_"):
                continue
            for group, prefix in WATCHED.items():
                if name.startswith(prefix):
                    texts[as_sent(value)] = (name, group)
    return texts


def _records(path: Path, offset: int) -> Iterator[tuple[bytes, list[bytes]]]:
    """``(first line, continuation lines)`` of each log record from byte ``offset`` on."""
    first: bytes | None = None
    rest: list[bytes] = []
    with open(path, "rb") as log:
        log.seek(offset)
        for line in log:
            line = line.rstrip(b"\n")
            if _PREFIX.match(line):
                if first is not None:
                    yield first, rest
                first, rest = line, []
            elif first is not None:
                rest.append(line)
    if first is not None:
        yield first, rest


def read(path: Path, offset: int = 0) -> list[Statement]:
    """The watched statements logged in ``path`` from byte ``offset`` on, in log order."""
    texts = watched_texts()
    pending: dict[bytes, float] = {}  # pid -> parse + bind ms of the statement under way
    found: list[Statement] = []
    for first, rest in _records(path, offset):
        match = _RECORD.match(first)
        if match is None:
            continue
        stamp, pid, duration, phase, head = match.groups()
        ms = float(duration)
        if phase != b"execute":
            pending[pid] = pending.get(pid, 0.0) + ms
            continue
        ms += pending.pop(pid, 0.0)
        text = b"\n".join([head, *rest]).decode("utf-8", "replace")
        known = texts.get(collapse(text))
        if known is None:
            continue
        at = datetime.strptime(stamp.decode(), "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=UTC)
        at_ns = int(at.timestamp()) * 1_000_000_000 + at.microsecond * 1000
        found.append(Statement(at_ns=at_ns, name=known[0], group=known[1], ms=ms))
    return found
