"""One training step as :func:`raypeft.training.loop.train` takes it, through the library's
own functions: forward, then :func:`raypeft.training.optimizer.optimizer_step` (backward,
gradient clipping, AdamW, the learning-rate schedule and fp16's loss scaler).

Only :mod:`raypeft.training.optimizer` is imported (not the pack's ``Learner``, whose module
needs psutil): the step benchmarks run on GPU machines with little more than torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from raypeft.config.schema import ExperimentConfig
from raypeft.modeling.prompted import PromptedModel
from raypeft.training.optimizer import (
    build_optimizer,
    build_scheduler,
    loss_scaler,
    optimizer_step,
)


@dataclass
class Trainee:
    """A model and what a trial updates it with: AdamW at the config's learning rates, its
    schedule, its clipping norm and (fp16) loss scaler."""

    model: PromptedModel
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    max_grad_norm: float | None

    @classmethod
    def of(cls, model: PromptedModel, cfg: ExperimentConfig, device="cpu") -> Trainee:
        """What the training loop builds for ``model`` (``model.precision`` picks the scaler)."""
        optimizer = build_optimizer(model, cfg)
        scaler = loss_scaler(model.precision, torch.device(device))
        scheduler = build_scheduler(optimizer, cfg.train)
        return cls(model, optimizer, scheduler, scaler, cfg.train.max_grad_norm)


def training_step(trainee: Trainee, batch: dict) -> torch.Tensor:
    """One step of ``trainee`` on ``batch``; returns the loss."""
    loss = trainee.model(**batch).loss
    optimizer_step(
        loss,
        trainee.model,
        trainee.optimizer,
        trainee.scheduler,
        trainee.max_grad_norm,
        trainee.scaler,
    )
    return loss
