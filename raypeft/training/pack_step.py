"""One training step of a pack's members, member by member after the shared passes.

:class:`Learner` is what updates one member (its optimizer, schedule, loss scaler, clipping
norm and random state); :func:`packed_step` runs one forward and one backward pass through
the shared backbone for all members, then each member's own clipping and optimizer step. A
fused pack (:mod:`raypeft.training.fused`) does the members' part as stacked operations.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from raypeft.config.schema import ExperimentConfig
from raypeft.modeling.packed import MemberRNG, PackedBackbone, PackEntry, PackShape
from raypeft.modeling.prompted import PromptedModel
from raypeft.training.optimizer import (
    apply_gradients,
    build_optimizer,
    build_scheduler,
    loss_scaler,
)


@dataclass
class Learner:
    """A model and what updates it: optimizer, schedule, loss scaler, clipping norm and its
    own random state (what a trial of its own has)."""

    model: PromptedModel
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    max_grad_norm: float | None
    rng: MemberRNG | None = None

    @classmethod
    def of(cls, model: PromptedModel, cfg: ExperimentConfig, device: torch.device) -> Learner:
        """AdamW with the config's learning rates, its schedule and (fp16) loss scaler."""
        optimizer = build_optimizer(model, cfg)
        scheduler = build_scheduler(optimizer, cfg.train)
        scaler = loss_scaler(model.precision, device)
        return cls(model, optimizer, scheduler, scaler, cfg.train.max_grad_norm)


@dataclass(frozen=True)
class StepOutcome:
    """What one packed step did, per learner in order, and how long it took."""

    losses: list[float]  # each learner's training loss
    finite: list[bool]  # False: that learner's loss is NaN or infinite (it took no step)
    shape: PackShape
    seconds: float


def packed_step(
    backbone: PackedBackbone, learners: Sequence[Learner], batches: Sequence[dict]
) -> StepOutcome:
    """One training step of every learner on its batch: one forward and one backward pass
    through the shared backbone for all, then each learner clips its own gradients and steps
    its own optimizer and schedule (:func:`~raypeft.training.optimizer.apply_gradients`). A
    learner whose loss is not finite takes no step (its trial has diverged)."""
    start = time.perf_counter()
    for learner in learners:
        learner.optimizer.zero_grad(set_to_none=True)
    entries = [PackEntry(x.model, b, x.rng) for x, b in zip(learners, batches, strict=True)]
    outputs, shape = backbone(entries)
    losses = torch.stack([out.loss.detach() for out in outputs])
    finite = torch.isfinite(losses).tolist()  # one device sync for all members
    live = [(x, out.loss) for x, out, ok in zip(learners, outputs, finite, strict=True) if ok]
    if live:
        # each member's (scaled) loss reaches only its own tensors: one backward for all
        sum(x.scaler.scale(loss) for x, loss in live).backward()
        for learner, _ in live:
            apply_gradients(
                learner.model,
                learner.optimizer,
                learner.scheduler,
                learner.max_grad_norm,
                learner.scaler,
            )
    return StepOutcome(losses.tolist(), finite, shape, time.perf_counter() - start)
