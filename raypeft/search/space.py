"""Compile the experiment's ``space`` section into an Optuna define-by-run function.

Ray Tune's ``OptunaSearch`` calls the function once per trial with an Optuna trial. Keys with
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

from raypeft.config.schema import (
    DERIVED_PREFIX,
    ChoiceParam,
    ExperimentConfig,
    GridParam,
    IntParam,
    LogUniformParam,
    SpaceParam,
    UniformParam,
    apply_trial_params,
    is_conditional,
)
from raypeft.methods import BackboneDims, MethodConfig


def suggest(trial: optuna.Trial, key: str, param: SpaceParam) -> Any:
    """Ask Optuna for one value of ``key``."""
    if isinstance(param, GridParam):
        return trial.suggest_categorical(key, param.grid)
    if isinstance(param, ChoiceParam):
        return trial.suggest_categorical(key, param.choice)
    if isinstance(param, UniformParam):
        return trial.suggest_float(key, *param.uniform)
    if isinstance(param, LogUniformParam):
        return trial.suggest_float(key, *param.loguniform, log=True)
    if isinstance(param, IntParam):
        return trial.suggest_int(key, *param.int, step=param.step)
    raise TypeError(f"unknown space entry for {key}: {param!r}")


def derived_values(cfg: ExperimentConfig, dims: BackboneDims) -> dict[str, Any]:
    """Knobs computed from a trial's config: the method's derived ones and its count."""
    method = cfg.method.resolve(dims)
    out = {f"{DERIVED_PREFIX}{k}": v for k, v in method.derived().items()}
    out[f"{DERIVED_PREFIX}trainable_params"] = method.num_params(dims)
    return out


class DefineByRun:
    """The function OptunaSearch samples a trial's hyperparameters with.

    A class rather than a closure: Tune pickles the searcher (with this) when it saves the
    experiment state for resuming.
    """

    def __init__(self, cfg: ExperimentConfig, dims: BackboneDims):
        self.cfg = cfg
        self.dims = dims

    def __call__(self, trial: optuna.Trial) -> dict[str, Any]:
        space = self.cfg.space
        params = {k: suggest(trial, k, p) for k, p in space.items() if not is_conditional(k)}
        chosen = params.get("method.name", self.cfg.method.name)
        for key, param in space.items():
            # `methods.X.knob` is sampled only in trials that chose method X
            if is_conditional(key) and key.split(".")[1] == chosen:
                params[key] = suggest(trial, key, param)
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
        param = cfg.space[key]
        if isinstance(param, GridParam):
            return param.grid
        return param.choice if isinstance(param, ChoiceParam) else None

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
