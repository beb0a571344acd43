"""Plain-text tables for the management commands' output."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from django.core.management.base import OutputWrapper


def write_table(
    out: OutputWrapper,
    header: Sequence[str],
    rows: Sequence[Sequence[str]],
    right_aligned: Collection[int] = (),
) -> None:
    """Write ``header`` and ``rows`` as columns two spaces apart, each as wide as its widest
    cell; the columns numbered in ``right_aligned`` are aligned right."""
    table = [tuple(header), *rows]
    widths = [max(len(row[column]) for row in table) for column in range(len(header))]
    for row in table:
        cells = [
            cell.rjust(width) if column in right_aligned else cell.ljust(width)
            for column, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        out.write("  ".join(cells).rstrip())
