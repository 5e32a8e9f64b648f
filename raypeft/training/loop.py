"""The training loop every method shares: plain PyTorch, one worker or DDP.

It knows nothing of Tune's searcher: it calls ``report(metrics, checkpoint_dir)`` after each
evaluation, and the caller decides where that goes (Ray Tune, Ray Train, or a test).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import psutil
import torch
import yaml
from safetensors.torch import save_file
from torch.utils.data import DataLoader, Dataset, Sampler
from transformers import get_linear_schedule_with_warmup

from raypeft.config.redact import redact_config
from raypeft.config.schema import ExperimentConfig
from raypeft.data import TokenizedTask
from raypeft.data.metrics import METRIC_MODE, compute_metrics
from raypeft.modeling.backbones import load_backbone, load_tokenizer
from raypeft.modeling.prompted import TRAINABLE_FILE, PromptedModel
from raypeft.training.result_keys import FAILURE_KEY, RESUMED_KEY
from raypeft.training.resume import (
    LoopState,
    has_resume_state,
    load_resume_state,
    save_resume_state,
)

CONFIG_FILE = "config.yaml"
TASK_FILE = "task.json"  # what inference needs of the task: label names, verbalizers, metrics

Reporter = Callable[[dict, Path | None], None]


def build_model(cfg: ExperimentConfig, task: TokenizedTask) -> PromptedModel:
    """Frozen backbone + head + the configured method, seeded by ``train.seed``."""
    backbone = load_backbone(cfg.model, task.num_labels, task.spec.problem, seed=cfg.train.seed)
    model = PromptedModel(backbone, cfg.method)
    if model.kind == "seq2seq":
        model.verbalizers = task.verbalizers
        model.tokenizer = load_tokenizer(cfg.model.name, cfg.model.revision)
    return model


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


def ensure_features(task: TokenizedTask, cfg: ExperimentConfig) -> None:
    """Compute the method's per-example features the task does not hold yet.

    In a search the driver has computed them once for every trial (see
    :func:`raypeft.search.run.precompute_features`); this covers direct use (tests, scripts).
    """
    for spec in cfg.method.feature_specs().values():
        if spec.key not in task.features:
            task.features[spec.key] = {
                split: spec.compute(task.texts[split], arrays, cfg.model)
                for split, arrays in task.splits.items()
            }


class ArrayDataset(Dataset):
    """One split as a dataset of dicts; ``features`` holds the method's per-example inputs."""

    KEYS = ("input_ids", "attention_mask", "token_type_ids", "labels", "target_ids")

    def __init__(self, arrays: dict[str, np.ndarray], features: dict[str, np.ndarray]):
        self.arrays = {k: arrays[k] for k in self.KEYS if k in arrays}
        self.features = features

    def __len__(self) -> int:
        return len(self.arrays["labels"])

    def __getitem__(self, i: int) -> dict:
        item = {k: torch.as_tensor(np.asarray(v[i])) for k, v in self.arrays.items()}
        if self.features:
            item["features"] = {
                k: torch.as_tensor(np.asarray(v[i])) for k, v in self.features.items()
            }
        return item


def split_dataset(task: TokenizedTask, cfg: ExperimentConfig, split: str) -> ArrayDataset:
    """A split with the features the trial's method asked for, under the method's names."""
    specs = cfg.method.feature_specs()
    features = {name: task.features[spec.key][split] for name, spec in specs.items()}
    return ArrayDataset(task.splits[split], features)


def _to_device(batch: dict, device: torch.device) -> dict:
    out = {}
    for key, value in batch.items():
        out[key] = _to_device(value, device) if isinstance(value, dict) else value.to(device)
    return out


class GlobalBatchSampler(Sampler[list[int]]):
    """The same global batches for any number of workers, each worker taking its share.

    Epoch ``e`` shuffles the training set with seed ``(seed, e)`` and cuts it into batches of
    ``batch_size`` (the global batch); worker ``rank`` takes slice ``rank`` of each. So DDP
    over N workers averages gradients over exactly the examples one worker would see, and a
    resumed trial continues on the very batches it would have trained on (``start``).
    """

    def __init__(self, size: int, batch_size: int, seed: int, rank: int = 0, world_size: int = 1):
        if batch_size % world_size:
            raise ValueError(f"batch size {batch_size} is not divisible by {world_size} workers")
        self.size, self.batch_size, self.seed = size, batch_size, seed
        self.rank, self.world_size = rank, world_size
        self.per_worker = batch_size // world_size
        self.per_epoch = size // batch_size  # drop_last: every step is a full global batch
        self.epoch, self.start = 0, 0

    def at_step(self, step: int) -> None:
        """Position the sampler at global step ``step`` (counted from the first epoch)."""
        self.epoch, self.start = divmod(step, self.per_epoch)

    def __len__(self) -> int:
        return self.per_epoch - self.start

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        order = torch.randperm(self.size, generator=generator).tolist()
        for b in range(self.start, self.per_epoch):
            first = b * self.batch_size + self.rank * self.per_worker
            yield order[first : first + self.per_worker]


@torch.no_grad()
def evaluate(
    model: PromptedModel,
    dataset: ArrayDataset,
    metric_names: tuple[str, ...],
    batch_size: int,
    device: torch.device,
) -> dict[str, float]:
    """Metrics of the current weights on one split, plus its loss and samples/s."""
    was_training = model.training
    model.eval()
    outputs, labels, loss_sum = [], [], 0.0
    start = time.perf_counter()
    for batch in DataLoader(dataset, batch_size=batch_size):
        batch = _to_device(batch, device)
        y = batch["labels"]
        out = model(**batch)
        loss_sum += out.loss.item() * len(y)
        # a head's logits are its predictions: one forward pass; seq2seq models generate
        outputs.append(
            model.predict(**batch) if model.kind == "seq2seq" else out.logits.float().cpu().numpy()
        )
        labels.append(y.cpu().numpy())
    elapsed = time.perf_counter() - start
    model.train(was_training)
    y_all = np.concatenate(labels)
    metrics = compute_metrics(metric_names, np.concatenate(outputs), y_all)
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
    resume_from: Path | None = None,
) -> dict[str, float]:
    """Train one configuration; evaluate every ``train.eval_every`` steps and report.

    Every evaluation reports a checkpoint folder (from rank 0): the best trainable tensors so
    far as safetensors with the resolved config and the task's labels, plus ``resume/``, the
    state a restarted trial continues from (:mod:`raypeft.training.resume`). ``resume_from`` is
    such a folder. ``wrap_model`` lets Ray Train wrap the model in DDP; ``rank`` and ``world_size``
    split each global batch. Returns the best validation metrics.
    """
    device = device or torch.device("cpu")
    started = time.perf_counter()
    memory = PeakMemory(device)
    torch.manual_seed(cfg.train.seed)
    ensure_features(task, cfg)
    model = build_model(cfg, task).to(device)
    trainable_params = model.method.config.num_params(model.dims)  # task head excluded
    optimizer = build_optimizer(model, cfg)
    steps = cfg.train.max_steps
    scheduler = get_linear_schedule_with_warmup(
        optimizer, math.ceil(cfg.train.warmup_ratio * steps), steps
    )
    loop, resumed_at = LoopState(), None
    if has_resume_state(resume_from):
        current, loop = load_resume_state(resume_from, optimizer, scheduler)
        model.load_trainable_state_dict(current)
        loop.best_state = _load_best_state(resume_from)
        resumed_at = loop.step
    trained = wrap_model(model) if wrap_model else model

    metric = cfg.search.metric or task.spec.primary_metric
    sign = 1 if (cfg.search.mode or METRIC_MODE.get(metric, "max")) == "max" else -1
    train_set = split_dataset(task, cfg, "train")
    val_set = split_dataset(task, cfg, "validation")
    sampler = GlobalBatchSampler(
        len(train_set), cfg.train.batch_size, cfg.train.seed, rank, world_size
    )
    if sampler.per_epoch == 0:
        raise ValueError(f"train.batch_size={cfg.train.batch_size} exceeds the training set")
    # its own generator: DataLoader draws a seed from the global RNG per iteration, which
    # would make a resumed trial's RNG (dropout in some methods) drift from an uninterrupted one
    loader = DataLoader(train_set, batch_sampler=sampler, generator=torch.Generator())

    loss_window: list[float] = []
    trained.train()
    while loop.step < steps:
        sampler.at_step(loop.step)
        for batch in loader:
            start = time.perf_counter()
            batch = _to_device(batch, device)
            loss = trained(**batch).loss
            if not _finite_everywhere(loss, world_size):
                report(
                    {
                        FAILURE_KEY: f"NonFiniteLossError: the training loss became "
                        f"{loss.item()} at step {loop.step + 1} (a learning rate too high?)",
                        "step": loop.step,
                    },
                    None,
                )
                return loop.best
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.train.max_grad_norm:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.max_grad_norm)
            optimizer.step()
            scheduler.step()
            loop.train_time += time.perf_counter() - start
            memory.sample()
            loop.step += 1
            loop.seen += len(batch["labels"]) * world_size
            loss_window.append(loss.item())
            step = loop.step
            if step % cfg.train.eval_every == 0 or step == steps:
                val = evaluate(
                    model,
                    val_set,
                    task.spec.metrics,
                    cfg.train.eval_batch_size,
                    device,
                )
                best = loop.best
                improved = not best or sign * val[metric] > sign * best[f"val_{metric}"]
                if improved:
                    loop.best = best = {f"val_{k}": v for k, v in val.items()} | {"step": step}
                    current = model.trainable_state_dict()
                    loop.best_state = {k: v.clone() for k, v in current.items()}
                # Tune's progress table shows the first few keys: the searched metric first
                metrics = {
                    f"best_val_{metric}": best[f"val_{metric}"],
                    f"val_{metric}": val[metric],
                    "train_loss": _mean_over_workers(float(np.mean(loss_window)), world_size),
                    "step": step,
                }
                metrics.update({f"val_{k}": v for k, v in val.items()})
                metrics.update({f"best_{k}": v for k, v in best.items()})
                # efficiency: what the searcher can trade accuracy against (see search.objectives)
                metrics.update(
                    epoch=(step - 1) // sampler.per_epoch,
                    train_samples_per_s=loop.seen / loop.train_time,
                    eval_samples_per_s=val["samples_per_s"],
                    trainable_params=trainable_params,
                    peak_memory_mb=memory.peak_mb(),
                    wall_time_s=time.perf_counter() - started,
                )
                if resumed_at is not None:
                    metrics[RESUMED_KEY] = resumed_at
                loss_window = []
                if rank == 0:
                    with tempfile.TemporaryDirectory() as folder:
                        save_checkpoint(model, cfg, Path(folder), task, trainable=loop.best_state)
                        save_resume_state(
                            Path(folder), model.trainable_state_dict(), optimizer, scheduler, loop
                        )
                        report(metrics, Path(folder))
                else:
                    report(metrics, None)
            if loop.step >= steps:
                break
    return loop.best


def _finite_everywhere(loss: torch.Tensor, world_size: int) -> bool:
    """Whether the loss is finite on every worker (all of them must stop together: a worker
    leaving alone would leave the others waiting in DDP's all-reduce)."""
    finite = bool(torch.isfinite(loss))
    if world_size == 1:
        return finite
    flag = torch.tensor([0.0 if finite else 1.0], device=loss.device)
    torch.distributed.all_reduce(flag)
    return flag.item() == 0


def _mean_over_workers(value: float, world_size: int) -> float:
    """A worker's loss is over its share of the batch: the global batch's is their mean."""
    if world_size == 1:
        return value
    tensor = torch.tensor([value], dtype=torch.float64)
    torch.distributed.all_reduce(tensor)
    return tensor.item() / world_size


def _load_best_state(folder: Path) -> dict[str, torch.Tensor] | None:
    from safetensors.torch import load_file

    path = Path(folder) / TRAINABLE_FILE
    return load_file(str(path)) if path.is_file() else None


class PeakMemory:
    """Peak memory of one trial: CUDA's allocator peak, or the process's sampled RSS on CPU.

    ``ru_maxrss`` would not do on CPU: Tune reuses trial actors, so the process-lifetime
    maximum would carry over from earlier trials. RSS is sampled after every step instead.
    """

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.process = psutil.Process(os.getpid())
        self.peak = 0
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(device)
        self.sample()

    def sample(self) -> None:
        if not self.cuda:
            self.peak = max(self.peak, self.process.memory_info().rss)

    def peak_mb(self) -> float:
        peak = torch.cuda.max_memory_allocated() if self.cuda else self.peak
        return peak / 2**20


def task_metadata(task: TokenizedTask) -> dict:
    """What inference needs to know of the task, without loading its data."""
    return {
        "name": task.spec.name,
        "problem": task.spec.problem,
        "num_labels": task.num_labels,
        "label_names": task.label_names,
        "verbalizers": task.verbalizers,
        "metrics": list(task.spec.metrics),
        "text_pair": task.spec.text_pair_column is not None,
    }


def save_checkpoint(
    model: PromptedModel,
    cfg: ExperimentConfig,
    folder: Path,
    task: TokenizedTask | None = None,
    trainable: dict[str, torch.Tensor] | None = None,
) -> None:
    """Trainable tensors (safetensors: ``trainable``, default the model's current ones), the
    resolved config (YAML) and the task's labels (JSON) - no pickles."""
    save_file(
        trainable if trainable is not None else model.trainable_state_dict(),
        str(Path(folder) / TRAINABLE_FILE),
    )
    resolved = cfg.model_copy(update={"method": cfg.method.resolve(model.dims)})
    (folder / CONFIG_FILE).write_text(
        yaml.safe_dump(redact_config(resolved.model_dump(mode="json")), sort_keys=False)
    )
    if task is not None:
        (folder / TASK_FILE).write_text(json.dumps(task_metadata(task), indent=2))


def load_checkpoint(folder: Path, task: TokenizedTask) -> tuple[ExperimentConfig, PromptedModel]:
    """Rebuild a trained model from a checkpoint folder."""
    cfg = ExperimentConfig.model_validate(yaml.safe_load((Path(folder) / CONFIG_FILE).read_text()))
    model = build_model(cfg, task)
    model.load_trainable(folder)
    return cfg, model
