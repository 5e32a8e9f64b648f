"""How the MLflow UI opens a raypeft experiment: the model-training view, with the search's
objective metrics as columns of the runs table.

MLflow 3.17's UI has two workflows, "GenAI" (traces, judges; its default) and "Model
training" (runs, models, the registry). The experiment tag ``mlflow.experimentKind`` records
which one an experiment belongs to (``custom_model_development`` is what the UI's own kind
selector writes for model training; ``finetuning`` maps there too), but the 3.17 UI picks the
workflow from its ``workflowType`` URL parameter (else the browser's last choice, else GenAI),
not from that tag; and the runs table shows no metric column until one is added by hand.
So a search also stores a *shared view* (the experiment tag
``mlflow.sharedViewState.raypeft``: the UI's own "share view" format, here the metric
columns), and ``raypeft ui`` prints a runs-page URL that opens both:
``/#/experiments/<id>/runs?workflowType=machine_learning&viewStateShareKey=raypeft``.
Opened any other way, the UI needs one click on "Model training" (top left) and the
metric columns from "Columns".
"""

from __future__ import annotations

import json

from mlflow.entities import Experiment
from mlflow.tracking import MlflowClient

from raypeft.config.schema import EFFICIENCY_METRICS
from raypeft.tracking.tags import STOPPED_EARLY_TAG

EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MODEL_TRAINING_KIND = "custom_model_development"
MODEL_TRAINING_KINDS = (
    "custom_model_development",
    "finetuning",
    "classification",
    "regression",
    "forecasting",
    "automl",
)
SHARED_VIEW_TAG_PREFIX = "mlflow.sharedViewState."  # the UI's "share view" tags
VIEW_KEY = "raypeft"
WORKFLOW_PARAM = "workflowType=machine_learning"


def view_columns(metrics: list[str], params: list[str] = ()) -> list[str]:
    """Runs-table columns, as a Ray Tune user reads a trial table: whether the trial was
    stopped early (the tag ``raypeft.stopped_early``: MLflow's status says FINISHED either
    way), the searched ``params``, the logged model, then each objective's best validation
    value (parent and trials), latest validation value (trials) and test value (parent); an
    efficiency objective (trainable_params, ...) as itself. (The UI's default Dataset column
    is left out: it is wide, and every run page lists its datasets.)"""
    columns = [f"tags.`{STOPPED_EARLY_TAG}`", *(f"params.`{p}`" for p in params)]
    columns.append("attributes.`Models`")
    for metric in metrics:
        if metric in EFFICIENCY_METRICS:
            columns.append(f"metrics.`{metric}`")
            continue
        columns += [f"metrics.`best_val_{metric}`", f"metrics.`val_{metric}`"]
        columns.append(f"metrics.`test_{metric}`")
    return columns


def tag_experiment(
    client: MlflowClient, experiment_id: str, metrics: list[str], params: list[str] = ()
) -> None:
    """Mark the experiment as model training (unless it already has a kind) and store the
    runs-table view ``raypeft ui`` opens (searched params and objective metrics as columns)."""
    experiment = client.get_experiment(experiment_id)
    if EXPERIMENT_KIND_TAG not in experiment.tags:
        client.set_experiment_tag(experiment_id, EXPERIMENT_KIND_TAG, MODEL_TRAINING_KIND)
    view = {"selectedColumns": view_columns(metrics, params)}
    client.set_experiment_tag(experiment_id, SHARED_VIEW_TAG_PREFIX + VIEW_KEY, json.dumps(view))


def runs_page_url(base_url: str, experiment: Experiment) -> str:
    """The runs page of the experiment, in the model-training workflow (unless the experiment
    is tagged as another kind) with raypeft's view where the experiment has one."""
    url = f"{base_url}/#/experiments/{experiment.experiment_id}/runs"
    tags = experiment.tags or {}
    params = []
    if tags.get(EXPERIMENT_KIND_TAG, MODEL_TRAINING_KIND) in MODEL_TRAINING_KINDS:
        params.append(WORKFLOW_PARAM)
    if SHARED_VIEW_TAG_PREFIX + VIEW_KEY in tags:
        params.append(f"viewStateShareKey={VIEW_KEY}")
    return url + ("?" + "&".join(params) if params else "")
