"""Learning curves: validation score vs training step of the best trials.

The only figure that reads metric histories (:meth:`~raypeft.reporting.load.Search.history`:
one MLflow request per trial drawn).
"""

from __future__ import annotations

import plotly.graph_objects as go

from raypeft.data.metrics import format_metric
from raypeft.reporting.drawing import PALETTE, Figures, Skip, _mpl, html_heading, png_title
from raypeft.reporting.load import Search


def learning_curves(search: Search, top: int) -> Figures:
    """Validation score vs training step of the ``top`` best trials.

    A trial stopped early is drawn dashed with open markers: ASHA often stops a trial at its
    first evaluation, a single point no dash can show, so the open marker (and "stopped at
    step N" in its legend entry) is what tells it apart."""
    key = f"val_{search.metric}"
    curves = []
    for t in search.ranked()[:top]:
        steps, values = search.history(t, key)
        if steps:
            curves.append((t, steps, values))
    if not curves:
        raise Skip(f"no finished trial logged {key}")
    title = f"validation {search.metric} of the top {len(curves)} trial(s)"
    if any(t.stopped_early for t, _, _ in curves):
        title += " (dashed, open markers: stopped early)"

    png = _mpl(6.5, 4.2)
    ax = png.subplots()
    html = go.Figure()
    for k, (t, steps, values) in enumerate(curves):
        colour = PALETTE[k % len(PALETTE)]
        name = f"{t.label} {format_metric(t.value)}"
        if t.stopped_early:
            name += f", stopped at step {steps[-1]:g}"
        ax.plot(
            steps,
            values,
            "--" if t.stopped_early else "-",
            marker="o",
            ms=6 if t.stopped_early else 3,
            mfc="white" if t.stopped_early else colour,
            color=colour,
            label=name,
        )
        html.add_trace(
            go.Scatter(
                x=steps,
                y=values,
                mode="lines+markers",
                name=name,
                line={"color": colour, "dash": "dash" if t.stopped_early else "solid"},
                marker={
                    "symbol": "circle-open" if t.stopped_early else "circle",
                    "size": 10 if t.stopped_early else 6,
                    "line": {"width": 2 if t.stopped_early else 0, "color": colour},
                },
            )
        )
    ax.set_xlabel("training step")
    ax.set_ylabel(key)
    png_title(png, title)
    ax.legend(fontsize=7)
    html.update_layout(**html_heading(title), xaxis_title="training step", yaxis_title=key)
    return Figures(png, html)
