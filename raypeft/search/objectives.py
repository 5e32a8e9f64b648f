"""What a search optimises: its objectives as Tune results carry them, the scheduler's own
metric, and ``search.constraints``. Names are checked against the task's metrics before
anything starts (preflight)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from raypeft.config.schema import EFFICIENCY_METRICS, Bound, ExperimentConfig
from raypeft.data.metrics import METRIC_MODE
from raypeft.errors import ConfigError
from raypeft.training.evaluation import objective_mode


@dataclass(frozen=True)
class ResolvedObjective:
    """An objective as Tune results carry it."""

    name: str  # as written in the file: accuracy, train_samples_per_s, ...
    mode: str  # max | min
    result_key: str  # best_val_accuracy (a quality metric's best so far) or the efficiency key


def result_key(name: str) -> str:
    """Efficiency figures are reported under their own name; quality metrics as the best
    validation value so far (what the kept checkpoint scored)."""
    return name if name in EFFICIENCY_METRICS else f"best_val_{name}"


def _check_name(name: str, task_metrics: tuple[str, ...], where: str) -> None:
    known = (*task_metrics, "loss", *EFFICIENCY_METRICS)
    if name not in known:
        raise ConfigError(f"{where}: {name!r} is not reported for this task; choose one of {known}")


def resolve_objectives(
    cfg: ExperimentConfig, task_metrics: tuple[str, ...]
) -> list[ResolvedObjective]:
    """The search's objectives (first one primary), checked against the task's metrics (and
    so is the scheduler's own metric, ``search.scheduler.metric``)."""
    check_scheduler_metric(cfg, task_metrics)
    out = []
    for i, objective in enumerate(cfg.search.objective_list(task_metrics[0])):
        where = f"search.objectives[{i}].metric" if cfg.search.objectives else "search.metric"
        _check_name(objective.metric, task_metrics, where)
        mode = objective_mode(objective)
        out.append(ResolvedObjective(objective.metric, mode, result_key(objective.metric)))
    return out


def scheduler_target(cfg: ExperimentConfig, key: str, mode: str) -> tuple[str, str]:
    """The result key and direction the trial scheduler compares trials on:
    ``search.scheduler.metric`` (this evaluation's value, e.g. ``val_loss``) where set, else
    the search's own (``key``, ``mode``). Names are checked by :func:`check_scheduler_metric`."""
    name = cfg.search.scheduler.metric
    if not name:
        return key, mode
    bare = name.removeprefix("val_")
    return f"val_{bare}", cfg.search.scheduler.mode or METRIC_MODE.get(bare, "max")


def check_scheduler_metric(cfg: ExperimentConfig, task_metrics: tuple[str, ...]) -> None:
    """``search.scheduler.metric`` must be a validation metric every evaluation reports."""
    name = cfg.search.scheduler.metric
    known = tuple(f"val_{m}" for m in (*task_metrics, "loss"))
    if name and f"val_{name.removeprefix('val_')}" not in known:
        raise ConfigError(
            f"search.scheduler.metric: {name!r} is not reported at each evaluation of this "
            f"task; choose one of {known}"
        )


def stops_on_objective(cfg: ExperimentConfig, primary: ResolvedObjective) -> bool:
    """Whether the trial scheduler stops trials by the primary objective itself (Optuna's
    idea of pruning: judged unpromising on the objective's intermediate values). A scheduler
    on another metric (``search.scheduler.metric: val_loss`` under accuracy) judges
    something else: the objective value such a trial's checkpoint holds is a real result."""
    if cfg.search.scheduler.type == "none":
        return False
    return scheduler_target(cfg, primary.result_key, primary.mode)[0] == primary.result_key


def resolve_constraints(cfg: ExperimentConfig, task_metrics: tuple[str, ...]) -> Constraints:
    """``search.constraints`` keyed by the Tune result key, names checked."""
    for name in cfg.search.constraints:
        _check_name(name, task_metrics, f"search.constraints.{name}")
    return Constraints({result_key(k): v for k, v in cfg.search.constraints.items()})


class Constraints:
    """``search.constraints``: a value <= 0 per bound means satisfied (Optuna's convention)."""

    def __init__(self, bounds: dict[str, Bound]):
        self.bounds = bounds

    def named_values(self, metrics: dict[str, Any]) -> dict[str, float]:
        out = {}
        for key, bound in self.bounds.items():
            value = metrics.get(key)
            if value is None or not math.isfinite(float(value)):
                value = math.nan  # never reported: not shown to satisfy anything
            if bound.max is not None:
                out[f"{key}<={bound.max:g}"] = float(value) - bound.max
            if bound.min is not None:
                out[f"{key}>={bound.min:g}"] = bound.min - float(value)
        return {k: (math.inf if math.isnan(v) else v) for k, v in out.items()}

    def feasible(self, metrics: dict[str, Any]) -> bool:
        return all(v <= 0 for v in self.named_values(metrics).values())

    def __bool__(self) -> bool:
        return bool(self.bounds)
