"""What every figure shares: the :class:`Figures` pair, :class:`Skip`, canvas and labels.

Each figure function takes a :class:`~raypeft.reporting.load.Search` and returns a
:class:`Figures` pair (a matplotlib figure on the Agg canvas for the PNG, a plotly figure for
the HTML page), or raises :class:`Skip` with the reason the data cannot support it.
"""

from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from raypeft.reporting.load import Search

# tab10: the same colour for a method in the PNG and in the HTML
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2"]


class Skip(Exception):
    """The data cannot support a figure; the message says why."""


@dataclass
class Figures:
    png: Figure
    html: go.Figure
    note: str = ""  # shown next to the figure in summary.md


def _mpl(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)  # the Agg canvas: no display, no pyplot global state
    return fig


def _fmt(value: float) -> str:
    return f"{value:g}"


def _metric_label(search: Search) -> str:
    return f"best validation {search.metric} ({search.mode})"
