"""Figures a method asks for through its figure hints (:class:`~raypeft.methods.base.FigureHints`):
the heat map of its two learning rates (a panel over all prompt lengths, then one per prompt
length), and the score vs (prompt length, rank) at a fixed budget (DePT's α1 × α2 and (m, r)
figures).

Both use the finished trials of the first registered method with hints that has such trials
here (those with a prompt length); the rank is the one the budget derived for the length
(``derived.<rank>``, else ``method.<rank>``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go
from matplotlib.colors import Normalize
from matplotlib.patches import Rectangle
from plotly.subplots import make_subplots

from raypeft.data.metrics import METRIC_DECIMALS, format_metric
from raypeft.methods import METHODS
from raypeft.methods.base import FigureHints
from raypeft.reporting.drawing import (
    PALETTE,
    TITLE_FONTSIZE,
    Figures,
    Skip,
    _fmt,
    _metric_label,
    _mpl,
    fit_text,
    html_heading,
    png_note,
    png_title,
)
from raypeft.reporting.load import Search, TrialRecord, _given

LABEL_FONTSIZE = 10  # points: matplotlib's default axis label size
TICK_LABELS_IN = 0.7  # inches of a heat map panel taken by its y tick labels ("0.0005")
STOPPED_NOTE = "* / hatched: best trial of the cell was stopped early (low-fidelity value)"
# a heat map cell's score (to the summary's decimals) and trial
HOVER_TAIL = f"%{{z:.{METRIC_DECIMALS}f}} %{{customdata}}<extra></extra>"


@dataclass(frozen=True)
class Knobs:
    """One method's figure hints, as the logged param names the figures read."""

    name: str  # the method's registered name (a trial's ``method``)
    hints: FigureHints

    @property
    def lr_x(self) -> str:
        return f"method.{self.hints.learning_rates[0]}"

    @property
    def lr_y(self) -> str:
        return f"method.{self.hints.learning_rates[1]}"

    @property
    def length(self) -> str:
        return f"method.{self.hints.length}"

    def rank(self, trial: TrialRecord) -> str:
        """The trial's rank (derived from the budget, else set), as a tick label."""
        r = trial.num(f"derived.{self.hints.rank}")
        r = r if r is not None else trial.num(f"method.{self.hints.rank}")
        return "?" if r is None else _fmt(r)

    def length_of(self, trial: TrialRecord) -> int:
        return int(trial.num(self.length))


def hinted_methods() -> list[Knobs]:
    """Every registered method with figure hints, in registration order."""
    return [
        Knobs(name, method.config_cls.figure_hints)
        for name, method in METHODS.items()
        if method.config_cls.figure_hints is not None
    ]


def captions() -> tuple[str, str]:
    """What the heat map and the budget figure show, in the first hinted method's words."""
    methods = hinted_methods()
    if not methods:
        return "learning-rate heat map (no method declares one)", "score vs (length, rank)"
    h = methods[0].hints
    per = f"{h.length.replace('_', ' ')} {h.length_symbol}"
    s1, s2, m = *h.lr_symbols, h.length_symbol
    return (
        f"{h.label} {s1} × {s2} heat map: the best over all {m}, then one panel per {per}",
        f"{h.label} score vs ({h.length_symbol}, {h.rank_symbol}) at the fixed budget",
    )


def _trials(search: Search) -> tuple[Knobs, list[TrialRecord]]:
    """The first hinted method with finished trials that have a prompt length (best first);
    the first hinted method and no trials when none has any."""
    methods = hinted_methods()
    if not methods:
        raise Skip("no registered method declares figure hints")
    for knobs in methods:
        ranked = search.ranked()
        trials = [t for t in ranked if t.method == knobs.name and t.num(knobs.length) is not None]
        if trials:
            return knobs, trials
    return methods[0], []


def _axis(values: list[float], max_ticks: int = 10) -> tuple[list[str], Callable[[float], int]]:
    """Tick labels and value -> index: one tick per value, or bins when values are many
    (learning rates sampled from a continuous range rather than a grid)."""
    distinct = sorted(set(values))
    if len(distinct) <= max_ticks:
        return [_fmt(v) for v in distinct], distinct.index
    lo, hi, n = distinct[0], distinct[-1], 6
    edges = np.geomspace(lo, hi, n + 1) if lo > 0 else np.linspace(lo, hi, n + 1)
    labels = [f"{a:.2g}–{b:.2g}" for a, b in zip(edges[:-1], edges[1:], strict=True)]
    return labels, lambda v: min(int(np.searchsorted(edges, v, side="right")) - 1, n - 1)


# ----------------------------------------------------------------------------- heat map


Cell = tuple[int, int]  # (y, x): a heat map cell's row and column


@dataclass
class Panel:
    """One panel of the heat map: the best trial of each (y, x) cell among its trials."""

    name: str  # its trace's name in the HTML page: "m=4", or "all m"
    title: str
    cells: dict[Cell, TrialRecord]
    shows_length: bool = False  # the all-lengths panel writes each cell's length in it


@dataclass
class HeatMap:
    """The heat map's data: axes, its panels (all lengths, then one per length), the colour
    range."""

    knobs: Knobs
    xs: list[str]
    ys: list[str]
    panels: list[Panel]
    lo: float
    hi: float

    @property
    def any_stopped(self) -> bool:
        return any(t.stopped_early for p in self.panels for t in p.cells.values())

    def cell_text(self, panel: Panel, trial: TrialRecord, newline: str) -> str:
        """A cell's score as the summary writes it, starred when its trial stopped early,
        and on the all-lengths panel the length it came from."""
        text = format_metric(trial.value) + ("*" if trial.stopped_early else "")
        if panel.shows_length:
            text += f"{newline}{self.knobs.hints.length_symbol}={self.knobs.length_of(trial)}"
        return text


def _best_per_cell(
    trials: list[TrialRecord], cell_of: Callable[[TrialRecord], Cell]
) -> dict[Cell, TrialRecord]:
    """The first trial of each cell: its best, as ``trials`` come best first."""
    cells: dict[Cell, TrialRecord] = {}
    for t in trials:
        cells.setdefault(cell_of(t), t)
    return cells


def _panels(
    knobs: Knobs, trials: list[TrialRecord], cell_of: Callable[[TrialRecord], Cell]
) -> list[Panel]:
    """One panel per prompt length, after one over all lengths when there are several (the
    best cell whatever the length: where to look first)."""
    h = knobs.hints
    lengths = sorted({knobs.length_of(t) for t in trials})
    panels = []
    for m in lengths:
        cells = _best_per_cell([t for t in trials if knobs.length_of(t) == m], cell_of)
        rank = knobs.rank(next(iter(cells.values())))
        name = f"{h.length_symbol}={m}"
        panels.append(Panel(name, f"{name} ({h.rank_symbol}={rank})", cells))
    if len(lengths) > 1:
        name = f"all {h.length_symbol}"
        every = Panel(name, f"{name}: best per cell", _best_per_cell(trials, cell_of), True)
        panels.insert(0, every)
    return panels


def _heat_map(search: Search) -> HeatMap:
    knobs, trials = _trials(search)
    trials = [t for t in trials if None not in (t.num(knobs.lr_x), t.num(knobs.lr_y))]
    if not trials:
        raise Skip(f"no finished {knobs.hints.label} trial with {knobs.lr_x} and {knobs.lr_y}")
    xs, x_of = _axis([t.num(knobs.lr_x) for t in trials])
    ys, y_of = _axis([t.num(knobs.lr_y) for t in trials])
    if len(xs) * len(ys) < 2:
        s1, s2 = knobs.hints.lr_symbols
        raise Skip(f"{s1} and {s2} take one value each: nothing to map")

    def cell_of(t: TrialRecord) -> Cell:
        return y_of(t.num(knobs.lr_y)), x_of(t.num(knobs.lr_x))

    values = [t.value for t in trials]
    lo, hi = min(values), max(values)
    if hi - lo < 1e-9:  # every cell ties: a small band around it, not a degenerate scale
        pad = max(abs(lo) * 0.01, 1e-3)
        lo, hi = lo - pad, hi + pad
    return HeatMap(knobs, xs, ys, _panels(knobs, trials, cell_of), lo, hi)


def lr_heatmap(search: Search) -> Figures:
    """A hinted method's best score per pair of its two learning rates (DePT: α1 × α2): one
    panel over all prompt lengths, then one per prompt length."""
    data = _heat_map(search)
    h = data.knobs.hints
    pair = "\u00a0×\u00a0".join(h.lr_symbols)  # no-break spaces: "α1 × α2" never splits
    title = f"{h.label}: {_metric_label(search)} per {pair} cell"
    png = _heatmap_png(search, data, title)
    html = _heatmap_html(search, data, title)
    return Figures(png, html, "cells marked * were stopped early" if data.any_stopped else "")


def _heatmap_png(search: Search, data: HeatMap, title: str):
    xs, ys, knobs, n = data.xs, data.ys, data.knobs, len(data.panels)
    norm = Normalize(data.lo, data.hi)
    cmap = "viridis" if search.mode == "max" else "viridis_r"  # bright = better either way
    panel_width = 0.6 + 0.9 * len(xs)  # inches: a column of cells is 0.9
    png = _mpl(1.5 + panel_width * n, 2.2 + 0.45 * len(ys))
    axes = png.subplots(1, n, squeeze=False)[0]
    for ax, panel in zip(axes, data.panels, strict=True):
        grid = np.full((len(ys), len(xs)), np.nan)
        for (j, i), t in panel.cells.items():
            grid[j, i] = t.value
            ink = "black" if norm(t.value) > 0.5 else "white"
            if search.mode == "min":
                ink = "white" if ink == "black" else "black"
            text = data.cell_text(panel, t, "\n")
            ax.text(i, j, text, ha="center", va="center", fontsize=8, color=ink)
            if t.stopped_early:
                ax.add_patch(
                    Rectangle((i - 0.5, j - 0.5), 1, 1, fill=False, hatch="///", lw=0, ec="0.5")
                )
        image = ax.imshow(
            np.ma.masked_invalid(grid), cmap=cmap, norm=norm, origin="lower", aspect="auto"
        )
        ax.set_xticks(range(len(xs)), xs, rotation=30 if len(xs) > 4 else 0)
        ax.set_yticks(range(len(ys)), ys)
        # a panel may be narrow: its title wraps to it rather than run into the next one
        ax.set_title(
            fit_text(png, panel.title, TITLE_FONTSIZE, panel_width), fontsize=TITLE_FONTSIZE
        )
        # wrapped to the panel less its y tick labels: a label wider than its panel ran
        # into the next panel's
        x_label = f"{knobs.hints.lr_symbols[0]} ({knobs.lr_x})"
        ax.set_xlabel(fit_text(png, x_label, LABEL_FONTSIZE, panel_width - TICK_LABELS_IN))
    axes[0].set_ylabel(f"{knobs.hints.lr_symbols[1]} ({knobs.lr_y})")
    png.colorbar(image, ax=list(axes), label=_metric_label(search), format="%.3g")
    png_title(png, title, fontsize=11)
    if data.any_stopped:
        png_note(png, STOPPED_NOTE)
    return png


def _heatmap_html(search: Search, data: HeatMap, title: str) -> go.Figure:
    xs, ys, h = data.xs, data.ys, data.knobs.hints
    (s1, s2), (lr1, lr2) = h.lr_symbols, h.learning_rates
    titles = [p.title for p in data.panels]
    html = make_subplots(rows=1, cols=len(data.panels), subplot_titles=titles, shared_yaxes=True)
    for k, panel in enumerate(data.panels, start=1):
        z = [[None] * len(xs) for _ in ys]
        text = [[""] * len(xs) for _ in ys]
        who = [[""] * len(xs) for _ in ys]
        for (j, i), t in panel.cells.items():
            z[j][i] = t.value
            text[j][i] = data.cell_text(panel, t, "<br>")
            who[j][i] = t.label + (" stopped early" if t.stopped_early else "")
        heat = go.Heatmap(
            z=z,
            x=xs,
            y=ys,
            text=text,
            customdata=who,
            texttemplate="%{text}",
            hovertemplate=f"{s1}=%{{x}}<br>{s2}=%{{y}}<br>" + HOVER_TAIL,
            coloraxis="coloraxis",
            name=panel.name,
            xgap=2,
            ygap=2,
        )
        html.add_trace(heat, 1, k)
    html.update_xaxes(type="category", title_text=f"{s1} ({lr1})")
    html.update_yaxes(type="category")
    html.update_yaxes(title_text=f"{s2} ({lr2})", col=1)
    html.update_layout(
        **html_heading(
            title, "* stopped early: low fidelity" if data.any_stopped else "", panel_titles=True
        ),
        coloraxis={
            "colorscale": "Viridis",
            "reversescale": search.mode == "min",
            "cmin": data.lo,
            "cmax": data.hi,
            "colorbar": {"title": {"text": search.metric}},
        },
    )
    return html


# ----------------------------------------------------------------------------- budget figure


def budget_m_r(search: Search) -> Figures:
    """A hinted method at a fixed budget: every trial and the best per prompt length (with
    the rank the budget derived for it; DePT's m and r)."""
    knobs, trials = _trials(search)
    h = knobs.hints
    m_, r_ = h.length_symbol, h.rank_symbol
    if not trials:
        raise Skip(f"no finished {h.label} trial with {knobs.length}")
    ms = sorted({knobs.length_of(t) for t in trials})
    best = {m: next(t for t in trials if knobs.length_of(t) == m) for m in ms}
    ticks = [f"{m_}={m} / {r_}={knobs.rank(best[m])}" for m in ms]
    params = search.parent.data.params
    budget = _given(params.get(f"method.{h.budget_length}")) if h.budget_length else None
    budget = f"PT length {budget}" if budget else _given(params.get("budget_params"))
    title = (
        f"{h.label} at a fixed budget ({budget or 'not recorded'}):\n"
        f"{search.metric} vs ({m_}, {r_})"
    )
    groups = {
        "trials": [t for t in trials if not t.stopped_early],
        "stopped early": [t for t in trials if t.stopped_early],
    }
    png = _budget_png(search, knobs, groups, best, ticks, title)
    html = _budget_html(search, knobs, groups, best, ticks, title)
    return Figures(png, html)


def _budget_png(search: Search, knobs: Knobs, groups, best, ticks: list[str], title: str):
    ms, h = list(best), knobs.hints
    png = _mpl(max(4.5, 1.5 + 1.1 * len(ms)), 4)
    ax = png.subplots()
    x_of = {m: i for i, m in enumerate(ms)}
    for name, group in groups.items():
        if group:
            ax.scatter(
                [x_of[knobs.length_of(t)] for t in group],
                [t.value for t in group],
                facecolors="none" if name == "stopped early" else PALETTE[0],
                edgecolors=PALETTE[0],
                alpha=0.7,
                label=name,
            )
    best_label = f"best per {h.length_symbol}"
    ax.plot(range(len(ms)), [best[m].value for m in ms], "-o", color=PALETTE[1], label=best_label)
    ax.set_xticks(range(len(ms)), ticks)
    ax.set_xlim(-0.5, len(ms) - 0.5)
    ax.set_ylabel(_metric_label(search))
    length = h.length.replace("_", " ")
    ax.set_xlabel(f"{length} {h.length_symbol} / derived {h.rank} {h.rank_symbol}")
    png_title(png, title)
    ax.legend(fontsize=8)
    return png


def _budget_html(
    search: Search, knobs: Knobs, groups, best, ticks: list[str], title: str
) -> go.Figure:
    ms, h = list(best), knobs.hints
    tick_of = dict(zip(ms, ticks, strict=True))
    html = go.Figure()
    for name, group in groups.items():
        if group:
            html.add_trace(
                go.Scatter(
                    x=[tick_of[knobs.length_of(t)] for t in group],
                    y=[t.value for t in group],
                    text=[t.label for t in group],
                    mode="markers",
                    name=name,
                    marker={
                        "color": PALETTE[0],
                        "symbol": "circle-open" if "stopped" in name else "circle",
                    },
                )
            )
    html.add_trace(
        go.Scatter(
            x=ticks,
            y=[best[m].value for m in ms],
            text=[best[m].label for m in ms],
            mode="lines+markers",
            name=f"best per {h.length_symbol}",
            line={"color": PALETTE[1]},
        )
    )
    html.update_xaxes(
        type="category",
        categoryorder="array",
        categoryarray=ticks,
        title_text=f"{h.length_symbol} / {h.rank_symbol}",
    )
    html.update_layout(**html_heading(title.replace("\n", " ")), yaxis_title=_metric_label(search))
    return html
