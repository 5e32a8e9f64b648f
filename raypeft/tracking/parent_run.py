"""The search's parent run in MLflow: its experiment (opened or created, artefacts where the
file says), the run with the whole experiment file as params and artifact, and at the end the
chosen configuration, its metrics and model."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import yaml
from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from raypeft.config.dotted import flatten
from raypeft.config.redact import redact_config, redact_params, redact_uri
from raypeft.config.schema import ExperimentConfig
from raypeft.errors import ConfigError
from raypeft.tracking.runs import BEST_MODEL_ARTIFACTS, log_model
from raypeft.tracking.stores import database_server
from raypeft.tracking.tags import (
    BEST_RUN_TAG,
    BEST_TRIAL_TAG,
    METHOD_TAG,
    ROLE_SEARCH,
    ROLE_TAG,
    SPACE_FILE_TAG,
)

_BATCH = 100  # MLflow accepts at most 100 params per log_batch call


def open_experiment(client: MlflowClient, name: str, artifact_location: str | None = None) -> str:
    """The id of the MLflow experiment called ``name`` (created if missing, keeping its
    artefacts at ``artifact_location`` when given: MLflow's default otherwise). An existing
    experiment whose artefacts live elsewhere than ``artifact_location`` is a ConfigError:
    MLflow fixes an experiment's location when it creates it."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        if found.lifecycle_stage == "deleted":
            client.restore_experiment(found.experiment_id)
        _check_artifact_location(found, artifact_location)
        return found.experiment_id
    try:
        return client.create_experiment(name, artifact_location=artifact_location)
    except MlflowException as exc:  # a search started beside this one created it just now
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        return client.get_experiment_by_name(name).experiment_id


def _same_location(a: str, b: str) -> bool:
    """Two artefact locations name the same place (``/x`` and ``file:///x/`` do)."""
    return a.removeprefix("file://").rstrip("/") == b.removeprefix("file://").rstrip("/")


def _check_artifact_location(experiment, wanted: str | None) -> None:
    if wanted is not None and not _same_location(experiment.artifact_location, wanted):
        raise ConfigError(
            f"tracking.artifact_location: experiment {experiment.name!r} already keeps its "
            f"artefacts in {redact_uri(experiment.artifact_location)}, not {redact_uri(wanted)} "
            "(MLflow fixes it when the experiment is created); give that location, or another "
            "tracking.experiment"
        )


def artefacts_on_one_disk(tracking_uri: str, artifact_location: str) -> bool:
    """A database server's runs whose artefacts live on the local disk of the machine that
    logged them: other machines read the runs but not their models."""
    local = "://" not in artifact_location or artifact_location.startswith("file:")
    return database_server(tracking_uri) and local


def log_params(client: MlflowClient, run_id: str, params: dict[str, Any]) -> None:
    items = [Param(k, param_text(v)) for k, v in sorted(redact_params(params).items())]
    for i in range(0, len(items), _BATCH):
        client.log_batch(run_id, params=items[i : i + _BATCH])


def param_text(value: Any) -> str:
    """A value as MLflow stores it as a param (JSON for containers, cut at its limit)."""
    text = json.dumps(value) if isinstance(value, (list, dict, tuple)) else str(value)
    return text[:6000]  # MLflow's param value limit


def start_parent_run(
    client: MlflowClient, experiment_id: str, cfg: ExperimentConfig, source: str
) -> str:
    """Create the experiment's parent run with the whole experiment file as params."""
    run = client.create_run(
        experiment_id,
        run_name=cfg.name,
        tags={
            ROLE_TAG: ROLE_SEARCH,
            SPACE_FILE_TAG: source,
            METHOD_TAG: cfg.method.name,
        },
    )
    params = flatten(cfg.model_dump(mode="json", exclude={"space"}))
    params.update({f"space.{k}": v.model_dump() for k, v in cfg.space.items()})
    log_params(client, run.info.run_id, params)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "experiment.yaml"
        path.write_text(yaml.safe_dump(redact_config(cfg.model_dump(mode="json")), sort_keys=False))
        client.log_artifact(run.info.run_id, str(path))
    return run.info.run_id


def finish_parent_run(
    client: MlflowClient, run_id: str, summary: dict[str, Any], best_folder: Path | None
) -> None:
    """Best configuration, its validation/test metrics and artefacts on the parent run."""
    client.log_batch(
        run_id,
        metrics=[Metric(k, float(v), 0, 0) for k, v in summary["metrics"].items()],
        tags=[
            RunTag(BEST_TRIAL_TAG, summary["trial_id"]),
            RunTag(BEST_RUN_TAG, summary.get("run_id") or ""),
        ],
    )
    log_params(client, run_id, {f"best.{k}": v for k, v in summary["config"].items()})
    for file_name, table in summary.get("tables", {}).items():  # Pareto front, repeats
        client.log_dict(run_id, table, file_name)
    if best_folder is not None:
        log_model(client, run_id, best_folder, BEST_MODEL_ARTIFACTS)
    client.set_terminated(run_id, "FINISHED")
