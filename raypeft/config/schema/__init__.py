"""The experiment file's pydantic models: every section, its defaults and its rules.

One module a section (``model``, ``task``, ``train``, ``search``, ``resources``, ``tracking``,
``replay``, ``run``); ``experiment`` puts them together with the checks across sections, and
``trial`` gives a trial's config. Everything is imported from here
(``from raypeft.config.schema import ExperimentConfig``). Reading a file (YAML, ``--set``) is
:mod:`raypeft.config.loading`; the ``space`` section's language is :mod:`raypeft.config.space`.
Everything a run needs is validated before Ray, MLflow or any folder is touched.
"""

from raypeft.config.schema.experiment import ExperimentConfig, experiment_json_schema
from raypeft.config.schema.model import ModelConfig
from raypeft.config.schema.replay import ReplayConfig
from raypeft.config.schema.resources import ResourcesConfig
from raypeft.config.schema.run import RunConfig
from raypeft.config.schema.search import (
    EFFICIENCY_METRICS,
    Bound,
    Objective,
    RepeatBest,
    SchedulerConfig,
    SearchConfig,
)
from raypeft.config.schema.task import TaskConfig
from raypeft.config.schema.tracking import ARTIFACT_SCHEMES, TrackingConfig
from raypeft.config.schema.train import PRECISIONS, PrecisionSetting, TrainConfig
from raypeft.config.schema.trial import (
    DERIVED_PREFIX,
    REPEAT_OF,
    REPEAT_PREFIX,
    apply_trial_params,
    trial_config,
)

__all__ = [
    "ARTIFACT_SCHEMES",
    "DERIVED_PREFIX",
    "EFFICIENCY_METRICS",
    "PRECISIONS",
    "REPEAT_OF",
    "REPEAT_PREFIX",
    "Bound",
    "ExperimentConfig",
    "ModelConfig",
    "Objective",
    "PrecisionSetting",
    "RepeatBest",
    "ReplayConfig",
    "ResourcesConfig",
    "RunConfig",
    "SchedulerConfig",
    "SearchConfig",
    "TaskConfig",
    "TrackingConfig",
    "TrainConfig",
    "apply_trial_params",
    "experiment_json_schema",
    "trial_config",
]
