"""Finding an interrupted search to resume (``raypeft tune --resume``).

A search records on its MLflow parent run where Ray Tune keeps its experiment
(``raypeft.tune_path``) and a hash of its resolved experiment (``raypeft.config_hash``). A
search whose driver died leaves that parent run RUNNING (SIGKILL) or FAILED/KILLED; resuming
continues that run, its Tune experiment and its Optuna study, with the same experiment.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from raypeft.config.dotted import flatten
from raypeft.config.redact import redact_params
from raypeft.config.schema import ExperimentConfig
from raypeft.errors import ConfigError
from raypeft.tracking.parent_run import param_text  # the value exactly as it was logged
from raypeft.tracking.runs import parent_runs
from raypeft.tracking.tags import CONFIG_HASH_TAG, TUNE_PATH_TAG


def config_hash(cfg: ExperimentConfig) -> str:
    """A stable hash of the resolved experiment (what a resumed search must match)."""
    text = json.dumps(cfg.model_dump(mode="json"), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def find_interrupted_search(
    client: MlflowClient, cfg: ExperimentConfig, source: str
) -> tuple[str, Run]:
    """The experiment's newest search, which must be unfinished and resumable.

    Returns ``(experiment_id, parent_run)``; anything else is a one-line :class:`ConfigError`.
    """
    name = cfg.tracking.experiment or cfg.name
    experiment = client.get_experiment_by_name(name)
    runs = parent_runs(client, experiment.experiment_id) if experiment else []
    if not runs:
        raise ConfigError(f"--resume: experiment {name!r} has no search to resume")
    run = runs[0]
    run_id = run.info.run_id
    if run.info.status == "FINISHED":
        raise ConfigError(
            f"--resume: the newest search of {name!r} (run {run_id}) finished; nothing to "
            "resume (leave out --resume to start a new search)"
        )
    tune_path = run.data.tags.get(TUNE_PATH_TAG)
    if not tune_path:
        raise ConfigError(f"--resume: search run {run_id} records no Ray Tune experiment path")
    if "://" not in tune_path and not (Path(tune_path) / "tuner.pkl").is_file():
        raise ConfigError(
            f"--resume: {tune_path}: the interrupted search's Ray Tune experiment is not here "
            "(run.storage_path must be the same folder, or shared storage such as s3://)"
        )
    if run.data.tags.get(CONFIG_HASH_TAG) != config_hash(cfg):
        changed = _changed_keys(client, run_id, cfg)
        raise ConfigError(
            f"--resume: {source} differs from the interrupted search's experiment"
            + (f" ({changed})" if changed else "")
            + "; resume with the same file and --set overrides"
        )
    return experiment.experiment_id, run


def _changed_keys(client: MlflowClient, run_id: str, cfg: ExperimentConfig) -> str:
    """The first keys whose value differs from the run's logged experiment parameters."""
    logged = client.get_run(run_id).data.params
    now = redact_params(flatten(cfg.model_dump(mode="json", exclude={"space"})))
    now.update({f"space.{k}": v.model_dump() for k, v in cfg.space.items()})
    diffs = []
    for key in sorted(set(logged) | set(now)):
        old = logged.get(key)
        new = param_text(now[key]) if key in now else None
        if key.startswith("best.") or old == new or (old is not None and "***" in old):
            continue
        diffs.append(f"{key}: {old} -> {new}")
    return ", ".join(diffs[:3]) + (", ..." if len(diffs) > 3 else "")
