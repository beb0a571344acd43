"""Dead-letter fingerprints: which dead letters died of the same cause.

A dead letter's fingerprint is the first line of its ``last_error`` (its ``reason`` when it
has no error), with what varies from one job to the next replaced by a placeholder. The
worker writes an error as ``ExceptionClass: message``, so the class is kept and only the
values in the message go::

    ValueError: order 1042 uses the expired coupon 'EXPIRED'
        -> ValueError: order <n> uses the expired coupon <str>
    KeyError: 'user_id'                       -> KeyError: <str>
    no live worker serving its queue has registered its kind    (unchanged)

The rules, in the order they apply (:data:`RULES`; each has an example the tests run):

- ``<uuid>``: a UUID, 8-4-4-4-12 hex digits (``6f1c2e8a-1b2c-4d5e-9f00-aabbccddeeff``);
- ``<time>``: an ISO 8601 date, with its time and offset if any (``2026-11-29T15:23:07+00:00``);
- ``<email>``: a token with an ``@`` inside, an e-mail address or ``user@host``;
- ``<str>``: a quoted value, ``'…'`` or ``"…"`` (also with a ``b``, ``r``, ``u`` or ``f``
  prefix), whose opening quote follows no letter or digit: the apostrophe of ``can't``
  opens nothing;
- ``<hex>``: ``0x…``, or a run of 8 or more hex digits holding a digit and a letter
  (hashes, object ids: ``5f2b9c8e1d0a``), touching no other letter or digit;
- ``<n>``: a number, digits with any ``.`` or ``,`` groups (``1042``, ``12.50``, the ``42``
  of ``user_42``), touching no letter or digit: ``S3Error``, ``utf8``, ``sha256`` and
  ``Error404`` stay as they are.

Then runs of whitespace become one space, and the result is cut to
:data:`MAX_FINGERPRINT_LENGTH` characters (the text is cut to :data:`MAX_SOURCE_LENGTH`
characters before the rules, which bounds their cost). Only ASCII letters and digits count
as such, whatever the database's locale, so a fingerprint is the same on every server.

Deliberately coarse: every quoted value goes, so ``KeyError: 'a'`` and ``KeyError: 'b'``
share a group, and so do the violations of two constraints that PostgreSQL names in double
quotes; a value the rules do not recognise (``took 10s``, ``tok_9sJd82``) keeps its own
group. The groups page shows each group's kinds and an example to tell them apart.

The fingerprint is a stored generated column (``DeadLetter.fingerprint``): PostgreSQL
computes it in every insert, however the row was written (the worker's statements, the
maintenance sweep, the ORM, another producer), and migration 0010 computed it for the rows
that existed. Changing a rule changes :func:`expression` and so the model: Django then
needs a migration that removes the column and adds it again (it cannot alter a generated
column), which rewrites the table.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from django.core.checks import CheckMessage
from django.db import DatabaseError
from django.db.models import F, Func, GeneratedField, TextField, Value
from django.db.models.functions import Coalesce, Left, NullIf

#: The longest fingerprint, in characters (it is shown, indexed and passed in URLs).
MAX_FINGERPRINT_LENGTH = 200
#: The rules read at most this many characters of the error's first line.
MAX_SOURCE_LENGTH = 1000

# ASCII letters and digits: the characters a value must not touch to be replaced.
_ALNUM = "A-Za-z0-9"
_HEX = "0-9A-Fa-f"


class Rule(NamedTuple):
    """One replacement: PostgreSQL regular expression ``pattern`` (every match) becomes
    ``replacement``; ``example`` normalises to ``normalised`` (a test checks it)."""

    pattern: str
    replacement: str
    example: str
    normalised: str


#: The rules, in the order they apply (see the module's docs).
RULES: tuple[Rule, ...] = (
    Rule(
        f"[{_HEX}]{{8}}-[{_HEX}]{{4}}-[{_HEX}]{{4}}-[{_HEX}]{{4}}-[{_HEX}]{{12}}",
        "<uuid>",
        "LookupError: no invoice 6f1c2e8a-1b2c-4d5e-9f00-aabbccddeeff",
        "LookupError: no invoice <uuid>",
    ),
    Rule(
        "[0-9]{4}-[0-9]{2}-[0-9]{2}([T ][0-9]{2}:[0-9]{2}(:[0-9]{2}([.,][0-9]+)?)?)?"
        "(Z|[+-][0-9]{2}(:?[0-9]{2})?)?",
        "<time>",
        "ValueError: slot 2026-11-29T15:23:07+00:00 is taken",
        "ValueError: slot <time> is taken",
    ),
    Rule(
        r"""[^ \t@'"<>()\[\]{},;:]+@[^ \t@'"<>()\[\]{},;:]+""",
        "<email>",
        "SMTPRecipientsRefused: bob@example.com refused",
        "SMTPRecipientsRefused: <email> refused",
    ),
    Rule(
        f"(?<![{_ALNUM}])[bBrRuUfF]?('[^']*'|\"[^\"]*\")",
        "<str>",
        "ValueError: can't parse 'abc' as \"int\"",
        "ValueError: can't parse <str> as <str>",
    ),
    Rule(
        f"(?<![{_ALNUM}])(0x[{_HEX}]+|(?=[{_HEX}]*[0-9])(?=[{_HEX}]*[A-Fa-f])[{_HEX}]{{8,}})"
        f"(?![{_ALNUM}])",
        "<hex>",
        "RuntimeError: object at 0x7f3a2b10, commit 5f2b9c8e1d0a",
        "RuntimeError: object at <hex>, commit <hex>",
    ),
    Rule(
        f"(?<![{_ALNUM}])[0-9]+([.,][0-9]+)*(?![{_ALNUM}])",
        "<n>",
        "S3Error: order 1042 (user_42) owes 12.50 over utf8",
        "S3Error: order <n> (user_<n>) owes <n> over utf8",
    ),
    Rule(r"[ \t\r\f\v]{2,}|[\t\r\f\v]", " ", "ValueError: a  \t b", "ValueError: a b"),
)

# Whitespace trimmed around the source text and its first line.
_BLANKS = " \t\r\n"


def _first_line(field: str) -> Func:
    """The first non-blank line of text column ``field``: ``split_part(ltrim(...), '\\n', 1)``."""
    trimmed = Func(F(field), Value(_BLANKS), function="ltrim", output_field=TextField())
    return Func(trimmed, Value("\n"), Value(1), function="split_part", output_field=TextField())


def expression() -> Func:
    """The fingerprint as a Django expression over a dead letter's columns: the
    ``GeneratedField``'s definition (immutable functions only: ``ltrim``, ``split_part``,
    ``left``, ``regexp_replace``, ``btrim``)."""
    source: Func = Left(
        Coalesce(NullIf(_first_line("last_error"), Value("")), _first_line("reason")),
        MAX_SOURCE_LENGTH,
    )
    for rule in RULES:
        source = Func(
            source,
            Value(rule.pattern),
            Value(rule.replacement),
            Value("g"),
            function="regexp_replace",
            output_field=TextField(),
        )
    trimmed = Func(source, Value(_BLANKS), function="btrim", output_field=TextField())
    return Left(trimmed, MAX_FINGERPRINT_LENGTH)


class FingerprintField(GeneratedField):
    """``DeadLetter.fingerprint``: a ``GeneratedField`` whose system checks survive a
    database that cannot be reached.

    Django 6.1 checks a ``GeneratedField`` against every database the checks are given
    (``manage.py check`` gives it all of them), asking each server for its version: with one
    unreachable, the command would fail inside Django's own check, before
    ``django_jobq.W006`` can say which database cannot be read and why. This field then
    leaves out the checks that need the database (its other checks still run). It
    deconstructs as ``GeneratedField``: migrations see no difference.
    """

    def check(self, **kwargs: Any) -> list[CheckMessage]:
        try:
            return list(super().check(**kwargs))
        except DatabaseError:
            return list(super().check(**{**kwargs, "databases": []}))

    def deconstruct(self) -> Any:
        name, _path, args, kwargs = super().deconstruct()
        return name, "django.db.models.GeneratedField", args, kwargs
