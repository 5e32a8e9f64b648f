"""``raypeft report``: figures, a per-trial table and a summary of one finished search.

Everything is read back from MLflow (the parent run of a search and its nested trial runs,
see :mod:`raypeft.tracking.callback`), never from Ray's result folders. Each figure is written
twice:
a static PNG (matplotlib, Agg canvas) and an interactive HTML page (plotly). A figure the data
cannot support (no DePT trials, a single trial, ...) is skipped with a one-line reason instead
of being drawn empty; a report never fails because of one figure.

The pipeline, one module a step (the command, :mod:`raypeft.cli.report`, runs it):

- :mod:`~raypeft.reporting.load`: :func:`load_search` reads the search into plain data
  (:class:`Search` with one :class:`TrialRecord` per trial; metric histories on demand).
- the figures, each ``Search -> Figures`` or :class:`Skip` with the reason:
  :mod:`~raypeft.reporting.drawing` (what they share: :class:`Figures`, :class:`Skip`, the
  Agg canvas, the palette), :mod:`~raypeft.reporting.method_figures` (the figures a method
  asks for through its figure hints: DePT's α1 × α2 heat map and score vs (m, r)),
  :mod:`~raypeft.reporting.pareto` (score vs trainable parameters, the two
  objectives), :mod:`~raypeft.reporting.curves` (learning curves) and
  :mod:`~raypeft.reporting.param_importance` (fANOVA importances); their order and captions
  are :data:`FIGURES` in :mod:`~raypeft.reporting.figures`.
- :mod:`~raypeft.reporting.output`: :func:`write_report` writes the PNG/HTML pages (sharing
  one ``plotly.min.js`` in the folder by default), ``report.html`` (every HTML figure, plotly.js
  inlined: opens alone), ``trials.csv`` and ``summary.md``; :func:`log_report` logs the folder
  to the parent run, ``report.html`` in place of the per-figure pages.
"""

from __future__ import annotations

from raypeft.reporting.curves import learning_curves
from raypeft.reporting.drawing import PALETTE, Figures, Skip
from raypeft.reporting.figures import FIGURES
from raypeft.reporting.load import Search, TrialRecord, load_search
from raypeft.reporting.method_figures import STOPPED_NOTE, budget_m_r, lr_heatmap
from raypeft.reporting.output import (
    EFFICIENCY_METRICS,
    PLOTLY_BUNDLE,
    PLOTLY_JS,
    REPORT_ARTIFACTS,
    REPORT_PAGE,
    Report,
    log_report,
    logged_files,
    summary_markdown,
    trials_table,
    write_report,
    write_trials_csv,
)
from raypeft.reporting.param_importance import importances
from raypeft.reporting.pareto import objectives_pareto, params_pareto, pareto_front

__all__ = [
    "EFFICIENCY_METRICS",
    "FIGURES",
    "PALETTE",
    "PLOTLY_BUNDLE",
    "PLOTLY_JS",
    "REPORT_ARTIFACTS",
    "REPORT_PAGE",
    "STOPPED_NOTE",
    "Figures",
    "Report",
    "Search",
    "Skip",
    "TrialRecord",
    "budget_m_r",
    "importances",
    "learning_curves",
    "load_search",
    "log_report",
    "logged_files",
    "lr_heatmap",
    "objectives_pareto",
    "params_pareto",
    "pareto_front",
    "summary_markdown",
    "trials_table",
    "write_report",
    "write_trials_csv",
]
