"""Tokenise a task once, on the driver, into numpy arrays every trial shares.

The arrays go into Ray's object store once per experiment; numpy arrays are read there
without copies, so trials never tokenise again. Per-example features that no trained
parameter changes (IDPG's sentence encodings) are added once too (``TokenizedTask.features``).

Inputs are padded to exactly ``model.max_length`` (DePT's offset is per position): on the
right for encoders and seq2seq models, on the left for decoders, whose head reads the last
position. Seq2seq models also get ``target_ids``: the label written as text (its name, or
for regression the value rounded to 0.2 as in T5's STS-B), which they learn to generate.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from raypeft.config.schema import ModelConfig, TaskConfig
from raypeft.data.tasks import (
    TaskSpec,
    infer_labels,
    load_splits,
    resolve_task_spec,
    split_origins,
)
from raypeft.modeling.backbones import backbone_kind, load_config, load_tokenizer

SPLITS = ("train", "validation", "test")


@dataclass
class TokenizedTask:
    """Padded token arrays per split plus what the model and metrics need to know."""

    spec: TaskSpec
    label_names: list[str] | None
    splits: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    texts: dict[str, list[str]] = field(default_factory=dict)  # raw input text per split
    # class names as the seq2seq model writes them (None: encoder/decoder heads)
    verbalizers: list[str] | None = None
    # feature key (FeatureSpec.key) -> split -> (n, width) array, computed once
    features: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    # split -> the source split it was drawn from (test: "validation" when validation was
    # halved, DePT's convention); the MLflow dataset inputs name it
    origins: dict[str, str] = field(default_factory=lambda: {s: s for s in SPLITS})

    @property
    def num_labels(self) -> int:
        return self.spec.num_labels

    def size(self, split: str) -> int:
        return len(self.splits[split]["labels"])


def tokenize_texts(
    model: ModelConfig,
    texts: list[str],
    pairs: list[str] | None = None,
    padding_side: str = "right",
) -> dict[str, np.ndarray]:
    """Pad/truncate to exactly ``model.max_length`` (DePT's offset is per position)."""
    tokenizer = load_tokenizer(model.name, model.revision)
    enc = tokenizer(
        texts,
        pairs,
        padding="max_length",
        truncation=True,
        max_length=model.max_length,
        padding_side=padding_side,
        return_tensors="np",
    )
    out = {
        "input_ids": enc["input_ids"].astype(np.int64),
        "attention_mask": enc["attention_mask"].astype(np.int64),
    }
    if "token_type_ids" in enc:
        out["token_type_ids"] = enc["token_type_ids"].astype(np.int64)
    return out


def regression_text(value: float) -> str:
    """A regression label as a seq2seq target: rounded to 0.2, as T5 does for STS-B."""
    return f"{round(float(value) * 5) / 5:.1f}"


def verbalizers_for(spec: TaskSpec, names: list[str] | None) -> list[str] | None:
    """The text a seq2seq model writes for each class (names where known, else the id)."""
    if spec.problem == "regression":
        return None
    return list(names) if names else [str(i) for i in range(spec.num_labels)]


def target_ids(model: ModelConfig, targets: list[str]) -> np.ndarray:
    """Token ids of each target text, padded with the pad id to the longest target."""
    tokenizer = load_tokenizer(model.name, model.revision)
    enc = tokenizer(targets, padding="longest", return_tensors="np")
    return enc["input_ids"].astype(np.int64)


def prepare_task(task: TaskConfig, model: ModelConfig) -> TokenizedTask:
    """Load, check and tokenise every split of the task."""
    spec = resolve_task_spec(task)
    raw = load_splits(task, spec)
    spec, names = infer_labels(raw, spec)
    kind = backbone_kind(load_config(model, spec.num_labels or 2, spec.problem))
    result = TokenizedTask(spec=spec, label_names=names, origins=split_origins(raw))
    if kind == "seq2seq":
        result.verbalizers = verbalizers_for(spec, names)
    for split in SPLITS:
        ds = raw[split]
        texts = [str(t) for t in ds[spec.text_column]]
        pairs = [str(t) for t in ds[spec.text_pair_column]] if spec.text_pair_column else None
        side = "left" if kind == "decoder" else "right"
        arrays = tokenize_texts(model, texts, pairs, padding_side=side)
        if kind != "encoder":  # T5 and GPT-style models have no (or no useful) segment ids
            arrays.pop("token_type_ids", None)
        labels = ds[spec.label_column]
        if names and labels and isinstance(labels[0], str):  # class names: their ids
            labels = [names.index(x) for x in labels]
        dtype = np.float32 if spec.problem == "regression" else np.int64
        arrays["labels"] = np.asarray(labels, dtype=dtype)
        if kind == "seq2seq":
            words = (
                [regression_text(v) for v in labels]
                if result.verbalizers is None
                else [result.verbalizers[i] for i in labels]
            )
            arrays["target_ids"] = target_ids(model, words)
        result.splits[split] = arrays
        result.texts[split] = (
            [f"{a} {b}" for a, b in zip(texts, pairs, strict=True)] if pairs else texts
        )
    return result
