"""Argument types for the management commands' numeric options.

Each returns an ``argparse`` type function: a value out of range (or not a number at all)
becomes argparse's usage error naming the option (``CommandError`` under ``call_command``),
never a traceback or a silently meaningless threshold.
"""

from __future__ import annotations

import math
from argparse import ArgumentTypeError
from collections.abc import Callable

#: The largest count PostgreSQL compares or takes as a LIMIT (a bigint): the default upper
#: bound of :func:`bounded_int`.
MAX_COUNT = 2**63 - 1


def bounded_int(low: int, high: int = MAX_COUNT) -> Callable[[str], int]:
    """A whole number from ``low`` to ``high`` (both included)."""
    expected = f"at least {low}" if high == MAX_COUNT else f"from {low} to {high}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if not low <= value <= high:
            raise ArgumentTypeError(f"expected a whole number {expected}, not {text!r}")
        return value

    return parse


def seconds(high: float = math.inf, *, zero: bool = False) -> Callable[[str], float]:
    """Seconds, more than 0 (or at least 0 with ``zero``), finite and at most ``high``.
    NaN and infinity are refused."""
    lowest = "at least 0" if zero else "more than 0"
    most = "" if high == math.inf else f" and at most {high:g}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        above_low = value >= 0 if zero else value > 0
        if not (math.isfinite(value) and above_low and value <= high):
            raise ArgumentTypeError(f"expected seconds, {lowest}{most}, not {text!r}")
        return value

    return parse


def at_least_zero(what: str) -> Callable[[str], float]:
    """A number (``what`` names its unit in the error: "a ratio"), finite and at least 0.
    NaN and infinity are refused."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value >= 0):
            raise ArgumentTypeError(f"expected {what}, finite and at least 0, not {text!r}")
        return value

    return parse
