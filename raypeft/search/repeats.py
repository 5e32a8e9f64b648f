"""Repeated seeds for the best configurations (``search.repeat_best``).

A search compares configurations at one seed; the best of many noisy scores is biased
upwards. After the search, the ``top_k`` configurations are trained again with ``seeds``
other seeds (no early stopping), and the configuration with the best mean is the one the
test split scores. Each repeat is a nested MLflow run tagged ``raypeft.role=repeat`` and
``raypeft.repeat_of=<trial id>``.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ray.tune.schedulers import FIFOScheduler
from ray.tune.search import ConcurrencyLimiter, Searcher

from raypeft.config.schema import REPEAT_OF
from raypeft.search.objectives import Constraints, ResolvedObjective
from raypeft.search.results import TrialResult, trial_results
from raypeft.search.tuner import TuneRunner, max_concurrent


class FixedConfigs(Searcher):
    """A searcher that hands out a fixed list of configs, once each, then finishes."""

    def __init__(self, configs: list[dict[str, Any]], metric: str, mode: str):
        super().__init__(metric=metric, mode=mode)
        self.configs = list(configs)
        self.given = 0

    def suggest(self, trial_id: str) -> dict[str, Any] | None:
        if self.given >= len(self.configs):
            return Searcher.FINISHED
        self.given += 1
        return dict(self.configs[self.given - 1])

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False):
        pass  # nothing to learn: the configs are fixed

    def save(self, checkpoint_path: str) -> None:  # Tune snapshots searchers for resuming
        with open(checkpoint_path, "w") as f:
            json.dump({"configs": self.configs, "given": self.given}, f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path) as f:
            state = json.load(f)
        self.configs, self.given = state["configs"], state["given"]


@dataclass
class RepeatGroup:
    """One top configuration and every seed it was trained with."""

    trial_id: str  # the search's trial
    config: dict[str, Any]
    scores: dict[int, float] = field(default_factory=dict)  # seed -> best validation metric
    trial_ids: dict[int, str] = field(default_factory=dict)  # seed -> trial that trained it

    @property
    def mean(self) -> float:
        return statistics.fmean(self.scores.values()) if self.scores else math.nan

    @property
    def std(self) -> float:
        return statistics.stdev(self.scores.values()) if len(self.scores) > 1 else 0.0


def top_trials(trials: list[TrialResult], key: str, mode: str, top_k: int) -> list[TrialResult]:
    """The ``top_k`` best trials by ``key``.

    Trials that ran to the end are preferred: a trial the scheduler stopped early has a
    low-fidelity score, and is only taken when too few trials finished.
    """
    sign = 1 if mode == "max" else -1
    scored = [t for t in trials if t.has_number(key)]
    scored.sort(key=lambda t: (t.ran_to_end, sign * t.metrics[key]), reverse=True)
    return scored[:top_k]


def repeat_configs(top: list[TrialResult], base_seed: int, seeds: int) -> list[dict]:
    """Tune configs of the repeats: each top config with seeds ``seed + 1 .. seed + n``."""
    out = []
    for trial in top:
        seed = int(trial.config.get("train.seed", base_seed))
        for i in range(1, seeds + 1):
            out.append({**trial.config, "train.seed": seed + i, REPEAT_OF: trial.trial_id})
    return out


def group_repeats(
    top: list[TrialResult], repeats: list[TrialResult], key: str, base_seed: int
) -> list[RepeatGroup]:
    """Each top configuration with its original score and its repeats' scores, by seed."""
    groups = {}
    for trial in top:
        group = RepeatGroup(trial.trial_id, trial.config)
        seed = int(trial.config.get("train.seed", base_seed))
        group.scores[seed], group.trial_ids[seed] = float(trial.metrics[key]), trial.trial_id
        groups[trial.trial_id] = group
    for trial in repeats:
        group = groups.get(trial.config.get(REPEAT_OF))
        if group is not None and trial.has_number(key):
            seed = int(trial.config["train.seed"])
            group.scores[seed], group.trial_ids[seed] = float(trial.metrics[key]), trial.trial_id
    return list(groups.values())


def run_repeats(
    runner: TuneRunner,
    trials: list[TrialResult],
    primary: ResolvedObjective,
    constraints: Constraints,
    search_name: str,
    say: Callable[[str], None],
) -> list[RepeatGroup]:
    """Train the top configurations again with more seeds (``search.repeat_best``), as the
    Tune experiment ``<search_name>-repeats``; returns them grouped by configuration."""
    cfg = runner.cfg
    spec = cfg.search.repeat_best
    feasible = [t for t in trials if constraints.feasible(t.metrics)] or trials
    top = top_trials(feasible, primary.result_key, primary.mode, spec.top_k)
    configs = repeat_configs(top, cfg.train.seed, spec.seeds)
    say(f"Repeating the top {len(top)} configurations with {spec.seeds} more seeds each ...")
    results = runner.fit(
        f"{search_name}-repeats",
        lambda: ConcurrencyLimiter(
            FixedConfigs(configs, primary.result_key, primary.mode),
            max_concurrent=max_concurrent(cfg),
        ),
        FIFOScheduler,  # repeats run to the end: their scores are compared as means
        len(configs),
    )
    runner.tracker.collect_results(results, repeats=True)
    return group_repeats(top, trial_results(results), primary.result_key, cfg.train.seed)
