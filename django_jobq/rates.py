"""Rate limits as text: the grammar of ``"100/s"``, ``"600/m"``, ``"5/10s"``.

A rate limit is ``<count>/<window>``: at most ``count`` jobs started in any ``window``
(a sliding window, on the database clock; docs/flow-control.md). ``count`` is a whole
number from 1 to :data:`MAX_COUNT`. ``window`` is a unit, ``s`` (second), ``m`` (minute),
``h`` (hour) or ``d`` (day), optionally preceded by a whole number of them from 1 to
999999: ``"5/10s"`` is five starts in any ten seconds. No spaces, no decimals. The same
grammar is a CHECK constraint on the tables that hold limits (``models.RATE_LIMIT_PATTERN``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: The most starts one rate limit allows per window. What a limited claim reads to count
#: them does not grow with it: a row per claim that started jobs, not per start
#: (``jobq_limit_start``).
MAX_COUNT = 1_000_000

_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_RATE_RE = re.compile(r"([1-9][0-9]{0,5}|1000000)/([1-9][0-9]{0,5})?([smhd])\Z")


@dataclass(frozen=True)
class Rate:
    """A parsed rate limit: ``count`` starts per ``window`` seconds; ``text`` as written."""

    count: int
    window: float
    text: str

    @property
    def per_second(self) -> float:
        """The sustained rate in starts per second (``count / window``)."""
        return self.count / self.window


def parse_rate(text: object) -> Rate:
    """Parse a rate limit written ``<count>/<window>`` (see the module docs).

    Args:
        text: the limit, e.g. ``"100/s"``, ``"600/m"``, ``"5/10s"``.

    Returns:
        The :class:`Rate`.

    Raises:
        ValueError: ``text`` is not a str in that grammar; the message shows the grammar.
    """
    match = _RATE_RE.match(text) if isinstance(text, str) else None
    if match is None or not isinstance(text, str):
        raise ValueError(
            f"a rate limit is written <count>/<window>, count 1 to {MAX_COUNT} and window "
            f"s, m, h or d with an optional whole number before it ('100/s', '600/m', "
            f"'5/10s'), not {text!r}"
        )
    count, multiple, unit = match.groups()
    return Rate(int(count), int(multiple or 1) * _UNIT_SECONDS[unit], text)
