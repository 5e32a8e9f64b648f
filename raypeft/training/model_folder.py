"""Reading a trained model folder back: the resolved config and the task's metadata that
:mod:`raypeft.training.checkpoints` wrote beside the trained tensors.

Serving loads models from such folders; tracking describes them when it logs them as MLflow
models. Both read them from here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from raypeft.config.schema import ExperimentConfig
from raypeft.errors import ConfigError
from raypeft.training.checkpoints import CONFIG_FILE, TASK_FILE


def read_task_metadata(folder: Path) -> dict[str, Any]:
    """``task.json`` of a trained model folder (ConfigError when absent)."""
    path = Path(folder) / TASK_FILE
    if not path.is_file():
        raise ConfigError(
            f"{path}: missing (the model was saved without its task's labels; "
            "retrain it with this version of raypeft)"
        )
    return json.loads(path.read_text())


def read_config(folder: Path) -> ExperimentConfig:
    """The resolved experiment config a trained model folder was saved with."""
    path = Path(folder) / CONFIG_FILE
    if not path.is_file():
        raise ConfigError(f"{path}: missing (not a raypeft model folder)")
    return ExperimentConfig.model_validate(yaml.safe_load(path.read_text()))
