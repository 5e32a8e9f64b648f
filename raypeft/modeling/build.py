"""The model a trial trains: frozen backbone, task head and the configured prompt method.

Training builds it to train it; serving builds it again, the same way and with the same seed,
to load trained tensors into. Both go through :func:`build_model`, which takes the frozen backbone
from the process's cache (:mod:`raypeft.modeling.cache`): a process training several trials reads
it from disk once.
"""

from __future__ import annotations

from typing import Protocol

import torch

from raypeft.config.schema import ExperimentConfig
from raypeft.modeling.backbones import load_tokenizer
from raypeft.modeling.cache import cached_backbone
from raypeft.modeling.prompted import PromptedModel


class _ProblemSpec(Protocol):
    @property
    def problem(self) -> str: ...


class TaskLabels(Protocol):
    """What building a model reads of a task: :class:`raypeft.data.TokenizedTask` has it.

    A protocol, not the class itself: ``raypeft.data`` sits above ``modeling`` (it tokenises
    with the backbone's tokenizer), and serving builds a model from a task's metadata alone.
    """

    @property
    def spec(self) -> _ProblemSpec: ...

    @property
    def num_labels(self) -> int: ...

    @property
    def verbalizers(self) -> list[str] | None: ...


def build_model(
    cfg: ExperimentConfig,
    task: TaskLabels,
    *,
    device: torch.device | str | None = None,
    precision: str = "fp32",
) -> PromptedModel:
    """Frozen backbone + head + the configured method, seeded by ``train.seed``, on ``device``
    (default CPU).

    The frozen weights are kept in ``precision``'s dtype (a resolved precision: fp32, bf16 or
    fp16; :mod:`raypeft.modeling.precision`); the head and the method's tensors stay float32.
    The model is the same, tensor for tensor, whether its backbone came from the cache or disk.
    In training mode its backbone's dropout follows ``train.backbone_dropout``; its head reads
    what ``model.head_pooling`` resolves to.
    """
    backbone = cached_backbone(
        cfg.model,
        task.num_labels,
        task.spec.problem,
        seed=cfg.train.seed,
        precision=precision,
        device=device,
    )
    # the method's tensors are made beside the word embeddings some start from (or on the CPU),
    # then everything joins the backbone on its device
    model = PromptedModel(
        backbone,
        cfg.method,
        backbone_dropout=cfg.train.backbone_dropout,
        head_pooling=cfg.model.head_pooling,
    )
    model = model.to(device or "cpu")
    model.precision = precision
    if model.kind == "seq2seq":
        model.verbalizers = task.verbalizers
        model.tokenizer = load_tokenizer(cfg.model.name, cfg.model.revision)
        model.seq2seq_scoring = cfg.task.seq2seq_scoring
    return model
