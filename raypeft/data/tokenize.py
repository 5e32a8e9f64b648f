"""Tokenise a task once, on the driver, into numpy arrays every trial shares.

The arrays go into Ray's object store once per experiment; numpy arrays are read there
without copies, so trials never tokenise again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from raypeft.backbones import load_tokenizer
from raypeft.config import ModelConfig, TaskConfig
from raypeft.data.tasks import TaskSpec, infer_labels, load_splits, resolve_task_spec

SPLITS = ("train", "validation", "test")


@dataclass
class TokenizedTask:
    """Padded token arrays per split plus what the model and metrics need to know."""

    spec: TaskSpec
    label_names: list[str] | None
    splits: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)

    @property
    def num_labels(self) -> int:
        return self.spec.num_labels

    def size(self, split: str) -> int:
        return len(self.splits[split]["labels"])


def tokenize_texts(
    model: ModelConfig, texts: list[str], pairs: list[str] | None = None
) -> dict[str, np.ndarray]:
    """Pad/truncate to exactly ``model.max_length`` (DePT's offset is per position)."""
    tokenizer = load_tokenizer(model.name, model.revision)
    enc = tokenizer(
        texts,
        pairs,
        padding="max_length",
        truncation=True,
        max_length=model.max_length,
        return_tensors="np",
    )
    out = {
        "input_ids": enc["input_ids"].astype(np.int64),
        "attention_mask": enc["attention_mask"].astype(np.int64),
    }
    if "token_type_ids" in enc:
        out["token_type_ids"] = enc["token_type_ids"].astype(np.int64)
    return out


def prepare_task(task: TaskConfig, model: ModelConfig) -> TokenizedTask:
    """Load, check and tokenise every split of the task."""
    spec = resolve_task_spec(task)
    raw = load_splits(task, spec)
    spec, names = infer_labels(raw, spec)
    result = TokenizedTask(spec=spec, label_names=names)
    for split in SPLITS:
        ds = raw[split]
        texts = [str(t) for t in ds[spec.text_column]]
        pairs = [str(t) for t in ds[spec.text_pair_column]] if spec.text_pair_column else None
        arrays = tokenize_texts(model, texts, pairs)
        labels = ds[spec.label_column]
        if names:
            labels = [names.index(x) for x in labels]
        dtype = np.float32 if spec.problem == "regression" else np.int64
        arrays["labels"] = np.asarray(labels, dtype=dtype)
        result.splits[split] = arrays
    return result
