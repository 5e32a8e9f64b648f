"""The training loop every method shares: plain PyTorch, one worker or DDP.

It knows nothing of Tune's searcher: it calls ``report(metrics, checkpoint_dir)`` after each
evaluation, and the caller decides where that goes (Ray Tune, Ray Train, or a test).
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import yaml
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler
from transformers import get_linear_schedule_with_warmup

from raypeft.backbones import load_backbone
from raypeft.config import ExperimentConfig
from raypeft.data import TokenizedTask
from raypeft.data.metrics import METRIC_MODE, compute_metrics
from raypeft.model import PromptedModel

CONFIG_FILE = "config.yaml"

Reporter = Callable[[dict, Path | None], None]


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite (e.g. a learning rate far too high)."""


def build_model(cfg: ExperimentConfig, task: TokenizedTask) -> PromptedModel:
    """Frozen backbone + head + the configured method, seeded by ``train.seed``."""
    backbone = load_backbone(cfg.model, task.num_labels, task.spec.problem, seed=cfg.train.seed)
    return PromptedModel(backbone, cfg.method)


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


def _tensors(arrays: dict[str, np.ndarray]) -> TensorDataset:
    keys = ["input_ids", "attention_mask", "token_type_ids", "labels"]
    return TensorDataset(*(torch.from_numpy(np.array(arrays[k])) for k in keys if k in arrays))


def _batch_kwargs(batch: list[torch.Tensor], device: torch.device) -> tuple[dict, torch.Tensor]:
    *inputs, labels = (t.to(device) for t in batch)
    names = ["input_ids", "attention_mask", "token_type_ids"][: len(inputs)]
    return dict(zip(names, inputs, strict=True)), labels


def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    if logits.shape[-1] == 1:  # regression head
        return torch.nn.functional.mse_loss(logits.squeeze(-1), labels)
    return torch.nn.functional.cross_entropy(logits, labels)


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    arrays: dict[str, np.ndarray],
    metric_names: tuple[str, ...],
    batch_size: int,
    device: torch.device,
) -> dict[str, float]:
    """Metrics of the current weights on one split, plus its loss and samples/s."""
    was_training = model.training
    model.eval()
    logits, labels, loss_sum = [], [], 0.0
    start = time.perf_counter()
    for batch in DataLoader(_tensors(arrays), batch_size=batch_size):
        kwargs, y = _batch_kwargs(batch, device)
        out = model(**kwargs).float()
        loss_sum += loss_fn(out, y).item() * len(y)
        logits.append(out.cpu().numpy())
        labels.append(y.cpu().numpy())
    elapsed = time.perf_counter() - start
    model.train(was_training)
    y_all = np.concatenate(labels)
    metrics = compute_metrics(metric_names, np.concatenate(logits), y_all)
    metrics["loss"] = loss_sum / len(y_all)
    metrics["samples_per_s"] = len(y_all) / elapsed
    return metrics


def train(
    cfg: ExperimentConfig,
    task: TokenizedTask,
    report: Reporter,
    *,
    device: torch.device | None = None,
    wrap_model: Callable[[torch.nn.Module], torch.nn.Module] | None = None,
    rank: int = 0,
    world_size: int = 1,
) -> dict[str, float]:
    """Train one configuration; evaluate every ``train.eval_every`` steps and report.

    A checkpoint folder (trainable tensors as safetensors + the resolved config) is passed
    to ``report`` only when the validation metric improves, so the latest checkpoint is
    always the best one. ``wrap_model`` lets Ray Train wrap the model in DDP; ``rank`` and
    ``world_size`` shard the training data. Returns the best validation metrics.
    """
    device = device or torch.device("cpu")
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg, task).to(device)
    optimizer = build_optimizer(model, cfg)
    steps = cfg.train.max_steps
    scheduler = get_linear_schedule_with_warmup(
        optimizer, math.ceil(cfg.train.warmup_ratio * steps), steps
    )
    trained = wrap_model(model) if wrap_model else model

    metric = cfg.search.metric or task.spec.primary_metric
    sign = 1 if (cfg.search.mode or METRIC_MODE.get(metric, "max")) == "max" else -1
    train_set = _tensors(task.splits["train"])
    per_worker = max(1, cfg.train.batch_size // world_size)  # global batch split over workers
    sampler = (
        DistributedSampler(train_set, world_size, rank, seed=cfg.train.seed)
        if world_size > 1
        else None
    )
    generator = torch.Generator().manual_seed(cfg.train.seed)
    loader = DataLoader(
        train_set,
        batch_size=per_worker,
        sampler=sampler,
        shuffle=sampler is None,
        generator=generator,
        drop_last=True,
    )
    if len(loader) == 0:
        raise ValueError(f"train.batch_size={cfg.train.batch_size} exceeds the training set")

    best: dict[str, float] = {}
    step, epoch, seen, train_time, loss_window = 0, 0, 0, 0.0, []
    trained.train()
    while step < steps:
        if sampler is not None:
            sampler.set_epoch(epoch)
        for batch in loader:
            start = time.perf_counter()
            kwargs, labels = _batch_kwargs(batch, device)
            loss = loss_fn(trained(**kwargs), labels)
            if not torch.isfinite(loss):
                raise NonFiniteLossError(f"training loss is {loss.item()} at step {step + 1}")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.train.max_grad_norm:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.max_grad_norm)
            optimizer.step()
            scheduler.step()
            train_time += time.perf_counter() - start
            step, seen = step + 1, seen + len(labels) * world_size
            loss_window.append(loss.item())
            if step % cfg.train.eval_every == 0 or step == steps:
                val = evaluate(
                    model,
                    task.splits["validation"],
                    task.spec.metrics,
                    cfg.train.eval_batch_size,
                    device,
                )
                improved = not best or sign * val[metric] > sign * best[f"val_{metric}"]
                if improved:
                    best = {f"val_{k}": v for k, v in val.items()} | {"step": step}
                # Tune's progress table shows the first few keys: the searched metric first
                metrics = {
                    f"best_val_{metric}": best[f"val_{metric}"],
                    f"val_{metric}": val[metric],
                    "train_loss": float(np.mean(loss_window)),
                    "step": step,
                }
                metrics.update({f"val_{k}": v for k, v in val.items()})
                metrics.update({f"best_{k}": v for k, v in best.items()})
                metrics.update(epoch=epoch, train_samples_per_s=seen / train_time)
                loss_window = []
                if improved and rank == 0:
                    with tempfile.TemporaryDirectory() as folder:
                        save_checkpoint(model, cfg, Path(folder))
                        report(metrics, Path(folder))
                else:
                    report(metrics, None)
            if step >= steps:
                break
        epoch += 1
    return best


def save_checkpoint(model: PromptedModel, cfg: ExperimentConfig, folder: Path) -> None:
    """Trainable tensors (safetensors) and the resolved config (YAML) - no pickles."""
    model.save_trainable(folder)
    resolved = cfg.model_copy(update={"method": cfg.method.resolve(model.dims)})
    (folder / CONFIG_FILE).write_text(
        yaml.safe_dump(resolved.model_dump(mode="json"), sort_keys=False)
    )


def load_checkpoint(folder: Path, task: TokenizedTask) -> tuple[ExperimentConfig, PromptedModel]:
    """Rebuild a trained model from a checkpoint folder."""
    cfg = ExperimentConfig.model_validate(yaml.safe_load((Path(folder) / CONFIG_FILE).read_text()))
    model = build_model(cfg, task)
    model.load_trainable(folder)
    return cfg, model
