"""The optimizer and learning-rate schedule every method trains with."""

from __future__ import annotations

import math

import torch
from transformers import get_constant_schedule, get_linear_schedule_with_warmup

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
    """``train.schedule``: ``linear`` warms up over ``warmup_ratio`` of the steps, then decays
    linearly to zero (DePT's Table 10); ``constant`` keeps every group at its set rate from
    the first step to the last (IDPG's Table 4: a fixed learning rate, no warm-up)."""
    if train.schedule == "constant":
        return get_constant_schedule(optimizer)
    steps = train.max_steps
    return get_linear_schedule_with_warmup(optimizer, math.ceil(train.warmup_ratio * steps), steps)


def loss_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler:
    """fp16's dynamic loss scaling (its small range underflows gradients); for bf16 and fp32 a
    disabled scaler, which passes everything through unchanged."""
    return torch.amp.GradScaler(device.type, enabled=precision == "fp16")


def optimizer_step(
    loss: torch.Tensor,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    max_grad_norm: float | None,
    scaler: torch.amp.GradScaler | None = None,
) -> bool:
    """Backpropagate ``loss``, clip the gradients' norm (when set), step optimizer and schedule.

    With an enabled ``scaler`` (fp16) the loss is scaled, the gradients unscaled before
    clipping, and a step whose gradients overflowed is skipped (the scaler lowers its scale;
    the schedule does not advance). Returns whether the optimizer stepped.
    """
    scaler = scaler or torch.amp.GradScaler(enabled=False)
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    return apply_gradients(model, optimizer, scheduler, max_grad_norm, scaler)


def apply_gradients(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    max_grad_norm: float | None,
    scaler: torch.amp.GradScaler,
) -> bool:
    """What follows the backward pass of :func:`optimizer_step`: clip ``model``'s gradients
    (when set), step optimizer and schedule. A pack of trials (:mod:`raypeft.training.pack`)
    calls it per member after one backward pass for all, so each member clips its own
    gradients with its own norm. Returns whether the optimizer stepped."""
    if max_grad_norm:
        scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    scale = scaler.get_scale() if scaler.is_enabled() else None
    scaler.step(optimizer)  # skips optimizer.step() when the gradients hold inf or NaN
    scaler.update()
    stepped = scale is None or scaler.get_scale() >= scale
    if stepped:
        scheduler.step()
    return stepped
