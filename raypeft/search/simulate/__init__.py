"""Replaying searches against recorded learning curves (``raypeft table``, ``raypeft simulate``).

:mod:`~raypeft.search.simulate.table` reads a finished search over a discrete space back from
Optuna and MLflow as a table of learning curves; :mod:`~raypeft.search.simulate.plan` checks
a search file against a table; :mod:`~raypeft.search.simulate.replay` replays it on a
simulated clock through raypeft's own searcher and Tune's schedulers;
:mod:`~raypeft.search.simulate.runs` repeats that over replays and
:mod:`~raypeft.search.simulate.scores` scores them.
"""

from raypeft.search.simulate.plan import differences, replay_config
from raypeft.search.simulate.runs import Simulation, simulate
from raypeft.search.simulate.scores import Paired
from raypeft.search.simulate.table import CurveTable, read_table

__all__ = [
    "CurveTable",
    "Paired",
    "Simulation",
    "differences",
    "read_table",
    "replay_config",
    "simulate",
]
