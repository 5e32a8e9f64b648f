"""Parameter importances: fANOVA over the finished trials, via an in-memory Optuna study.

Optuna is imported only when the figure is drawn. Each searched key becomes an Optuna
distribution built from its space entry and widened to the values the trials actually used.
"""

from __future__ import annotations

import json
from typing import Any

import plotly.graph_objects as go

from raypeft.config.space import SPACE_KINDS
from raypeft.reporting.drawing import (
    PALETTE,
    Figures,
    Skip,
    _metric_label,
    _mpl,
    html_heading,
    png_note,
    png_title,
)
from raypeft.reporting.load import Search, _number


def importances(search: Search) -> Figures:
    """fANOVA importance of each searched key for the score (an in-memory Optuna study)."""
    # why: Optuna loads only for the importance figure
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
    png_title(png, title)
    if note:
        png_note(png, note)

    html = go.Figure(
        go.Bar(
            x=[scores[k] for k in keys],
            y=keys,
            orientation="h",
            name="importance",
            text=[f"{scores[k]:.2f}" for k in keys],
        )
    )
    html.update_layout(**html_heading(title, note))
    return Figures(png, html, note)


def _distribution(entry: dict | None, texts: list[str]):
    """Optuna distribution of a searched key and the trials' values in it.

    Built from the space entry (grid/choice -> categorical, uniform/loguniform -> float,
    int -> int), widened to the observed values so a trial is never rejected; an unreadable
    entry falls back to a categorical of the values seen.
    """
    # why: Optuna loads only for the importance figure
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
