"""How the MLflow UI opens a raypeft experiment: the model-training view, with the search's
objective metrics as columns of the runs table.

MLflow 3.17's UI has two workflows, "GenAI" (traces, judges; its default) and "Model
training" (runs, models, the registry). The experiment tag ``mlflow.experimentKind`` records
which one an experiment belongs to (``custom_model_development`` is what the UI's own kind
selector writes for model training; ``finetuning`` maps there too), but the 3.17 UI picks the
workflow from its ``workflowType`` URL parameter, else the browser's last click on its
"GenAI | Model training" switch (local storage ``mlflow.workflowType_v1``), else GenAI, never
from that tag; and the runs table shows no metric column until one is added by hand.
So a search also stores a *shared view* (the experiment tag
``mlflow.sharedViewState.raypeft``: the UI's own "share view" format: which columns, in which
order, how wide), and every link raypeft prints carries the parameter: the runs page
(:func:`runs_page_url`:
``/#/experiments/<id>/runs?workflowType=machine_learning&viewStateShareKey=raypeft``) and a
run's page (:func:`run_page_url`). The links the UI itself draws (a run's name in the runs
table, a model version's source run) drop the parameter: they open in the browser's last
choice, GenAI until "Model training" is clicked once on a page opened in GenAI (the switch
remembers only a change).
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


RUN_NAME_COLUMN = "attributes.`Run Name`"
STOPPED_COLUMN = f"tags.`{STOPPED_EARLY_TAG}`"
# pixels: room for a trial's name with its "(stopped early at step N)" mark, and for the tag's
# name as the column's header
COLUMN_WIDTHS = {RUN_NAME_COLUMN: 330, STOPPED_COLUMN: 170}


def view_columns(metrics: list[str], params: list[str] = ()) -> list[str]:
    """Runs-table columns, as a Ray Tune user reads a trial table: whether the trial was
    stopped early (the tag ``raypeft.stopped_early``: MLflow's status says FINISHED either
    way), the searched ``params``, then each objective's best validation value (parent and
    trials), latest validation value (trials) and test value (parent), an efficiency
    objective (trainable_params, ...) as itself, and the logged model. (The UI's default
    Dataset column is left out: it is wide, and every run page lists its datasets.)"""
    columns = [STOPPED_COLUMN, *(f"params.`{p}`" for p in params)]
    for metric in metrics:
        if metric in EFFICIENCY_METRICS:
            columns.append(f"metrics.`{metric}`")
            continue
        columns += [f"metrics.`best_val_{metric}`", f"metrics.`val_{metric}`"]
        columns.append(f"metrics.`test_{metric}`")
    return [*columns, "attributes.`Models`"]


def view_state(metrics: list[str], params: list[str] = ()) -> dict:
    """The shared view: :func:`view_columns` shown, and in that order right after the run's
    name (the UI groups columns as attributes, metrics, params, tags unless the view gives an
    order: the stopped-early tag was the table's last column, the searched params after the
    metrics)."""
    columns = view_columns(metrics, params)
    return {
        "selectedColumns": columns,
        "columnOrder": [RUN_NAME_COLUMN, *columns],
        "columnWidths": COLUMN_WIDTHS,
    }


def tag_experiment(
    client: MlflowClient, experiment_id: str, metrics: list[str], params: list[str] = ()
) -> None:
    """Mark the experiment as model training (unless it already has a kind) and store the
    runs-table view ``raypeft ui`` opens (searched params and objective metrics as columns)."""
    experiment = client.get_experiment(experiment_id)
    if EXPERIMENT_KIND_TAG not in experiment.tags:
        client.set_experiment_tag(experiment_id, EXPERIMENT_KIND_TAG, MODEL_TRAINING_KIND)
    view = view_state(metrics, params)
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


def search_runs_url(base_url: str, experiment_id: str) -> str:
    """The runs page of an experiment raypeft's search created (model training, raypeft's
    view), without reading the experiment."""
    return (
        f"{base_url}/#/experiments/{experiment_id}/runs"
        f"?{WORKFLOW_PARAM}&viewStateShareKey={VIEW_KEY}"
    )


def run_page_url(base_url: str, experiment_id: str, run_id: str) -> str:
    """A run's page in the model-training workflow (without the parameter the 3.17 UI opens
    it in the browser's last workflow, GenAI at first)."""
    return f"{base_url}/#/experiments/{experiment_id}/runs/{run_id}?{WORKFLOW_PARAM}"
