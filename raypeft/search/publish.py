"""A search's records beyond its runs: dataset lineage and the UI's view when the search
opens its records, the chosen model as a ``python_function`` model (and a registry version,
``champion`` moved only when it is better) when it finishes.

Publishing never fails a finished search: an MLflow error is printed, tagged on the parent
run (``raypeft.publish_error``) and left to the user (docs/serving.md registers by hand).
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

from mlflow.entities import DatasetInput
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from raypeft.config.schema import ExperimentConfig
from raypeft.data import TokenizedTask
from raypeft.errors import ConfigError
from raypeft.search.objectives import ResolvedObjective
from raypeft.search.outcome import SearchSummary
from raypeft.search.results import TrialResult
from raypeft.search.trial_records import log_trial_model
from raypeft.tracking.datasets import dataset_inputs, log_dataset_inputs
from raypeft.tracking.experiment_view import tag_experiment
from raypeft.tracking.registry import Candidate, Published, register
from raypeft.tracking.tags import (
    MODEL_ID_TAG,
    PUBLISH_ERROR_TAG,
    PYFUNC_ERROR_TAG,
    REGISTERED_TAG,
)


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
    tag_experiment(client, experiment_id, [o.name for o in objectives], list(cfg.space))
    return inputs


def publish_best(
    client: MlflowClient,
    cfg: ExperimentConfig,
    summary: SearchSummary,
    best: TrialResult,
    folder: Path | None,
    logged: dict[str, str],
    say=print,
) -> Published:
    """Log the chosen trial's model as a pyfunc model (unless ``log_models: all`` did:
    ``logged`` maps trial ids to model ids) and register it (``tracking.register_model``).
    Never raises for MLflow: what failed is tagged on the parent run and returned."""
    published = Published()
    if summary.best_run_id is None or folder is None:
        return published
    try:
        published.model_id = logged.get(best.trial_id) or _log_chosen(
            client, summary.best_run_id, folder, best, say
        )
        client.set_tag(summary.parent_run_id, MODEL_ID_TAG, published.model_id)
        name = cfg.tracking.registered_model_name(summary.experiment)
        if name is not None:
            candidate = _candidate(client, cfg, summary, best, published.model_id)
            published.registration = register(
                client,
                name,
                candidate,
                alias=cfg.tracking.champion_alias,
                policy=cfg.tracking.champion_policy,
            )
            version = published.registration.version
            client.set_tag(summary.parent_run_id, REGISTERED_TAG, f"{name}/{version}")
    except (MlflowException, ConfigError, OSError, ValueError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:500]
        published.error = f"publishing the chosen model failed: {first}"
        with contextlib.suppress(MlflowException):  # the store itself may be what failed
            client.set_tag(summary.parent_run_id, PUBLISH_ERROR_TAG, published.error)
    return published


def _log_chosen(client: MlflowClient, run_id: str, folder: Path, best: TrialResult, say) -> str:
    """Log the chosen trial's best checkpoint as a pyfunc model; its model id."""
    say("Logging the chosen model as an MLflow python_function model ...")
    model_id = log_trial_model(client, run_id, folder, int(best.metrics.get("best_step", 0)))
    if model_id is None:
        raise ValueError(
            f"run {run_id}: the chosen model could not be logged as a pyfunc model "
            f"(see its tag {PYFUNC_ERROR_TAG})"
        )
    return model_id


def _candidate(
    client: MlflowClient,
    cfg: ExperimentConfig,
    summary: SearchSummary,
    best: TrialResult,
    model_id: str,
) -> Candidate:
    """The registry's view of the chosen trial: its model, metric value, method and size."""
    objective = summary.objectives[0]
    value = best.metrics.get(objective.result_key)
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"the chosen trial reported no finite {objective.result_key}")
    run_id = summary.best_run_id
    # a search may choose method.name: the trial's own method, not the experiment's
    method = client.get_run(run_id).data.params.get("method.name") or str(cfg.method.name)
    return Candidate(
        model_id=model_id,
        run_id=run_id,
        trial_id=best.trial_id,
        search_run_id=summary.parent_run_id,
        experiment=summary.experiment,
        metric=objective.name,
        mode=objective.mode,
        value=float(value),
        method=method,
        trainable_params=_int_or_none(best.metrics.get("trainable_params")),
        task=cfg.task.name,
        backbone=cfg.model.name,
        test_value=summary.test.get(f"test_{objective.name}"),
    )


def _int_or_none(value) -> int | None:
    return int(value) if isinstance(value, (int, float)) and math.isfinite(value) else None
