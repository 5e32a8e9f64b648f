"""Pareto figures: score vs trainable parameters, and the two objectives of a search.

Both scatter the finished trials (one colour per method) and draw the Pareto front as a
staircase; :func:`pareto_front` finds it. The parameters figure is skipped, with the reason,
when every trial has the same parameter budget: a DePT search at one budget spans only what
the budget leaves unused (38,144 to 38,336), which is no trade-off.
"""

from __future__ import annotations

import math

import plotly.graph_objects as go

from raypeft.reporting.drawing import (
    PALETTE,
    Figures,
    Skip,
    _metric_label,
    _mpl,
    html_heading,
    png_title,
)
from raypeft.reporting.load import Search, TrialRecord, _given

TRAINABLE_PARAM = "derived.trainable_params"  # the count each trial logs (task head excluded)
# a method's budget settings, as a trial logs them: budget_params, DePT's
# budget_prompt_length, ... (a method's budget keys start with budget_, see raypeft budget)
BUDGET_PREFIX = "method.budget_"


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
    png_title(png, title)
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
    html.update_layout(**html_heading(title), xaxis_title=labels[0], yaxis_title=labels[1])
    if log_x:
        html.update_xaxes(type="log")
    return Figures(png, html, f"{len(front)} trial(s) on the front")


def _trainable(t: TrialRecord) -> float | None:
    found = t.num(TRAINABLE_PARAM)
    return found if found is not None else t.metrics.get("trainable_params")


def _budget(t: TrialRecord) -> tuple[tuple[str, str], ...]:
    """What sets the trial's size: its method's budget settings when it has any (the trial
    logs them as ``method.budget_*``; its count then differs from another trial's at that
    budget only by what the budget leaves unused), else its trainable-parameter count."""
    given = sorted((k, v) for k, v in t.params.items() if k.startswith(BUDGET_PREFIX) and _given(v))
    return tuple(given) or ((TRAINABLE_PARAM, f"{_trainable(t):.0f}"),)


def _single_budget(trials: list[TrialRecord]) -> str | None:
    """Why a Pareto figure over parameters would show nothing, when every trial has the
    same budget (the x axis would span only the budget's slack) or the same count; None
    when there is something to trade off."""
    budgets = {_budget(t) for t in trials}
    counts = sorted({_trainable(t) for t in trials})
    if len(budgets) > 1 and len(counts) > 1:
        return None
    span = f"{counts[0]:,.0f}" + (f" to {counts[-1]:,.0f}" if len(counts) > 1 else "")
    budget = next(iter(budgets))
    if len(budgets) > 1 or budget[0][0] == TRAINABLE_PARAM:
        return f"every finished trial has {span} trainable parameters: nothing to trade off"
    settings = ", ".join(f"{k}={v}" for k, v in budget)
    return (
        f"every finished trial has the same parameter budget ({settings}; {span} trainable "
        "parameters): nothing to trade off"
    )


def params_pareto(search: Search) -> Figures:
    """Score vs trainable parameters, one colour per method, with the Pareto front; skipped
    when the trials do not differ in budget."""
    trials = [t for t in search.ranked() if _trainable(t) is not None]
    if not trials:
        raise Skip("no finished trial records its trainable parameters")
    reason = _single_budget(trials)
    if reason:
        raise Skip(reason)
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
