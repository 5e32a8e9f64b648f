"""The report's figures, in the report's order: name -> (what it shows, how it is drawn).

Every drawing function takes the :class:`~raypeft.reporting.load.Search` (``learning_curves``
also takes ``top``) and returns a :class:`~raypeft.reporting.drawing.Figures` pair or raises
:class:`~raypeft.reporting.drawing.Skip`.
"""

from __future__ import annotations

from collections.abc import Callable

from raypeft.reporting.curves import learning_curves
from raypeft.reporting.drawing import Figures
from raypeft.reporting.method_figures import budget_m_r, captions, lr_heatmap
from raypeft.reporting.param_importance import importances
from raypeft.reporting.pareto import objectives_pareto, params_pareto

# the method figures, in the words of the method that declares them (DePT's α1 × α2, m, r)
HEATMAP_CAPTION, BUDGET_CAPTION = captions()

# name -> (what it shows, how it is drawn); the order is the report's
FIGURES: dict[str, tuple[str, Callable[..., Figures]]] = {
    "lr_heatmap": (HEATMAP_CAPTION, lr_heatmap),
    "budget_m_r": (BUDGET_CAPTION, budget_m_r),
    "params_pareto": ("score vs trainable parameters per method, Pareto front", params_pareto),
    "objectives_pareto": ("the search's two objectives, Pareto front", objectives_pareto),
    "learning_curves": ("validation score vs step of the top trials", learning_curves),
    "importances": ("importance of each searched key (fANOVA)", importances),
}
