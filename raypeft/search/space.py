"""Compile the experiment's ``space`` section into an Optuna define-by-run function.

raypeft's searcher (:mod:`raypeft.search.searcher`) calls the function once per trial with an
Optuna trial. Keys with
``grid`` values form a joint grid: every combination is enqueued first (``points_to_evaluate``),
and Optuna samples the remaining keys of those trials. Derived knobs (DePT's rank at a fixed
budget) are computed from the sampled ones, never sampled, and returned as constants under
``derived.*`` so Tune, MLflow and the summary show them.
"""

from __future__ import annotations

import itertools
from typing import Any

import optuna
from pydantic import ValidationError

from raypeft.config.schema import DERIVED_PREFIX, ExperimentConfig, apply_trial_params
from raypeft.config.space import (
    is_conditional,
)
from raypeft.methods import BackboneDims, MethodConfig


def derived_values(cfg: ExperimentConfig, dims: BackboneDims) -> dict[str, Any]:
    """Knobs computed from a trial's config: the method's derived ones and its count."""
    method = cfg.method.resolve(dims)
    out = {f"{DERIVED_PREFIX}{k}": v for k, v in method.derived().items()}
    out[f"{DERIVED_PREFIX}trainable_params"] = method.num_params(dims)
    return out


class DefineByRun:
    """The function the searcher samples a trial's hyperparameters with.

    A class rather than a closure: Tune pickles the searcher (with this) when it saves the
    experiment state for resuming.
    """

    def __init__(self, cfg: ExperimentConfig, dims: BackboneDims):
        self.cfg = cfg
        self.dims = dims

    def __call__(self, trial: optuna.Trial) -> dict[str, Any]:
        space = self.cfg.space
        params = {k: p.suggest(trial, k) for k, p in space.items() if not is_conditional(k)}
        chosen = params.get("method.name", self.cfg.method.name)
        for key, param in space.items():
            # `methods.X.knob` is sampled only in trials that chose method X
            if is_conditional(key) and key.split(".")[1] == chosen:
                params[key] = param.suggest(trial, key)
        fixed = {}
        if self.cfg.search.trial_seed == "per_trial" and "train.seed" not in space:
            # a seed of its own per trial, reproducible from the Optuna trial number
            fixed["train.seed"] = self.cfg.train.seed + trial.number
        return {
            **fixed,
            **derived_values(apply_trial_params(self.cfg, {**params, **fixed}), self.dims),
        }


def candidate_methods(cfg: ExperimentConfig, limit: int = 4096) -> list[MethodConfig]:
    """Every method config the space can produce, up to continuous values.

    Categorical method knobs (grid and choice, conditional ones included) are enumerated
    jointly for each method the space can choose; continuous ones keep the file's value. The
    driver uses this to compute each distinct per-example feature (e.g. IDPG's sentence
    encodings) once, before any trial starts.
    """

    def categorical(key: str) -> list[Any] | None:
        return cfg.space[key].listed()

    names = categorical("method.name") if "method.name" in cfg.space else [None]
    methods = [cfg.method]
    for name in names:
        keys = [
            k
            for k in cfg.space
            if categorical(k) is not None
            and k != "method.name"
            and (k.startswith("method.") or (is_conditional(k) and k.split(".")[1] == name))
        ]
        fixed = {} if name is None else {"method.name": name}
        combos = itertools.product(*(categorical(k) for k in keys))
        for combo in itertools.islice(combos, limit):
            params = {**fixed, **dict(zip(keys, combo, strict=True))}
            try:
                methods.append(apply_trial_params(cfg, params).method)
            except ValidationError:
                continue  # a combination the method rejects never becomes a trial
    return methods
