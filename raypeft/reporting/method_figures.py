"""Figures a method asks for through its figure hints (:class:`~raypeft.methods.base.FigureHints`):
the heat map of its two learning rates, one panel per prompt length, and the score vs
(prompt length, rank) at a fixed budget (DePT's α1 × α2 and (m, r) figures).

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

from raypeft.methods import METHODS
from raypeft.methods.base import FigureHints
from raypeft.reporting.drawing import PALETTE, Figures, Skip, _fmt, _metric_label, _mpl
from raypeft.reporting.load import Search, TrialRecord, _given

STOPPED_NOTE = "* / hatched: best trial of the cell was stopped early (low-fidelity value)"
HOVER_TAIL = "%{z:.4f} %{customdata}<extra></extra>"  # a heat map cell's score and trial


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
    return (
        f"{h.label} {h.lr_symbols[0]} × {h.lr_symbols[1]} heat map, one panel per {per}",
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


@dataclass
class HeatMap:
    """The heat map's data: axes, one cell grid per prompt length, the colour range."""

    knobs: Knobs
    xs: list[str]
    ys: list[str]
    lengths: list[int]
    cells: dict[int, dict[tuple[int, int], TrialRecord]]  # length -> (y, x) -> best trial
    lo: float
    hi: float

    @property
    def titles(self) -> list[str]:
        h = self.knobs.hints
        return [
            f"{h.length_symbol}={m} ({h.rank_symbol}="
            f"{self.knobs.rank(next(iter(self.cells[m].values())))})"
            for m in self.lengths
        ]

    @property
    def any_stopped(self) -> bool:
        return any(t.stopped_early for c in self.cells.values() for t in c.values())


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
    lengths = sorted({knobs.length_of(t) for t in trials})
    cells: dict[int, dict[tuple[int, int], TrialRecord]] = {m: {} for m in lengths}
    for t in trials:  # best first, so the first trial of a cell is its best
        key = (y_of(t.num(knobs.lr_y)), x_of(t.num(knobs.lr_x)))
        cells[knobs.length_of(t)].setdefault(key, t)
    values = [t.value for t in trials]
    lo, hi = min(values), max(values)
    if hi - lo < 1e-9:  # every cell ties: a small band around it, not a degenerate scale
        pad = max(abs(lo) * 0.01, 1e-3)
        lo, hi = lo - pad, hi + pad
    return HeatMap(knobs, xs, ys, lengths, cells, lo, hi)


def lr_heatmap(search: Search) -> Figures:
    """A hinted method's best score per pair of its two learning rates (DePT: α1 × α2), one
    panel per prompt length."""
    data = _heat_map(search)
    h = data.knobs.hints
    title = f"{h.label}: {_metric_label(search)} per {h.lr_symbols[0]} × {h.lr_symbols[1]} cell"
    png = _heatmap_png(search, data, title)
    html = _heatmap_html(search, data, title)
    return Figures(png, html, "cells marked * were stopped early" if data.any_stopped else "")


def _heatmap_png(search: Search, data: HeatMap, title: str):
    xs, ys, ms, knobs = data.xs, data.ys, data.lengths, data.knobs
    norm = Normalize(data.lo, data.hi)
    cmap = "viridis" if search.mode == "max" else "viridis_r"  # bright = better either way
    png = _mpl(1.5 + 0.9 * len(xs) * len(ms) + 0.6 * len(ms), 2.2 + 0.45 * len(ys))
    axes = png.subplots(1, len(ms), squeeze=False)[0]
    for ax, m, sub in zip(axes, ms, data.titles, strict=True):
        grid = np.full((len(ys), len(xs)), np.nan)
        for (j, i), t in data.cells[m].items():
            grid[j, i] = t.value
            ink = "black" if norm(t.value) > 0.5 else "white"
            if search.mode == "min":
                ink = "white" if ink == "black" else "black"
            mark = "*" if t.stopped_early else ""
            ax.text(i, j, f"{t.value:.3f}{mark}", ha="center", va="center", fontsize=8, color=ink)
            if t.stopped_early:
                ax.add_patch(
                    Rectangle((i - 0.5, j - 0.5), 1, 1, fill=False, hatch="///", lw=0, ec="0.5")
                )
        image = ax.imshow(
            np.ma.masked_invalid(grid), cmap=cmap, norm=norm, origin="lower", aspect="auto"
        )
        ax.set_xticks(range(len(xs)), xs, rotation=30 if len(xs) > 4 else 0)
        ax.set_yticks(range(len(ys)), ys)
        ax.set_title(sub, fontsize=10)
        ax.set_xlabel(f"{knobs.hints.lr_symbols[0]} ({knobs.lr_x})")
    axes[0].set_ylabel(f"{knobs.hints.lr_symbols[1]} ({knobs.lr_y})")
    png.colorbar(image, ax=list(axes), label=_metric_label(search), format="%.3g")
    png.suptitle(title, fontsize=11)
    if data.any_stopped:
        png.supxlabel(STOPPED_NOTE, fontsize=7)  # laid out below the axes, never over them
    return png


def _heatmap_html(search: Search, data: HeatMap, title: str) -> go.Figure:
    xs, ys, h = data.xs, data.ys, data.knobs.hints
    (s1, s2), (lr1, lr2) = h.lr_symbols, h.learning_rates
    cols = len(data.lengths)
    html = make_subplots(rows=1, cols=cols, subplot_titles=data.titles, shared_yaxes=True)
    for k, m in enumerate(data.lengths, start=1):
        z = [[None] * len(xs) for _ in ys]
        text = [[""] * len(xs) for _ in ys]
        who = [[""] * len(xs) for _ in ys]
        for (j, i), t in data.cells[m].items():
            z[j][i] = t.value
            text[j][i] = f"{t.value:.3f}" + ("*" if t.stopped_early else "")
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
            name=f"{h.length_symbol}={m}",
            xgap=2,
            ygap=2,
        )
        html.add_trace(heat, 1, k)
    html.update_xaxes(type="category", title_text=f"{s1} ({lr1})")
    html.update_yaxes(type="category")
    html.update_yaxes(title_text=f"{s2} ({lr2})", col=1)
    html.update_layout(
        title=title + (" (* stopped early: low fidelity)" if data.any_stopped else ""),
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
    ax.set_title(title, fontsize=10)
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
    html.update_layout(title=title.replace("\n", " "), yaxis_title=_metric_label(search))
    return html
