"""The method-settings stage: every method setting the search space can produce resolves on
the backbone. Method-specific rules are hooks on the method's config (``resolve``,
``check_backbone``, ``prompt_positions``, ``check_inputs``); nothing here knows a method."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from typing import Any

from pydantic import ValidationError

from raypeft.config.messages import format_validation_error
from raypeft.config.schema import ExperimentConfig, apply_trial_params
from raypeft.errors import ConfigError
from raypeft.methods.base import MethodConfig
from raypeft.modeling.packed import packable
from raypeft.preflight.model import CheckedModel, check_positions

# Up to this many combinations of the searched keys' values are checked one by one.
MAX_COMBINATIONS = 2000


def distinct_settings(
    cfg: ExperimentConfig, model: CheckedModel, source: str
) -> list[MethodConfig]:
    """Resolve and check each distinct method setting of the space (DePT's rank >= 1, PHM
    sizes, prompt tokens within the position embeddings, IPT's corpus, ...). A failure names
    the searched values that produce it. Returns them (each distinct setting once)."""
    checked: dict[str, MethodConfig] = {}
    for where, method in _settings(cfg, source):
        key = method.model_dump_json()
        if key in checked:
            continue
        checked[key] = method
        try:
            _check_one(method, cfg, model)
        except ValueError as exc:  # a method's own rule; a ConfigError names its key itself
            raise ConfigError(f"{source}: {where}: {exc}") from None
    return list(checked.values())


def _check_one(method: MethodConfig, cfg: ExperimentConfig, model: CheckedModel) -> None:
    resolved = method.resolve(model.dims)
    resolved.check_backbone(model.dims)
    check_positions(resolved.prompt_positions(), cfg.model, model)
    resolved.check_inputs()
    if cfg.resources.trials_per_worker > 1:
        _check_packable(resolved, model)


def _check_packable(method: MethodConfig, model: CheckedModel) -> None:
    """Packed trials (``resources.trials_per_worker > 1``) need a method that packs."""
    problem = packable(method, model.dims.kind)
    if problem is not None:
        raise ValueError(
            f"resources.trials_per_worker: method {method.name!r} cannot train in a pack on a "
            f"{model.dims.kind} backbone ({problem}); set trials_per_worker: 1"
        )


def _settings(cfg: ExperimentConfig, source: str) -> Iterator[tuple[str, MethodConfig]]:
    """``(where, method config)`` for each trial the space can produce; ``where`` names the
    searched values (``method`` when nothing is searched)."""
    for params in _trial_params(cfg) or [{}]:
        where = " ".join(f"{k}={v}" for k, v in params.items()) or "method"
        try:
            method = apply_trial_params(cfg, params).method
        except ValidationError as err:  # values that are valid alone but not together
            message = format_validation_error(err, source, ExperimentConfig)
            raise ConfigError(f"{message} [from {where}]") from None
        yield where, method


def _trial_params(cfg: ExperimentConfig) -> list[dict[str, Any]]:
    """Every combination of the searched keys' values, or, when there are too many, each
    key's values with the file's others."""
    candidates = cfg.space_candidates()
    if math.prod(len(v) for v in candidates.values()) <= MAX_COMBINATIONS:
        return [
            dict(zip(candidates, combo, strict=True))
            for combo in itertools.product(*candidates.values())
        ]
    return [{k: v} for k, values in candidates.items() for v in values]
