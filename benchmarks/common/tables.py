"""Markdown tables: the one table formatter of the benchmarks (tabulate's ``pipe`` format)."""

from __future__ import annotations

from collections.abc import Sequence

from tabulate import tabulate


def markdown_table(
    header: Sequence[str], rows: Sequence[Sequence[str]], align: Sequence[str] | None = None
) -> str:
    """A markdown table whose columns are padded to line up in a terminal too.

    Cells are shown as the caller formatted them (``disable_numparse``: tabulate would
    otherwise re-format "1,234" or "0.50"); ``align`` is one of left, right, center per column.
    """
    return tabulate(
        [list(row) for row in rows],
        headers=list(header),
        tablefmt="pipe",
        disable_numparse=True,
        colalign=tuple(align) if align else None,
    )


def print_table(
    header: Sequence[str], rows: Sequence[Sequence[str]], align: Sequence[str] | None = None
) -> None:
    """Print :func:`markdown_table` (flushed: a redirected run shows it at once)."""
    print(markdown_table(header, rows, align), flush=True)


def right_aligned_after(first: int, columns: int) -> tuple[str, ...]:
    """Left-aligned labels in the first ``first`` columns, right-aligned numbers after them."""
    return ("left",) * first + ("right",) * (columns - first)
