"""``raypeft report``: figures, a per-trial table and a summary of one finished search.

Everything is read back from MLflow (the parent run of a search and its nested trial runs,
see :mod:`raypeft.tracking`), never from Ray's result folders. Each figure is written twice:
a static PNG (matplotlib, Agg canvas) and an interactive HTML page (plotly). A figure the data
cannot support (no DePT trials, a single trial, ...) is skipped with a one-line reason instead
of being drawn empty; a report never fails because of one figure.
"""

from __future__ import annotations

import ast
import csv
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import plotly.graph_objects as go
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from mlflow.entities import Run
from mlflow.tracking import MlflowClient
from plotly.subplots import make_subplots

from raypeft.config import SPACE_KINDS, ConfigError
from raypeft.runs import (
    ROLE_TAG,
    TRIAL_ID_TAG,
    check_store,
    find_experiment,
    get_run,
    latest_parent_run,
    tracking_uri,
    trial_runs,
)

REPORT_ARTIFACTS = "report"  # where the folder goes among the parent run's artefacts
DEPT = "dept"
LR_PROMPT, LR_LOWRANK, PROMPT_LENGTH = (
    "method.lr_prompt",
    "method.lr_lowrank",
    "method.prompt_length",
)
# what a trial costs, next to what it scored (blank in the table when a run lacks one)
EFFICIENCY_METRICS = (
    "train_samples_per_s",
    "eval_samples_per_s",
    "trainable_params",
    "peak_memory_mb",
    "wall_time_s",
)
# tab10: the same colour for a method in the PNG and in the HTML
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2"]
STOPPED_NOTE = "* / hatched: best trial of the cell was stopped early (low-fidelity value)"


# ---------------------------------------------------------------------------------------------
# Reading a search back


@dataclass
class TrialRecord:
    """One trial run: its tags, params (MLflow's strings) and latest metric values."""

    run_id: str
    trial_id: str
    method: str
    status: str
    stopped_early: bool | None
    params: dict[str, str]
    metrics: dict[str, float]
    error: str = ""
    value: float | None = None  # best_val_<metric>: what the search ranked trials by

    def num(self, key: str) -> float | None:
        """The param ``key`` as a number (None when absent or not numeric)."""
        return _number(self.params.get(key))

    @property
    def label(self) -> str:
        return f"{self.trial_id} ({self.method})"


@dataclass
class Search:
    """A search (parent run) of an experiment, with its trials and what it optimised."""

    client: MlflowClient
    experiment: str
    parent: Run
    metric: str | None
    mode: str  # "max" or "min"
    space: dict[str, dict | None]  # searched key -> {kind: args}, None when unreadable
    trials: list[TrialRecord]
    objectives: list[tuple[str, str]] = field(default_factory=list)
    objectives_problem: str = ""  # why a present raypeft.objectives tag was unusable

    @property
    def parent_id(self) -> str:
        return self.parent.info.run_id

    @property
    def value_key(self) -> str:
        return f"best_val_{self.metric}" if self.metric else "best_val"

    def ranked(self, trials: list[TrialRecord] | None = None) -> list[TrialRecord]:
        """Trials with a score, best first (ties broken by trial id, for stable output)."""
        scored = [t for t in (self.trials if trials is None else trials) if t.value is not None]
        sign = -1 if self.mode == "max" else 1
        return sorted(scored, key=lambda t: (sign * t.value, t.trial_id))


def load_search(uri: str | None, experiment: str, run_id: str | None = None) -> Search:
    """Read a search from MLflow: ``run_id``'s, else the experiment's newest finished one."""
    uri = tracking_uri(uri)
    check_store(uri)  # reading must never create an empty store
    client = MlflowClient(tracking_uri=uri)
    found = find_experiment(client, experiment)
    if run_id:
        parent = get_run(client, run_id)
        if (
            parent.info.experiment_id != found.experiment_id
            or parent.data.tags.get(ROLE_TAG) != "experiment"
        ):
            raise ConfigError(
                f"run {run_id!r}: not a search (parent run) of experiment {found.name!r}"
            )
    else:
        parent = latest_parent_run(client, found)
    trials = [_trial(run) for run in trial_runs(client, found.experiment_id, parent.info.run_id)]
    metric, mode = _metric_and_mode(parent, trials)
    for t in trials:
        value = t.metrics.get(f"best_val_{metric}")
        t.value = value if value is not None and math.isfinite(value) else None
    space = {
        key[len("space.") :]: _space_entry(text)
        for key, text in sorted(parent.data.params.items())
        if key.startswith("space.") and not key.startswith("space.derived.")
    }
    objectives, problem = _objectives(parent.data.tags.get("raypeft.objectives"))
    return Search(client, found.name, parent, metric, mode, space, trials, objectives, problem)


def _trial(run: Run) -> TrialRecord:
    tags = run.data.tags
    stopped = tags.get("raypeft.stopped_early")
    return TrialRecord(
        run_id=run.info.run_id,
        trial_id=tags.get(TRIAL_ID_TAG, run.info.run_id[:8]),
        method=tags.get("raypeft.method") or run.data.params.get("method.name", "?"),
        status=run.info.status,
        stopped_early=None if stopped is None else stopped.lower() == "true",
        params=dict(run.data.params),
        metrics=dict(run.data.metrics),
        error=tags.get("raypeft.error", ""),
    )


def _metric_and_mode(parent: Run, trials: list[TrialRecord]) -> tuple[str | None, str]:
    """The searched metric: the parent's tag, else its experiment file, else the trials'."""
    tags, params = parent.data.tags, parent.data.params
    metric = tags.get("raypeft.metric") or _given(params.get("search.metric"))
    if not metric:  # older runs: whatever best_val_* the trials logged, loss last
        found = sorted({k[9:] for t in trials for k in t.metrics if k.startswith("best_val_")})
        metric = next(iter([m for m in found if m != "loss"] + found), None)
    default = "min" if metric and metric.endswith("loss") else "max"
    mode = tags.get("raypeft.mode") or _given(params.get("search.mode")) or default
    return metric, mode


def _given(text: str | None) -> str | None:
    return None if text in (None, "", "None", "null") else text


def _parse(text: str | None) -> Any:
    """A param written as JSON or as a Python repr (older runs), else None."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None


def _space_entry(text: str) -> dict | None:
    """``{'grid': [0.3, 0.5]}`` -> that dict; None unless it has exactly one known kind."""
    entry = _parse(text)
    if isinstance(entry, dict) and len(set(entry) & SPACE_KINDS) == 1:
        return entry
    return None


def _objectives(text: str | None) -> tuple[list[tuple[str, str]], str]:
    """``raypeft.objectives``: ``[{"metric": m, "mode": "max"}, ...]`` (or a list of names)."""
    if not text:
        return [], ""
    items = _parse(text)
    out = []
    for item in items if isinstance(items, list) else [None]:
        if isinstance(item, str):
            item = {"metric": item}
        if not isinstance(item, dict) or not isinstance(item.get("metric"), str):
            return [], f"the parent's raypeft.objectives tag is unreadable: {text[:80]}"
        default = "min" if item["metric"].endswith("loss") else "max"
        out.append((item["metric"], str(item.get("mode") or default)))
    return out, ""


def _number(text: Any) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


# ---------------------------------------------------------------------------------------------
# Figures: each returns a Figures pair or raises Skip with the reason


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
    norm = Normalize(lo, hi if hi > lo else lo + 1e-9)
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
    png.colorbar(image, ax=list(axes), label=_metric_label(search))
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


def pareto_front(points: list[tuple[float, float]], modes: tuple[str, str]) -> list[int]:
    """Indices of the points no other point beats on both objectives, by the first objective."""
    signed = [tuple(v if m == "min" else -v for v, m in zip(p, modes, strict=True)) for p in points]
    front, best_second = [], math.inf
    for i in sorted(range(len(points)), key=lambda i: signed[i]):
        if signed[i][1] < best_second:
            front.append(i)
            best_second = signed[i][1]
    return front


def _pareto_figures(
    trials: list[TrialRecord],
    points: list[tuple[float, float]],
    modes: tuple[str, str],
    labels: tuple[str, str],
    title: str,
) -> Figures:
    """Scatter coloured per method with the Pareto front as a step line (PNG and HTML)."""
    front = sorted(pareto_front(points, modes), key=lambda i: points[i][0])
    methods = sorted({t.method for t in trials})
    colour = {m: PALETTE[i % len(PALETTE)] for i, m in enumerate(methods)}
    xs = [p[0] for p in points]
    log_x = min(xs) > 0 and max(xs) / min(xs) > 20
    # the staircase bounds what the front dominates: flat to the next point when a smaller x
    # is better (hv), flat from the previous point when a larger x is (vh)
    post = modes[0] == "min"

    png = _mpl(6.5, 4.2)
    ax = png.subplots()
    for m in methods:
        idx = [i for i, t in enumerate(trials) if t.method == m]
        ax.scatter([xs[i] for i in idx], [points[i][1] for i in idx], color=colour[m], label=m)
    ax.step(
        [points[i][0] for i in front],
        [points[i][1] for i in front],
        where="post" if post else "pre",
        color="black",
        lw=1.2,
        marker="o",
        ms=11,
        mfc="none",  # a ring around each front point: visible even for a one-point front
        label="Pareto front",
    )
    if log_x:
        ax.set_xscale("log")
    ax.set_xlabel(labels[0])
    ax.set_ylabel(labels[1])
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)

    html = go.Figure()
    for m in methods:
        idx = [i for i, t in enumerate(trials) if t.method == m]
        html.add_trace(
            go.Scatter(
                x=[xs[i] for i in idx],
                y=[points[i][1] for i in idx],
                text=[trials[i].label for i in idx],
                mode="markers",
                name=m,
                marker={"color": colour[m], "size": 9},
            )
        )
    html.add_trace(
        go.Scatter(
            x=[points[i][0] for i in front],
            y=[points[i][1] for i in front],
            text=[trials[i].label for i in front],
            mode="lines+markers",
            line={"shape": "hv" if post else "vh", "color": "black"},
            marker={"symbol": "circle-open", "size": 14, "color": "black"},
            name="Pareto front",
        )
    )
    html.update_layout(title=title, xaxis_title=labels[0], yaxis_title=labels[1])
    if log_x:
        html.update_xaxes(type="log")
    return Figures(png, html, f"{len(front)} trial(s) on the front")


def _trainable(t: TrialRecord) -> float | None:
    found = t.num("derived.trainable_params")
    return found if found is not None else t.metrics.get("trainable_params")


def params_pareto(search: Search) -> Figures:
    """Score vs trainable parameters, one colour per method, with the Pareto front."""
    trials = [t for t in search.ranked() if _trainable(t) is not None]
    if not trials:
        raise Skip("no finished trial records its trainable parameters")
    points = [(_trainable(t), t.value) for t in trials]
    title = f"{search.metric} vs trainable parameters (front: fewer parameters, better score)"
    labels = ("trainable parameters (derived.trainable_params)", _metric_label(search))
    return _pareto_figures(trials, points, ("min", search.mode), labels, title)


def _objective_value(t: TrialRecord, name: str) -> float | None:
    """A trial's value of an objective: its best validation score, else its latest metric."""
    best = f"best_{name}" if name.startswith("val_") else f"best_val_{name}"
    for key in (best, name):
        if key in t.metrics and math.isfinite(t.metrics[key]):
            return t.metrics[key]
    found = t.num(f"derived.{name}")
    return found if found is not None else t.num(name)


def objectives_pareto(search: Search) -> Figures:
    """The two objectives of a multi-objective search, with their Pareto front."""
    if search.objectives_problem:
        raise Skip(search.objectives_problem)
    if len(search.objectives) < 2:
        raise Skip("single-objective search (no raypeft.objectives tag listing two objectives)")
    (a, mode_a), (b, mode_b) = search.objectives[:2]
    trials = [
        t for t in search.ranked() if None not in (_objective_value(t, a), _objective_value(t, b))
    ]
    if not trials:
        raise Skip(f"no finished trial records both objectives {a} and {b}")
    points = [(_objective_value(t, a), _objective_value(t, b)) for t in trials]
    labels = (f"{a} ({mode_a})", f"{b} ({mode_b})")
    return _pareto_figures(trials, points, (mode_a, mode_b), labels, f"objectives: {a} vs {b}")


def learning_curves(search: Search, top: int) -> Figures:
    """Validation score vs training step of the ``top`` best trials."""
    key = f"val_{search.metric}"
    curves = []
    for t in search.ranked()[:top]:
        history = sorted(search.client.get_metric_history(t.run_id, key), key=lambda m: m.step)
        if history:
            curves.append((t, [m.step for m in history], [m.value for m in history]))
    if not curves:
        raise Skip(f"no finished trial logged {key}")
    title = f"validation {search.metric} of the top {len(curves)} trial(s) (dashed: stopped early)"

    png = _mpl(6.5, 4.2)
    ax = png.subplots()
    html = go.Figure()
    for k, (t, steps, values) in enumerate(curves):
        colour = PALETTE[k % len(PALETTE)]
        dash = "--" if t.stopped_early else "-"
        name = f"{t.label} {t.value:.4f}"
        ax.plot(steps, values, dash, marker="o", ms=3, color=colour, label=name)
        html.add_trace(
            go.Scatter(
                x=steps,
                y=values,
                mode="lines+markers",
                name=name,
                line={"color": colour, "dash": "dash" if t.stopped_early else "solid"},
            )
        )
    ax.set_xlabel("training step")
    ax.set_ylabel(key)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)
    html.update_layout(title=title, xaxis_title="training step", yaxis_title=key)
    return Figures(png, html)


def importances(search: Search) -> Figures:
    """fANOVA importance of each searched key for the score (an in-memory Optuna study)."""
    import optuna

    trials = search.ranked()
    if len(trials) < 2:
        raise Skip(f"needs at least 2 finished trials (has {len(trials)})")
    if len({t.value for t in trials}) < 2:
        raise Skip("every finished trial has the same score")
    dropped, dists, values = [], {}, {}
    for key, entry in search.space.items():
        texts = [t.params.get(key) for t in trials]
        if any(text is None for text in texts):
            # fANOVA needs every key in every trial: conditional keys (methods.X.*) are not
            dropped.append(f"{key} (not in every trial)")
            continue
        if len(set(texts)) < 2:
            dropped.append(f"{key} (one value)")
            continue
        dists[key], values[key] = _distribution(entry, texts)
    if not dists:
        raise Skip("no searched key varies across the finished trials")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize" if search.mode == "max" else "minimize")
    for n, t in enumerate(trials):
        params = {key: values[key][n] for key in dists}
        study.add_trial(
            optuna.trial.create_trial(params=params, distributions=dists, value=t.value)
        )
    # fANOVA (seeded: the same report twice gives the same numbers) rather than Optuna 5's
    # default PED-ANOVA, which needs many trials in its top quantile to say anything
    scores = optuna.importance.get_param_importances(
        study, evaluator=optuna.importance.FanovaImportanceEvaluator(seed=0), params=list(dists)
    )
    keys = sorted(scores, key=scores.get)  # least important first: barh draws bottom-up
    note = "not assessed: " + ", ".join(dropped) if dropped else ""
    title = f"importance for {_metric_label(search)} (fANOVA over {len(trials)} trials)"

    png = _mpl(6.5, 1.6 + 0.45 * len(keys))
    ax = png.subplots()
    ax.barh(keys, [scores[k] for k in keys], color=PALETTE[0])
    for y, k in enumerate(keys):
        ax.text(scores[k], y, f" {scores[k]:.2f}", va="center", fontsize=8)
    ax.set_xlim(0, max(1.0, max(scores.values()) * 1.15))
    ax.set_xlabel("importance (normalised to sum 1)")
    ax.set_title(title, fontsize=10)
    if note:
        png.supxlabel(note, fontsize=7)

    html = go.Figure(
        go.Bar(
            x=[scores[k] for k in keys],
            y=keys,
            orientation="h",
            name="importance",
            text=[f"{scores[k]:.2f}" for k in keys],
        )
    )
    html.update_layout(title=title + (f"<br><sup>{note}</sup>" if note else ""))
    return Figures(png, html, note)


def _distribution(entry: dict | None, texts: list[str]):
    """Optuna distribution of a searched key and the trials' values in it.

    Built from the space entry (grid/choice -> categorical, uniform/loguniform -> float,
    int -> int), widened to the observed values so a trial is never rejected; an unreadable
    entry falls back to a categorical of the values seen.
    """
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    kind = next(iter(set(entry) & SPACE_KINDS)) if entry else None
    numbers = [_number(x) for x in texts]
    numeric = None not in numbers
    if kind in ("uniform", "loguniform", "int") and numeric:
        low, high = (float(v) for v in entry[kind])
        low, high = min(low, *numbers), max(high, *numbers)
        if kind == "int":
            step = int(entry.get("step", 1))
            ints = [int(round(v)) for v in numbers]
            if any((v - int(low)) % step for v in ints) or (int(high) - int(low)) % step:
                step = 1  # values off the declared lattice: keep them, drop the step
            return IntDistribution(int(low), int(high), step=step), ints
        return FloatDistribution(low, high, log=kind == "loguniform" and low > 0), numbers
    declared = entry.get(kind) if kind in ("grid", "choice") else None
    choices = [_choice(c) for c in declared] if isinstance(declared, list) else []
    values = []
    for text, number in zip(texts, numbers, strict=True):
        match = next(
            (c for c in choices if str(c) == text or (number is not None and _number(c) == number)),
            None,
        )
        if match is None:  # a value the entry does not list (or no readable entry)
            match = text
            choices.append(text)
        values.append(match)
    return CategoricalDistribution(choices), values


def _choice(value: Any) -> Any:
    """Optuna's categorical choices must be scalars: lists and dicts become their JSON."""
    ok = value is None or isinstance(value, (bool, int, float, str))
    return value if ok else json.dumps(value)


# name -> (what it shows, how it is drawn); the order is the report's
FIGURES: dict[str, tuple[str, Callable[..., Figures]]] = {
    "lr_heatmap": ("DePT α1 × α2 heat map, one panel per prompt length m", lr_heatmap),
    "budget_m_r": ("DePT score vs (m, r) at the fixed budget", budget_m_r),
    "params_pareto": ("score vs trainable parameters per method, Pareto front", params_pareto),
    "objectives_pareto": ("the search's two objectives, Pareto front", objectives_pareto),
    "learning_curves": ("validation score vs step of the top trials", learning_curves),
    "importances": ("importance of each searched key (fANOVA)", importances),
}


# ---------------------------------------------------------------------------------------------
# Writing the report


@dataclass
class Report:
    folder: Path
    written: dict[str, str]  # figure -> note
    skipped: dict[str, str]  # figure -> reason


def write_report(search: Search, out: Path, top: int = 5, plotly_js: str | bool = True) -> Report:
    """Write every figure (PNG + HTML), ``trials.csv`` and ``summary.md`` into ``out``.

    ``plotly_js``: True embeds plotly.js in each HTML page (self-contained, opens offline and
    in the MLflow UI; ~5 MB a page), "cdn" links it instead.
    """
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out}: exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    report = Report(out, {}, {})
    for name, (_, draw) in FIGURES.items():
        for stale in (out / f"{name}.png", out / f"{name}.html"):
            stale.unlink(missing_ok=True)  # a skipped figure must not leave an old file behind
        try:
            if search.metric is None:
                raise Skip("no trial reported a validation metric")
            figs = draw(search, top) if name == "learning_curves" else draw(search)
        except Skip as why:
            report.skipped[name] = str(why)
            continue
        except Exception as exc:  # noqa: BLE001 - one figure must never sink the report
            report.skipped[name] = f"failed: {type(exc).__name__}: {exc}".splitlines()[0]
            continue
        figs.png.savefig(out / f"{name}.png", dpi=120)
        figs.html.write_html(out / f"{name}.html", include_plotlyjs=plotly_js)
        report.written[name] = figs.note
    write_trials_csv(search, out / "trials.csv")
    (out / "summary.md").write_text(summary_markdown(search, report, top))
    return report


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def trials_table(search: Search) -> tuple[list[str], list[list[str]]]:
    """Header and rows of ``trials.csv``: one row per trial, scored ones best first."""
    searched = list(search.space)
    derived = sorted({k for t in search.trials for k in t.params if k.startswith("derived.")})
    val = f"val_{search.metric}"
    header = [
        "run_id",
        "trial_id",
        "method",
        "status",
        "stopped_early",
        *searched,
        *derived,
        search.value_key,
        val,
        *EFFICIENCY_METRICS,
        "error",
    ]
    ranked = search.ranked()
    rest = sorted((t for t in search.trials if t.value is None), key=lambda t: t.trial_id)
    rows = []
    for t in ranked + rest:
        stopped = "" if t.stopped_early is None else str(t.stopped_early).lower()
        rows.append(
            [t.run_id, t.trial_id, t.method, t.status, stopped]
            + [t.params.get(k, "") for k in searched + derived]
            + [_cell(t.value), _cell(t.metrics.get(val))]
            + [_cell(t.metrics.get(k)) for k in EFFICIENCY_METRICS]
            + [t.error]
        )
    return header, rows


def write_trials_csv(search: Search, path: Path) -> None:
    header, rows = trials_table(search)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)


def summary_markdown(search: Search, report: Report, top: int) -> str:
    """A short markdown page: the search, its top trials, the figures written or skipped."""
    ranked = search.ranked()
    failed = sum(t.status == "FAILED" for t in search.trials)
    stopped = sum(bool(t.stopped_early) for t in search.trials)
    lines = [
        f"# Search report: {search.experiment}",
        "",
        f"- parent run: `{search.parent_id}` ({search.parent.info.status})",
        f"- metric: validation {search.metric} ({search.mode}); trials ranked by "
        f"`{search.value_key}`",
        f"- trials: {len(search.trials)} ({len(ranked)} scored, {stopped} stopped early, "
        f"{failed} failed); one row each in `trials.csv`",
    ]
    if ranked:
        lines.append(
            f"- best trial: {ranked[0].label}, run `{ranked[0].run_id}`: {ranked[0].value:.4f}"
        )
        keys = [k for k in search.space if any(k in t.params for t in ranked)]
        lines += [
            "",
            f"## Top {min(top, len(ranked))} trials",
            "",
            "| # | trial | method | "
            + " | ".join([search.value_key, "stopped early", *keys])
            + " |",
            "|---" * (5 + len(keys)) + "|",
        ]
        for n, t in enumerate(ranked[:top], start=1):
            cells = [
                str(n),
                t.trial_id,
                t.method,
                f"{t.value:.4f}",
                "yes" if t.stopped_early else "no",
            ]
            cells += [t.params.get(k, "") for k in keys]
            lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "## Figures", ""]
    for name, (what, _) in FIGURES.items():
        if name in report.written:
            note = f" ({report.written[name]})" if report.written[name] else ""
            lines.append(f"- `{name}.png`, `{name}.html`: {what}{note}")
        else:
            lines.append(f"- {name}: skipped: {report.skipped.get(name, 'not drawn')}")
    return "\n".join(lines) + "\n"


def log_report(search: Search, folder: Path) -> str:
    """Log the report folder as the parent run's ``report/`` artefacts; returns their URI."""
    search.client.log_artifacts(search.parent_id, str(folder), artifact_path=REPORT_ARTIFACTS)
    return f"{search.parent.info.artifact_uri.rstrip('/')}/{REPORT_ARTIFACTS}"
