"""Small server-rendered SVG charts for the admin dashboard: no JavaScript, nothing fetched.

::

    chart([3, 0, 5, None, 2], title="Succeeded per minute")     # -> SafeString (<svg>)

A chart is one series, oldest value first, drawn as bars (counts per minute) or a line
(sampled levels such as a queue's depth); ``None`` is a gap (no data for that minute). The
largest value labels the top of the axis; every text is escaped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from django.utils.html import escape, format_html
from django.utils.safestring import SafeString, mark_safe

WIDTH = 300
HEIGHT = 90
_TOP = 14  # room for the title and the top-of-axis label
_BOTTOM = 12  # room for the time labels
_PLOT = HEIGHT - _TOP - _BOTTOM


def _count(value: float) -> str:
    return f"{value:.0f}"


def chart(
    values: Sequence[float | None],
    *,
    title: str,
    style: str = "bar",
    color: str = "#417690",
    label: Callable[[float], str] = _count,
    start_label: str = "-60 min",
    end_label: str = "now",
) -> SafeString:
    """An SVG chart of ``values`` (``style`` ``"bar"`` or ``"line"``), ``title`` above it,
    the largest value formatted with ``label`` as the axis's top.

    Raises:
        ValueError: an unknown ``style``, or no values.
    """
    if style not in ("bar", "line"):
        raise ValueError(f"style must be 'bar' or 'line', not {style!r}")
    if not values:
        raise ValueError("a chart needs at least one value")
    present = [value for value in values if value is not None]
    top = max(present, default=0.0) or 1.0
    step = WIDTH / len(values)

    def y(value: float) -> float:
        return _TOP + _PLOT * (1 - value / top)

    if style == "bar":
        marks = "".join(
            f'<rect x="{n * step + 0.5:.1f}" y="{y(value):.1f}" width="{max(step - 1, 0.5):.1f}" '
            f'height="{_TOP + _PLOT - y(value):.1f}" fill="{escape(color)}"/>'
            for n, value in enumerate(values)
            if value
        )
    else:
        runs: list[list[str]] = [[]]
        for n, value in enumerate(values):
            if value is None:
                runs.append([])
            else:
                runs[-1].append(f"{(n + 0.5) * step:.1f},{y(value):.1f}")
        marks = "".join(
            f'<polyline points="{" ".join(points)}" fill="none" stroke="{escape(color)}" '
            f'stroke-width="1.5"/>'
            if len(points) > 1
            else f'<circle cx="{points[0].split(",")[0]}" cy="{points[0].split(",")[1]}" '
            f'r="1.5" fill="{escape(color)}"/>'
            for points in runs
            if points
        )
    peak = label(max(present)) if present else "no data"
    return format_html(
        '<svg class="jobq-chart" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" '
        'aria-label="{title}: peak {peak}"><title>{title}: peak {peak}</title>'
        '<text x="0" y="10" class="jobq-chart-title">{title}</text>'
        '<text x="{w}" y="10" text-anchor="end" class="jobq-chart-peak">{peak}</text>'
        '<line x1="0" y1="{base}" x2="{w}" y2="{base}" stroke="#999" stroke-width="0.5"/>'
        "{marks}"
        '<text x="0" y="{h}" class="jobq-chart-axis">{start}</text>'
        '<text x="{w}" y="{h}" text-anchor="end" class="jobq-chart-axis">{end}</text></svg>',
        w=WIDTH,
        h=HEIGHT,
        title=title,
        peak=peak,
        base=f"{_TOP + _PLOT:.1f}",
        marks=mark_safe(marks),  # noqa: S308 - numbers and an escaped color only
        start=start_label,
        end=end_label,
    )
