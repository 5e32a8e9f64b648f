"""A trial's config: the experiment file with the sampled values put in place, and the
records in a trial's Tune config that are not settings."""

from __future__ import annotations

from typing import Any

from raypeft.config.dotted import set_dotted
from raypeft.config.schema.experiment import ExperimentConfig
from raypeft.config.space import is_conditional


def apply_trial_params(cfg: ExperimentConfig, params: dict[str, Any]) -> ExperimentConfig:
    """The experiment config of one trial: the file with the sampled values put in place.

    A sampled ``method.name`` first swaps in that method's settings (``methods``), so the
    other sampled ``method.*`` keys land on the chosen method.
    """
    data = cfg.model_dump(mode="json")
    if "budget_params" in params:
        data["budget_params"] = params["budget_params"]
    if "method.name" in params:
        chosen = cfg.model_copy(update={"budget_params": data["budget_params"]})
        data["method"] = chosen.method_settings(params["method.name"])
    chosen = data["method"]["name"]
    for key, value in params.items():
        if is_conditional(key):
            _, name, knob = key.split(".", 2)
            if name == chosen:  # a knob of a method this trial did not choose is inactive
                set_dotted(data, f"method.{knob}", value)
        elif key != "method.name":
            set_dotted(data, key, value)
    return ExperimentConfig.model_validate(data)


# ----------------------------------------------------------------------------- a trial's
# Tune config: the sampled settings, plus records that are not settings

DERIVED_PREFIX = "derived."  # values computed from the sampled ones (DePT's rank, the count)
REPEAT_PREFIX = "repeat."  # a re-run of a top configuration with another seed (repeat_best)
REPEAT_OF = f"{REPEAT_PREFIX}of"  # the trial id a repeat re-trains


def trial_config(cfg: ExperimentConfig, tune_config: dict[str, Any]) -> ExperimentConfig:
    """A trial's full config from Tune's flat ``{key: value}`` (derived and repeat records
    dropped)."""
    sampled = {
        k: v for k, v in tune_config.items() if not k.startswith((DERIVED_PREFIX, REPEAT_PREFIX))
    }
    return apply_trial_params(cfg, sampled)
