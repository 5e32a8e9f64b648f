"""raypeft's own searches replayed on the same tables, draws and budgets as syne-tune's.

The shipped ``search_spaces/dept.yaml`` search, and the two settings syne-tune's simulator
can express as well (random search, and random search under ASHA with the same grace period,
reduction factor, metric and concurrency), are replayed by ``raypeft simulate``'s machinery
(:mod:`raypeft.search.simulate`: the Optuna searcher and Ray Tune scheduler objects ``raypeft
tune`` builds). Replay ``i`` is raypeft's replay ``i`` at ``--seed 0``: the same common and
held-out seed as syne-tune's replay ``i`` (:class:`benchmarks.synetune.curves.Draw`).
"""

from __future__ import annotations

import random
from pathlib import Path

from benchmarks.common.paths import SHIPPED_SEARCH
from raypeft.config.loading import load_experiment, validate_experiment
from raypeft.config.schema import ExperimentConfig
from raypeft.search.simulate.plan import configurations_of, fixed_values, replay_config
from raypeft.search.simulate.replay import draw_seeds, replay_search
from raypeft.search.simulate.runs import full_grid, with_sampler_seed
from raypeft.search.simulate.scores import Quality, chosen_configuration
from raypeft.search.simulate.table import CurveTable

CROSS_CHECK_SAMPLES = {"raypeft-random": 24, "raypeft-random-asha": 144}  # past 0.3 of the grid


def search_for(method: str) -> ExperimentConfig:
    """The search file ``method`` names: the shipped one, or a cross-check setting on its
    data with every key drawn at random (a repeated configuration trains again, as it does
    in syne-tune's random search)."""
    shipped = load_experiment(Path(SHIPPED_SEARCH))
    if method == "raypeft-shipped":
        return shipped
    data = shipped.model_dump(mode="json")
    data["space"] = {k: {"choice": e.listed()} for k, e in shipped.space.items()}
    scheduler = {"type": "none"}
    if method == "raypeft-random-asha":
        scheduler = {"type": "asha", "grace_period": 1, "reduction_factor": 3,
                     "metric": "val_loss"}  # fmt: skip
    data["search"] = {
        "sampler": "random",
        "seed": 0,
        "num_samples": CROSS_CHECK_SAMPLES[method],
        "answer_repeats": False,
        "scheduler": scheduler,
    }
    data["name"] = method
    return validate_experiment(data, method)


METHODS = ("raypeft-shipped", "raypeft-random", "raypeft-random-asha")


def replay(table: CurveTable, method: str, index: int, workers: int) -> list[tuple]:
    """Replay ``index`` of ``method``: (steps fraction, ended_s, held-out regret, in-sample
    regret) after each trial that ended, as ``raypeft simulate`` scores its choice."""
    cfg = replay_config(search_for(method), table, workers)
    quality = Quality.of(table, configurations_of(full_grid(cfg), table))
    spare = cfg.search.repeat_best.seeds if cfg.search.repeat_best else 0
    rng = random.Random(f"0/{index}")  # simulate(..., seed=0)'s replay ``index``
    draws = draw_seeds(table, rng, cfg.search.trial_seed, index, spare)
    result = replay_search(with_sampler_seed(cfg, cfg.search.seed + index), table, draws, workers)
    fixed = fixed_values(cfg, table)
    grid_steps = len(quality.means) * max(c.steps[-1] for c in table.curves)
    points, spent = [], 0
    for k, trial in enumerate(result.trials):
        spent += int(trial.metrics.get("step", 0))
        chosen = chosen_configuration(result.choose(result.trials[: k + 1]), cfg.space, fixed)
        if chosen is not None:
            points.append((spent / grid_steps, result.ended_s[k],
                           quality.heldout_regret(chosen, draws.heldout),
                           quality.regret(chosen)))  # fmt: skip
    return points
