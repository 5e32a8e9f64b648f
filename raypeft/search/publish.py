"""A search's records beyond its runs: dataset lineage and the UI's view when the search
opens its records, the chosen model as a ``python_function`` model (and a registry version,
``champion`` moved only when it is better) when it finishes.

Publishing never fails a finished search: an MLflow error is printed, tagged on the parent
run (``raypeft.publish_error``) and left to the user (docs/serving.md registers by hand).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlflow.entities import DatasetInput
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from raypeft.config.schema import ExperimentConfig
from raypeft.data import TokenizedTask
from raypeft.errors import ConfigError
from raypeft.search.searcher import ResolvedObjective
from raypeft.tracking.datasets import dataset_inputs, log_dataset_inputs
from raypeft.tracking.experiment_view import tag_experiment
from raypeft.tracking.registry import Candidate, Registration, register

MODEL_ID_TAG = "raypeft.best_model_id"  # the parent run's pointer to the chosen pyfunc model
REGISTERED_TAG = "raypeft.registered_model"  # NAME/VERSION the search registered
PUBLISH_ERROR_TAG = "raypeft.publish_error"


@dataclass
class Published:
    """The chosen model as MLflow knows it after the search."""

    model_id: str | None = None
    registration: Registration | None = None
    error: str | None = None

    def lines(self) -> list[str]:
        out = []
        if self.model_id:
            out.append(f"Model: models:/{self.model_id} (python_function; mlflow models serve)")
        if self.registration is not None:
            out.append(self.registration.line())
        if self.error:
            out.append(f"  warning: {self.error}")
        return out


def open_lineage(
    client: MlflowClient,
    experiment_id: str,
    parent_run_id: str,
    cfg: ExperimentConfig,
    data: TokenizedTask,
    objectives: list[ResolvedObjective],
) -> list[DatasetInput]:
    """The task's dataset inputs (logged to the parent run, returned for the trials), the
    experiment's kind and runs-table view."""
    inputs = dataset_inputs(cfg.task, data)
    parent = client.get_run(parent_run_id)
    if not (parent.inputs and parent.inputs.dataset_inputs):  # a resumed search has them
        log_dataset_inputs(client, parent_run_id, inputs)
    tag_experiment(client, experiment_id, [o.name for o in objectives])
    return inputs


def publish_best(
    client: MlflowClient,
    cfg: ExperimentConfig,
    *,
    parent_run_id: str,
    run_id: str | None,
    trial_id: str,
    folder: Path | None,
    objective: ResolvedObjective,
    best_metrics: dict[str, Any],
    test: dict[str, float],
    logged: dict[str, str] | None = None,
    say=print,
) -> Published:
    """Log the chosen trial's model as a pyfunc model (unless ``log_models: all`` did,
    ``logged``: trial id -> model id) and register it (``tracking.register_model``)."""
    from raypeft.search.trial_records import log_trial_model

    if run_id is None or folder is None:
        return Published()
    experiment = cfg.tracking.experiment or cfg.name
    published = Published()
    try:
        model_id = (logged or {}).get(trial_id)
        if model_id is None:
            say("Logging the chosen model as an MLflow python_function model ...")
            step = int(best_metrics.get("best_step", 0))
            model_id = log_trial_model(client, run_id, folder, step)
        if model_id is None:
            published.error = (
                f"run {run_id}: the chosen model could not be logged as a pyfunc model "
                f"(see its tag raypeft.pyfunc_error)"
            )
            client.set_tag(parent_run_id, PUBLISH_ERROR_TAG, published.error)
            return published
        published.model_id = model_id
        client.set_tag(parent_run_id, MODEL_ID_TAG, model_id)
        name = cfg.tracking.registered_model_name(experiment)
        if name is None:
            return published
        value = best_metrics.get(objective.result_key)
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"the chosen trial reported no finite {objective.result_key}")
        candidate = Candidate(
            model_id=model_id,
            run_id=run_id,
            trial_id=trial_id,
            search_run_id=parent_run_id,
            experiment=experiment,
            metric=objective.name,
            mode=objective.mode,
            value=float(value),
            method=str(cfg.method.name),
            trainable_params=_int_or_none(best_metrics.get("trainable_params")),
            task=cfg.task.name,
            backbone=cfg.model.name,
            test_value=test.get(f"test_{objective.name}"),
        )
        candidate = _with_trial_method(client, candidate)
        published.registration = register(
            client,
            name,
            candidate,
            alias=cfg.tracking.champion_alias,
            policy=cfg.tracking.champion_policy,
        )
        client.set_tag(parent_run_id, REGISTERED_TAG, f"{name}/{published.registration.version}")
    except (MlflowException, ConfigError, OSError, ValueError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:500]
        published.error = f"publishing the chosen model failed: {first}"
        try:
            client.set_tag(parent_run_id, PUBLISH_ERROR_TAG, published.error)
        except MlflowException:
            pass
    return published


def _int_or_none(value) -> int | None:
    return int(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _with_trial_method(client: MlflowClient, candidate: Candidate) -> Candidate:
    """The chosen trial's own method (a search may choose ``method.name``)."""
    from dataclasses import replace

    method = client.get_run(candidate.run_id).data.params.get("method.name")
    return replace(candidate, method=method) if method else candidate
