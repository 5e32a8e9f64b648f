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
from dataclasses import dataclass, field
from typing import Any

from ray.tune.search import Searcher

from raypeft.search.space import REPEAT_PREFIX

REPEAT_OF = f"{REPEAT_PREFIX}of"  # the trial id a repeat re-trains


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


def top_trials(
    rows: list[tuple[str, dict, dict]], key: str, mode: str, top_k: int, max_steps: int
) -> list[tuple[str, dict, dict]]:
    """The ``top_k`` best ``(trial_id, config, metrics)`` rows by ``key``.

    Trials that ran to the end are preferred: a trial the scheduler stopped early has a
    low-fidelity score, and is only taken when too few trials finished.
    """
    sign = 1 if mode == "max" else -1
    scored = [r for r in rows if isinstance(r[2].get(key), (int, float))]
    scored.sort(key=lambda r: (r[2].get("step", 0) >= max_steps, sign * r[2][key]), reverse=True)
    return scored[:top_k]


def repeat_configs(top: list[tuple[str, dict, dict]], base_seed: int, seeds: int) -> list[dict]:
    """Tune configs of the repeats: each top config with seeds ``seed + 1 .. seed + n``."""
    out = []
    for trial_id, config, _ in top:
        seed = int(config.get("train.seed", base_seed))
        for i in range(1, seeds + 1):
            out.append({**config, "train.seed": seed + i, REPEAT_OF: trial_id})
    return out


def group_repeats(
    top: list[tuple[str, dict, dict]],
    repeats: list[tuple[str, dict, dict]],
    key: str,
    base_seed: int,
) -> list[RepeatGroup]:
    """Each top configuration with its original score and its repeats' scores, by seed."""
    groups = {}
    for trial_id, config, metrics in top:
        group = RepeatGroup(trial_id, config)
        seed = int(config.get("train.seed", base_seed))
        group.scores[seed], group.trial_ids[seed] = float(metrics[key]), trial_id
        groups[trial_id] = group
    for trial_id, config, metrics in repeats:
        group = groups.get(config.get(REPEAT_OF))
        if group is not None and isinstance(metrics.get(key), (int, float)):
            seed = int(config["train.seed"])
            group.scores[seed], group.trial_ids[seed] = float(metrics[key]), trial_id
    return list(groups.values())
