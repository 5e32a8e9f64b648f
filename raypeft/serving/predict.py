"""Classify new texts with a trained trial, without loading the task's data.

A trained model is a folder (a trial's ``model/`` artefacts, or a search's ``best_model/``):
``trainable.safetensors`` (method and head tensors), ``config.yaml`` (the resolved experiment
config) and ``task.json`` (label names, verbalizers, whether inputs are text pairs). The
backbone is rebuilt as training built it (:func:`raypeft.modeling.build.build_model`, same
seed), the trained tensors are loaded over it, and new texts go through the training path:
tokenised by :func:`raypeft.data.tokenize.tokenize_texts` with the same padding side and length, the
method's per-example features computed by its :class:`~raypeft.methods.base.FeatureSpec` s,
then :meth:`raypeft.modeling.prompted.PromptedModel.predict`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from raypeft.config.schema import ExperimentConfig
from raypeft.data.tasks import TaskSpec
from raypeft.data.tokenize import TokenizedTask, tokenize_texts
from raypeft.modeling.backbones import frozen_backbone
from raypeft.modeling.build import build_model
from raypeft.modeling.precision import resolve_precision
from raypeft.modeling.prompted import PromptedModel
from raypeft.training.checkpoints import MODEL_FILES
from raypeft.training.digests import check_digests
from raypeft.training.model_folder import read_config, read_task_metadata

UNMATCHED = "<unmatched>"  # a seq2seq model wrote text that names no class


@dataclass(frozen=True)
class Prediction:
    """One input's prediction.

    ``label``: the class name (or id as text when the task has no names); for regression the
    value as text; for a seq2seq model that wrote no class name, :data:`UNMATCHED`.
    ``score``: the probability of the predicted class (classification heads), the value
    (regression), or None (seq2seq classification: generated text has no probability).
    ``label_id``: the class id (-1 unmatched; None for regression).
    ``probabilities``: every class's probability, in class-id order (classification heads
    only; None for regression and seq2seq models).
    """

    text: str
    text_pair: str | None
    label: str
    score: float | None
    label_id: int | None
    probabilities: tuple[float, ...] | None = None


def task_from_metadata(meta: dict[str, Any]) -> TokenizedTask:
    """A data-less :class:`TokenizedTask` carrying what ``build_model`` reads of a task."""
    spec = TaskSpec(
        name=meta["name"],
        text_column="text",
        text_pair_column="text_pair" if meta.get("text_pair") else None,
        problem=meta["problem"],
        num_labels=meta["num_labels"],
        metrics=tuple(meta.get("metrics") or ("accuracy",)),
    )
    return TokenizedTask(
        spec=spec, label_names=meta.get("label_names"), verbalizers=meta.get("verbalizers")
    )


def load_trained(
    folder: Path, device: torch.device | str | None = None, precision: str | None = None
) -> tuple[ExperimentConfig, dict[str, Any], PromptedModel]:
    """Config, task metadata and the trained model (eval mode) of a model folder, computing in
    ``precision`` (default: its ``train.precision``, where ``device`` can run it); its files
    checked against their digests first (DamagedArtefact when one is missing or damaged)."""
    folder = Path(folder)
    check_digests(folder, MODEL_FILES)
    cfg = read_config(folder)
    meta = read_task_metadata(folder)
    device = torch.device(device or "cpu")
    # the precision it trained and was evaluated in, where ``device`` can run it
    precision = resolve_precision(precision or cfg.train.precision, device, strict=False)
    model = build_model(cfg, task_from_metadata(meta), device=device, precision=precision)
    model.load_trainable(folder)
    model.eval()
    return cfg, meta, model.to(device)


def tokenize_inputs(
    cfg: ExperimentConfig, kind: str, texts: list[str], pairs: list[str] | None = None
) -> dict[str, np.ndarray]:
    """Token arrays exactly as :func:`raypeft.data.tokenize.prepare_task` builds them."""
    side = "left" if kind == "decoder" else "right"
    arrays = tokenize_texts(cfg.model, texts, pairs, padding_side=side)
    if kind != "encoder":  # as prepare_task: no segment ids for T5 and GPT-style models
        arrays.pop("token_type_ids", None)
    return arrays


def feature_texts(texts: list[str], pairs: list[str] | None) -> list[str]:
    """The raw text features read (GloVe): pairs joined with a space, as prepare_task does."""
    return [f"{a} {b}" for a, b in zip(texts, pairs, strict=True)] if pairs else list(texts)


class Predictor:
    """A trained model ready to classify texts batch by batch.

    >>> predictor = Predictor.from_folder("downloaded/model")     # doctest: +SKIP
    >>> for batch in predictor.predict_batches(["great!", "awful"]):  # doctest: +SKIP
    ...     print([(p.label, p.score) for p in batch])
    """

    def __init__(
        self,
        cfg: ExperimentConfig,
        meta: dict[str, Any],
        model: PromptedModel,
        device: torch.device | str | None = None,
    ):
        self.cfg, self.meta, self.model = cfg, meta, model
        self.device = torch.device(device or "cpu")
        self.specs = cfg.method.feature_specs()
        self.load_s = 0.0  # seconds spent loading (set by from_folder)

    @classmethod
    def from_folder(
        cls, folder: Path, device: torch.device | str | None = None, precision: str | None = None
    ) -> Predictor:
        start = time.perf_counter()
        cfg, meta, model = load_trained(folder, device, precision)
        predictor = cls(cfg, meta, model, device)
        predictor.load_s = time.perf_counter() - start
        return predictor

    @property
    def kind(self) -> str:
        return self.model.kind

    @property
    def text_pair(self) -> bool:
        return bool(self.meta.get("text_pair"))

    @property
    def regression(self) -> bool:
        return self.meta["problem"] == "regression"

    @property
    def label_names(self) -> list[str]:
        """Every class's name, in class-id order (empty for regression)."""
        if self.regression:
            return []
        return [self.label_name(i) for i in range(int(self.meta["num_labels"]))]

    def label_name(self, index: int) -> str:
        names = self.meta.get("label_names")
        if names:
            return str(names[index])
        verbalizers = self.meta.get("verbalizers")
        return str(verbalizers[index]) if verbalizers else str(index)

    def inputs(self, texts: list[str], pairs: list[str] | None = None) -> dict[str, Any]:
        """The model's batch for these texts: token tensors plus the method's features."""
        if self.text_pair and (pairs is None or any(p is None for p in pairs)):
            raise ValueError("this model was trained on text pairs: give a pair for every text")
        if not self.text_pair and pairs is not None:
            raise ValueError("this model was trained on single texts, not text pairs")
        if pairs is not None and len(pairs) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(pairs)} pairs")
        arrays = tokenize_inputs(self.cfg, self.kind, list(texts), pairs)
        batch: dict[str, Any] = {k: torch.as_tensor(v) for k, v in arrays.items()}
        if self.specs:
            raw = feature_texts(list(texts), pairs)
            backbone = frozen_backbone(self.cfg.model)  # the one the driver encoded with
            batch["features"] = {
                name: torch.as_tensor(np.asarray(spec.compute(raw, arrays, backbone)))
                for name, spec in self.specs.items()
            }
        return _to_device(batch, self.device)

    @torch.no_grad()
    def raw_predictions(self, texts: list[str], pairs: list[str] | None = None) -> np.ndarray:
        """What :meth:`PromptedModel.predict` returns for one batch (logits or class ids)."""
        return self.model.predict(**self.inputs(texts, pairs))

    def _decode(self, outputs: np.ndarray, texts, pairs) -> list[Prediction]:
        pairs = pairs if pairs is not None else [None] * len(texts)
        out = []
        if self.kind == "seq2seq":
            for text, pair, value in zip(texts, pairs, outputs, strict=True):
                if self.regression:
                    value = float(value)
                    ok = not math.isnan(value)
                    label = f"{value:.4g}" if ok else UNMATCHED
                    out.append(Prediction(text, pair, label, value if ok else None, None))
                else:
                    index = int(value)
                    label = self.label_name(index) if index >= 0 else UNMATCHED
                    out.append(Prediction(text, pair, label, None, index))
            return out
        logits = torch.as_tensor(outputs).float()
        if self.regression:
            for text, pair, value in zip(texts, pairs, logits[:, 0].tolist(), strict=True):
                out.append(Prediction(text, pair, f"{value:.4g}", value, None))
            return out
        probs = logits.softmax(-1)
        best, index = probs.max(-1)
        rows = zip(texts, pairs, best.tolist(), index.tolist(), probs.tolist(), strict=True)
        for text, pair, p, i, every in rows:
            out.append(Prediction(text, pair, self.label_name(i), p, i, tuple(every)))
        return out

    def predict(self, texts: list[str], pairs: list[str] | None = None) -> list[Prediction]:
        """Predictions for one batch of texts (and pairs, for pair tasks)."""
        if not texts:
            return []
        return self._decode(self.raw_predictions(texts, pairs), texts, pairs)

    def predict_batches(
        self,
        texts: Iterable[str] | Iterable[tuple[str, str | None]],
        pairs: Iterable[str] | None = None,
        batch_size: int = 64,
    ) -> Iterator[list[Prediction]]:
        """Predictions batch by batch (a generator). ``texts`` may hold ``(text, pair)``
        tuples instead of a separate ``pairs`` iterable; inputs are read lazily."""
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        records = zip(texts, pairs, strict=True) if pairs is not None else texts
        chunk: list[tuple[str, str | None]] = []
        for record in records:
            chunk.append(record if isinstance(record, tuple) else (record, None))
            if len(chunk) == batch_size:
                yield self._predict_chunk(chunk)
                chunk = []
        if chunk:
            yield self._predict_chunk(chunk)

    def _predict_chunk(self, chunk: list[tuple[str, str | None]]) -> list[Prediction]:
        texts, pairs = [t for t, _ in chunk], [p for _, p in chunk]
        given = self.text_pair or any(p is not None for p in pairs)
        return self.predict(texts, pairs if given else None)


def _to_device(batch: dict, device: torch.device) -> dict:
    return {
        k: _to_device(v, device) if isinstance(v, dict) else v.to(device) for k, v in batch.items()
    }


def prediction_row(p: Prediction, predictor: Predictor) -> dict[str, Any]:
    """One prediction as both outputs give it (``raypeft predict --output-format jsonl`` and
    the served pyfunc model): the label, its class id, the top score and every class's
    probability; a regression's value."""
    if predictor.regression:
        return {"label": p.label, "value": p.score}
    row: dict[str, Any] = {"label": p.label, "label_id": p.label_id}
    if p.probabilities is not None:
        row["score"] = p.score
        row["probabilities"] = dict(zip(predictor.label_names, p.probabilities, strict=True))
    return row
