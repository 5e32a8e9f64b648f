"""What every figure shares: the :class:`Figures` pair, :class:`Skip`, canvas and labels.

Each figure function takes a :class:`~raypeft.reporting.load.Search` and returns a
:class:`Figures` pair (a matplotlib figure on the Agg canvas for the PNG, a plotly figure for
the HTML page), or raises :class:`Skip` with the reason the data cannot support it.

Titles go through :func:`png_title` and :func:`html_heading`: neither canvas wraps a long
title by itself, and a title wider than its figure was cut off at the edge.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import plotly.graph_objects as go
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.text import Text

from raypeft.reporting.load import Search

# tab10: the same colour for a method in the PNG and in the HTML
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2"]
TITLE_FONTSIZE = 10  # points, in the PNG
NOTE_FONTSIZE = 7  # a note under a PNG's axes
TITLE_MARGIN_IN = 0.15  # inches kept free at each side of a PNG title
# An HTML page is as wide as the browser window (plotly's default): about 60 characters of a
# plotly title fit the width of a narrow window or of the MLflow UI's artefact pane
HTML_TITLE_CHARS = 60
HTML_NOTE_CHARS = 85  # a note under the title is set smaller (<sup>)
# plotly's title: 17 px type, lines 1.3 em apart (a <sup> line too), hung from the top
HTML_LINE_PX = 23
HTML_TITLE_PAD_PX = 10  # above the first line
HTML_TITLE_GAP_PX = 25  # between the last line and the plot
HTML_PANEL_TITLE_PX = 25  # subplot titles sit in the top margin, just above their panels


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


def png_title(fig: Figure, text: str, fontsize: float = TITLE_FONTSIZE) -> Text:
    """``text`` as the figure's title, wrapped to the figure's width.

    A figure title (suptitle) rather than an axes title: it is centred on the figure, not on
    an axes pushed aside by long tick labels, and the constrained layout makes room for all
    its lines.
    """
    return fig.suptitle(fit_text(fig, text, fontsize), fontsize=fontsize)


def png_note(fig: Figure, text: str, fontsize: float = NOTE_FONTSIZE) -> Text:
    """``text`` as a small note under the axes (laid out there, never over them), wrapped to
    the figure's width."""
    return fig.supxlabel(fit_text(fig, text, fontsize), fontsize=fontsize)


def fit_text(fig: Figure, text: str, fontsize: float, width_in: float | None = None) -> str:
    """``text`` wrapped at word boundaries so that each line fits ``width_in`` inches (by
    default the figure's width less a margin at each side). Each line is measured with the
    figure's renderer, so it fits at any dpi the figure is saved at."""
    renderer = fig.canvas.get_renderer()
    font = FontProperties(size=fontsize)
    width_in = fig.get_figwidth() if width_in is None else width_in
    room = (width_in - 2 * TITLE_MARGIN_IN) * fig.dpi  # pixels at the figure's dpi

    def fits(line: str) -> bool:
        return renderer.get_text_width_height_descent(line, font, ismath=False)[0] <= room

    return _wrap(text, fits)


def html_heading(text: str, note: str = "", panel_titles: bool = False) -> dict:
    """The plotly layout of a page's title: ``text`` wrapped to lines of
    :data:`HTML_TITLE_CHARS` (plotly never wraps a title), an optional smaller ``note`` under
    it, and a top margin with room for every line (``panel_titles``: and for the subplot
    titles under it). Use as ``fig.update_layout(**html_heading(...))``.

    The title hangs from the top of the page (``yref="container"``, ``y=1``,
    ``yanchor="top"``) and the top margin is sized from its line count: plotly's automargin
    estimates one line, and with the default anchor the first line of a two-line title was
    drawn above the page (y = -7 px)."""
    lines = _wrap(text, lambda line: len(line) <= HTML_TITLE_CHARS).split("\n")
    if note:
        lines += [
            f"<sup>{line}</sup>"
            for line in _wrap(note, lambda n: len(n) <= HTML_NOTE_CHARS).split("\n")
        ]
    title = {
        "text": "<br>".join(lines),
        "automargin": True,  # never less room than plotly's own estimate
        "yref": "container",
        "y": 1,
        "yanchor": "top",
        "pad": {"t": HTML_TITLE_PAD_PX},
    }
    top = HTML_TITLE_PAD_PX + HTML_LINE_PX * len(lines) + HTML_TITLE_GAP_PX
    return {"title": title, "margin": {"t": top + (HTML_PANEL_TITLE_PX if panel_titles else 0)}}


def _wrap(text: str, fits: Callable[[str], bool]) -> str:
    """``text`` with newlines between words where a line would no longer ``fits(line)``
    (a single word longer than a line stays whole); newlines already in it are kept."""
    out = []
    for paragraph in text.split("\n"):
        line = ""
        for word in paragraph.split(" "):
            longer = f"{line} {word}" if line else word
            if line and not fits(longer):
                out.append(line)
                line = word
            else:
                line = longer
        out.append(line)
    return "\n".join(out)
