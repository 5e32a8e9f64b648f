"""DePT figures: the α1 × α2 learning-rate heat map and the score vs (m, r) at a fixed budget.

Both use the finished DePT trials only (``method.name = dept`` with a prompt length m); r is
the low-rank rank the budget derived for m (``derived.rank``, else ``method.rank``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import plotly.graph_objects as go
from matplotlib.colors import Normalize
from matplotlib.patches import Rectangle
from plotly.subplots import make_subplots

from raypeft.reporting.drawing import PALETTE, Figures, Skip, _fmt, _metric_label, _mpl
from raypeft.reporting.load import Search, TrialRecord, _given

DEPT = "dept"
LR_PROMPT, LR_LOWRANK, PROMPT_LENGTH = (
    "method.lr_prompt",
    "method.lr_lowrank",
    "method.prompt_length",
)
STOPPED_NOTE = "* / hatched: best trial of the cell was stopped early (low-fidelity value)"


def _dept(search: Search) -> list[TrialRecord]:
    """Finished DePT trials with a prompt length, best first."""
    return [t for t in search.ranked() if t.method == DEPT and t.num(PROMPT_LENGTH) is not None]


def _rank_r(trial: TrialRecord) -> str:
    r = trial.num("derived.rank")
    r = r if r is not None else trial.num("method.rank")
    return "?" if r is None else _fmt(r)


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


def lr_heatmap(search: Search) -> Figures:
    """DePT: best score per (α1, α2) cell, one panel per prompt length m."""
    trials = [t for t in _dept(search) if None not in (t.num(LR_PROMPT), t.num(LR_LOWRANK))]
    if not trials:
        raise Skip(f"no finished DePT trial with {LR_PROMPT} and {LR_LOWRANK}")
    xs, x_of = _axis([t.num(LR_PROMPT) for t in trials])
    ys, y_of = _axis([t.num(LR_LOWRANK) for t in trials])
    if len(xs) * len(ys) < 2:
        raise Skip("α1 and α2 take one value each: nothing to map")
    ms = sorted({int(t.num(PROMPT_LENGTH)) for t in trials})
    cells: dict[int, dict[tuple[int, int], TrialRecord]] = {m: {} for m in ms}
    for t in trials:  # best first, so the first trial of a cell is its best
        key = (y_of(t.num(LR_LOWRANK)), x_of(t.num(LR_PROMPT)))
        cells[int(t.num(PROMPT_LENGTH))].setdefault(key, t)
    values = [t.value for t in trials]
    lo, hi = min(values), max(values)
    if hi - lo < 1e-9:  # every cell ties: a small band around it, not a degenerate scale
        pad = max(abs(lo) * 0.01, 1e-3)
        lo, hi = lo - pad, hi + pad
    norm = Normalize(lo, hi)
    cmap = "viridis" if search.mode == "max" else "viridis_r"  # bright = better either way
    titles = [f"m={m} (r={_rank_r(next(iter(cells[m].values())))})" for m in ms]
    any_stopped = any(t.stopped_early for c in cells.values() for t in c.values())
    title = f"DePT: {_metric_label(search)} per α1 × α2 cell"

    png = _mpl(1.5 + 0.9 * len(xs) * len(ms) + 0.6 * len(ms), 2.2 + 0.45 * len(ys))
    axes = png.subplots(1, len(ms), squeeze=False)[0]
    for ax, m, sub in zip(axes, ms, titles, strict=True):
        grid = np.full((len(ys), len(xs)), np.nan)
        for (j, i), t in cells[m].items():
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
        ax.set_xlabel(f"α1 ({LR_PROMPT})")
    axes[0].set_ylabel(f"α2 ({LR_LOWRANK})")
    png.colorbar(image, ax=list(axes), label=_metric_label(search), format="%.3g")
    png.suptitle(title, fontsize=11)
    if any_stopped:
        png.supxlabel(STOPPED_NOTE, fontsize=7)  # laid out below the axes, never over them

    html = make_subplots(rows=1, cols=len(ms), subplot_titles=titles, shared_yaxes=True)
    for k, m in enumerate(ms, start=1):
        z = [[None] * len(xs) for _ in ys]
        text = [[""] * len(xs) for _ in ys]
        who = [[""] * len(xs) for _ in ys]
        for (j, i), t in cells[m].items():
            z[j][i] = t.value
            text[j][i] = f"{t.value:.3f}" + ("*" if t.stopped_early else "")
            who[j][i] = t.label + (" stopped early" if t.stopped_early else "")
        html.add_trace(
            go.Heatmap(
                z=z,
                x=xs,
                y=ys,
                text=text,
                customdata=who,
                texttemplate="%{text}",
                hovertemplate="α1=%{x}<br>α2=%{y}<br>%{z:.4f} %{customdata}<extra></extra>",
                coloraxis="coloraxis",
                name=f"m={m}",
                xgap=2,
                ygap=2,
            ),
            1,
            k,
        )
    html.update_xaxes(type="category", title_text="α1 (lr_prompt)")
    html.update_yaxes(type="category")
    html.update_yaxes(title_text="α2 (lr_lowrank)", col=1)
    html.update_layout(
        title=title + (" (* stopped early: low fidelity)" if any_stopped else ""),
        coloraxis={
            "colorscale": "Viridis",
            "reversescale": search.mode == "min",
            "cmin": lo,
            "cmax": hi,
            "colorbar": {"title": {"text": search.metric}},
        },
    )
    return Figures(png, html, "cells marked * were stopped early" if any_stopped else "")


def budget_m_r(search: Search) -> Figures:
    """DePT at a fixed budget: every trial and the best per prompt length m (with its r)."""
    trials = _dept(search)
    if not trials:
        raise Skip(f"no finished DePT trial with {PROMPT_LENGTH}")
    ms = sorted({int(t.num(PROMPT_LENGTH)) for t in trials})
    best = {m: next(t for t in trials if int(t.num(PROMPT_LENGTH)) == m) for m in ms}
    ticks = [f"m={m} / r={_rank_r(best[m])}" for m in ms]
    tick_of = dict(zip(ms, ticks, strict=True))
    params = search.parent.data.params
    budget = _given(params.get("method.budget_prompt_length"))
    budget = f"PT length {budget}" if budget else _given(params.get("budget_params"))
    title = f"DePT at a fixed budget ({budget or 'not recorded'}):\n{search.metric} vs (m, r)"
    groups = {
        "trials": [t for t in trials if not t.stopped_early],
        "stopped early": [t for t in trials if t.stopped_early],
    }

    png = _mpl(max(4.5, 1.5 + 1.1 * len(ms)), 4)
    ax = png.subplots()
    x_of = {m: i for i, m in enumerate(ms)}
    for name, group in groups.items():
        if group:
            ax.scatter(
                [x_of[int(t.num(PROMPT_LENGTH))] for t in group],
                [t.value for t in group],
                facecolors="none" if name == "stopped early" else PALETTE[0],
                edgecolors=PALETTE[0],
                alpha=0.7,
                label=name,
            )
    ax.plot(range(len(ms)), [best[m].value for m in ms], "-o", color=PALETTE[1], label="best per m")
    ax.set_xticks(range(len(ms)), ticks)
    ax.set_xlim(-0.5, len(ms) - 0.5)
    ax.set_ylabel(_metric_label(search))
    ax.set_xlabel("prompt length m / derived rank r")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)

    html = go.Figure()
    for name, group in groups.items():
        if group:
            html.add_trace(
                go.Scatter(
                    x=[tick_of[int(t.num(PROMPT_LENGTH))] for t in group],
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
            name="best per m",
            line={"color": PALETTE[1]},
        )
    )
    html.update_xaxes(
        type="category", categoryorder="array", categoryarray=ticks, title_text="m / r"
    )
    html.update_layout(title=title.replace("\n", " "), yaxis_title=_metric_label(search))
    return Figures(png, html)
