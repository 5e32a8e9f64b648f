"""MLflow tracking: one parent run per experiment, one nested child run per trial.

All writes happen on the Tune driver (a Tune callback), so there is a single writer per
store: sqlite files stay consistent, and trials need no MLflow credentials.
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Any

import yaml
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID
from ray.tune import Callback
from ray.tune.experiment import Trial

from raypeft.config import EFFICIENCY_METRICS, ExperimentConfig, flatten
from raypeft.methods import BackboneDims
from raypeft.repeats import REPEAT_OF
from raypeft.runs import DEFAULT_TRACKING_URI, ROLE_TAG, TRIAL_ID_TAG  # noqa: F401
from raypeft.space import trial_config

_BATCH = 100  # MLflow accepts at most 100 params per log_batch call


def open_experiment(client: MlflowClient, name: str) -> str:
    """The id of the MLflow experiment called ``name`` (created if missing)."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        if found.lifecycle_stage == "deleted":
            client.restore_experiment(found.experiment_id)
        return found.experiment_id
    return client.create_experiment(name)


def log_params(client: MlflowClient, run_id: str, params: dict[str, Any]) -> None:
    items = [Param(k, _param_text(v)) for k, v in sorted(params.items())]
    for i in range(0, len(items), _BATCH):
        client.log_batch(run_id, params=items[i : i + _BATCH])


def _param_text(value: Any) -> str:
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
            ROLE_TAG: "experiment",
            "raypeft.space_file": source,
            "raypeft.method": cfg.method.name,
        },
    )
    params = flatten(cfg.model_dump(mode="json", exclude={"space"}))
    params.update({f"space.{k}": v.model_dump() for k, v in cfg.space.items()})
    log_params(client, run.info.run_id, params)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "experiment.yaml"
        path.write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
        client.log_artifact(run.info.run_id, str(path))
    return run.info.run_id


def numeric_metrics(result: dict[str, Any]) -> dict[str, float]:
    """The training metrics of a Tune result (Tune's own bookkeeping keys left out)."""
    keep = ("val_", "best_val_", "train_", "test_")
    return {
        k: float(v)
        for k, v in result.items()
        if (k.startswith(keep) or k in EFFICIENCY_METRICS)
        and isinstance(v, (int, float))
        and math.isfinite(v)
    }


def checkpoint_dir(tune_checkpoint, train_checkpoint_path: str | None) -> Path | None:
    """Local folder of a trial's latest (= best) checkpoint, either runner.

    In-process trials report Tune checkpoints; Ray Train trials report their checkpoint's
    storage path as the ``checkpoint_path`` metric of the result that carried it.
    """
    from pyarrow.fs import LocalFileSystem
    from ray.train import Checkpoint

    checkpoint = tune_checkpoint
    if checkpoint is None and train_checkpoint_path:
        checkpoint = Checkpoint(train_checkpoint_path)
    if checkpoint is None:
        return None
    if isinstance(checkpoint.filesystem, LocalFileSystem):
        return Path(checkpoint.path)  # read in place: no copy
    return Path(checkpoint.to_directory())  # remote storage (e.g. S3): download once


class MLflowTrialCallback(Callback):
    """Mirror every Tune trial into a nested MLflow run of the experiment's parent run."""

    def __init__(
        self,
        client: MlflowClient,
        experiment_id: str,
        parent_run_id: str,
        base: ExperimentConfig,
        dims: BackboneDims,
    ):
        self.client = client
        self.experiment_id = experiment_id
        self.parent_run_id = parent_run_id
        self.base = base
        self.dims = dims  # to log each trial's resolved method (e.g. DePT's derived rank)
        self.run_ids: dict[str, str] = {}
        self.train_checkpoints: dict[str, str] = {}  # trial id -> latest Ray Train checkpoint
        self.tune_checkpoints: dict[str, Any] = {}  # trial id -> its latest Tune checkpoint

    def best_checkpoint_dir(self, trial_id: str) -> Path | None:
        """Local folder of the trial's best checkpoint (the latest one it reported)."""
        return checkpoint_dir(
            self.tune_checkpoints.get(trial_id), self.train_checkpoints.get(trial_id)
        )

    def on_trial_start(self, iteration: int, trials: list[Trial], trial: Trial, **info):
        if trial.trial_id in self.run_ids:
            return
        cfg = trial_config(self.base, trial.config)
        cfg = cfg.model_copy(update={"method": cfg.method.resolve(self.dims)})
        repeat_of = trial.config.get(REPEAT_OF)
        tags = {
            MLFLOW_PARENT_RUN_ID: self.parent_run_id,
            TRIAL_ID_TAG: trial.trial_id,
            ROLE_TAG: "repeat" if repeat_of else "trial",
            "raypeft.method": cfg.method.name,
        }
        if repeat_of:  # a top configuration trained again with another seed
            tags["raypeft.repeat_of"] = repeat_of
        run = self.client.create_run(
            self.experiment_id,
            run_name=f"{cfg.method.name}-{trial.trial_id}"
            + (f"-seed{cfg.train.seed}" if repeat_of else ""),
            tags=tags,
        )
        self.run_ids[trial.trial_id] = run.info.run_id
        params = flatten(
            cfg.model_dump(mode="json", exclude={"space", "tracking", "run", "methods"})
        )
        params.update(trial.config)  # the sampled keys and derived.*
        log_params(self.client, run.info.run_id, params)

    def on_trial_result(
        self, iteration: int, trials: list[Trial], trial: Trial, result: dict, **info
    ):
        if result.get("checkpoint_path"):
            self.train_checkpoints[trial.trial_id] = result["checkpoint_path"]
        run_id = self.run_ids.get(trial.trial_id)
        if run_id is None:
            return
        step = int(result.get("step", result.get("training_iteration", 0)))
        timestamp = int(result.get("timestamp", 0) * 1000)
        metrics = [Metric(k, v, timestamp, step) for k, v in numeric_metrics(result).items()]
        self.client.log_batch(run_id, metrics=metrics)

    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial, **info):
        run_id = self.run_ids.get(trial.trial_id)
        if run_id is None:
            return
        if trial.checkpoint is not None:
            self.tune_checkpoints[trial.trial_id] = trial.checkpoint
        folder = self.best_checkpoint_dir(trial.trial_id)
        if folder is not None:
            self.client.log_artifacts(run_id, str(folder), artifact_path="model")
        stopped_early = trial.last_result.get("step", 0) < self.base.train.max_steps
        self.client.set_tag(run_id, "raypeft.stopped_early", str(stopped_early).lower())
        self.client.set_terminated(run_id, "FINISHED")

    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial, **info):
        run_id = self.run_ids.get(trial.trial_id)
        if run_id is None:
            return
        error = str(getattr(trial, "error_file", "") or "")
        self.client.set_tag(run_id, "raypeft.error", _error_summary(trial) or error)
        self.client.set_terminated(run_id, "FAILED")


def _error_summary(trial: Trial) -> str:
    """Last line of the trial's error (e.g. NonFiniteLossError: ...), for the MLflow UI."""
    path = getattr(trial, "error_file", None)
    try:
        text = Path(path).read_text() if path else ""
    except OSError:
        return ""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:5000] if lines else ""


def finish_parent_run(
    client: MlflowClient, run_id: str, summary: dict[str, Any], best_folder: Path | None
) -> None:
    """Best configuration, its validation/test metrics and artefacts on the parent run."""
    client.log_batch(
        run_id,
        metrics=[Metric(k, float(v), 0, 0) for k, v in summary["metrics"].items()],
        tags=[
            RunTag("raypeft.best_trial_id", summary["trial_id"]),
            RunTag("raypeft.best_run_id", summary.get("run_id") or ""),
        ],
    )
    log_params(client, run_id, {f"best.{k}": v for k, v in summary["config"].items()})
    for file_name, table in summary.get("tables", {}).items():  # Pareto front, repeats
        client.log_dict(run_id, table, file_name)
    if best_folder is not None:
        client.log_artifacts(run_id, str(best_folder), artifact_path="best_model")
    client.set_terminated(run_id, "FINISHED")
