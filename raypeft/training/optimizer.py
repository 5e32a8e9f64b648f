"""The optimizer and learning-rate schedule every method trains with."""

from __future__ import annotations

import math

import torch
from transformers import get_linear_schedule_with_warmup

from raypeft.config.schema import ExperimentConfig, TrainConfig
from raypeft.modeling.prompted import PromptedModel


def build_optimizer(model: PromptedModel, cfg: ExperimentConfig) -> torch.optim.AdamW:
    """AdamW with one learning rate per named group (α1 prompt, α2 low-rank, head)."""
    lrs = dict(cfg.method.learning_rates(), head=cfg.train.head_lr)
    groups = [
        {"params": params, "lr": lrs[name], "name": name}
        for name, params in model.param_groups().items()
        if params
    ]
    return torch.optim.AdamW(
        groups,
        betas=cfg.train.adam_betas,
        eps=cfg.train.adam_eps,
        weight_decay=cfg.train.weight_decay,
    )


def build_scheduler(
    optimizer: torch.optim.Optimizer, train: TrainConfig
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over ``warmup_ratio`` of the steps, then linear decay to zero."""
    steps = train.max_steps
    return get_linear_schedule_with_warmup(optimizer, math.ceil(train.warmup_ratio * steps), steps)


def optimizer_step(
    loss: torch.Tensor,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    max_grad_norm: float | None,
) -> None:
    """Backpropagate ``loss``, clip the gradients' norm (when set), step optimizer and schedule."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if max_grad_norm:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    scheduler.step()
