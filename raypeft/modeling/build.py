"""The model a trial trains: frozen backbone, task head and the configured prompt method.

Training builds it to train it; serving builds it again, the same way and with the same seed,
to load trained tensors into. Both go through :func:`build_model`.
"""

from __future__ import annotations

from typing import Protocol

from raypeft.config.schema import ExperimentConfig
from raypeft.modeling.backbones import load_backbone, load_tokenizer
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


def build_model(cfg: ExperimentConfig, task: TaskLabels) -> PromptedModel:
    """Frozen backbone + head + the configured method, seeded by ``train.seed``."""
    backbone = load_backbone(cfg.model, task.num_labels, task.spec.problem, seed=cfg.train.seed)
    model = PromptedModel(backbone, cfg.method)
    if model.kind == "seq2seq":
        model.verbalizers = task.verbalizers
        model.tokenizer = load_tokenizer(cfg.model.name, cfg.model.revision)
    return model
