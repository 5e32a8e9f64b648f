"""The training loop every method shares: plain PyTorch, one worker or DDP.

It knows nothing of Tune's searcher: it calls ``report(metrics, checkpoint_dir)`` after each
evaluation, and the caller decides where that goes (Ray Tune, Ray Train, or a test). Read
:func:`train` top to bottom: set up, then step, evaluate and report until ``train.max_steps``.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

from raypeft.config.schema import ExperimentConfig, TrainConfig
from raypeft.data import TokenizedTask
from raypeft.modeling.build import build_model
from raypeft.modeling.precision import resolve_precision
from raypeft.modeling.prompted import PromptedModel
from raypeft.training.checkpoints import restore_trial, write_trial_checkpoint
from raypeft.training.datasets import ensure_features, split_dataset, to_device
from raypeft.training.distributed import finite_everywhere, mean_over_workers
from raypeft.training.efficiency import TrialMeter
from raypeft.training.evaluation import TargetMetric, best_record, evaluate, evaluation_metrics
from raypeft.training.optimizer import (
    build_optimizer,
    build_scheduler,
    loss_scaler,
    optimizer_step,
)
from raypeft.training.phases import PhaseTimer
from raypeft.training.result_keys import (
    EVALUATION_KEY,
    FAILURE_KEY,
    PRECISION_KEY,
    RESTARTED_KEY,
    RESUMED_KEY,
    TRIAL_STEPS_KEY,
    evaluation_number,
)
from raypeft.training.resume import LoopState
from raypeft.training.sampler import GlobalBatchSampler, training_batches

Reporter = Callable[[dict, Path | None], None]


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
    phases: PhaseTimer | None = None,
) -> dict[str, float]:
    """Train one configuration; evaluate every ``train.eval_every`` steps and report.

    Every evaluation reports a checkpoint folder from rank 0 (:mod:`raypeft.training.checkpoints`:
    the best model so far, and where training stands); ``resume_from`` is such a folder.
    ``wrap_model`` lets Ray Train wrap the model in DDP; ``rank`` and ``world_size`` split each
    global batch. The frozen backbone computes in ``train.precision`` resolved on ``device``
    (:mod:`raypeft.modeling.precision`; the model applies it in evaluation too), reported with
    every evaluation; what trains stays float32. Every report carries where the trial's seconds
    went (``phases``, the caller's timer: :mod:`raypeft.training.phases`). Returns the best
    validation metrics.
    """
    device = device or torch.device("cpu")
    phases = phases or PhaseTimer()
    meter = TrialMeter(device)
    torch.manual_seed(cfg.train.seed)
    with phases.phase("data"):  # per-example features, where a method needs them
        ensure_features(task, cfg)
    precision = resolve_precision(cfg.train.precision, device)
    with phases.phase("model_build"):  # the backbone built, or taken from the process's cache
        model = build_model(cfg, task, device=device, precision=precision).to(device)
    with phases.phase("train_setup"):
        optimizer = build_optimizer(model, cfg)
        scaler = loss_scaler(precision, device)  # fp16 only: bf16 and fp32 need no loss scaling
        scheduler = build_scheduler(optimizer, cfg.train)
        loop = restore_trial(resume_from, model, optimizer, scheduler)  # fresh, or where it was
        trained = wrap_model(model) if wrap_model else model
    with phases.phase("data"):
        train_set = split_dataset(task, cfg, "train")
        val_set = split_dataset(task, cfg, "validation")
        sampler, loader = training_batches(train_set, cfg.train, rank, world_size)
    target = TargetMetric.of(cfg, task.spec.primary_metric)

    losses: list[float] = []  # training losses since the last evaluation
    trained.train()
    batches = batches_from(loop, sampler, loader, cfg.train.max_steps)
    for batch in phases.timed("data", batches):  # the loader's time between the steps
        start = time.perf_counter()
        batch = to_device(batch, device)
        loss = trained(**batch).loss
        if not finite_everywhere(loss, world_size):
            report(diverged_result(loss, loop.step), None)  # ends the trial; Ray does not retry it
            return loop.best
        optimizer_step(loss, model, optimizer, scheduler, cfg.train.max_grad_norm, scaler)
        loop.count_step(len(batch["labels"]) * world_size, time.perf_counter() - start)
        meter.sample_memory()
        losses.append(loss.item())  # waits for the device: the step's time is all in
        phases.add("steps", time.perf_counter() - start)
        if loop.step % cfg.train.eval_every == 0 or loop.step == cfg.train.max_steps:
            with phases.phase("evaluation"):
                val = evaluate(model, val_set, task.spec.metrics, cfg.train.eval_batch_size, device)
                train_loss = mean_over_workers(float(np.mean(losses)), world_size)
                metrics = evaluation_result(
                    val,
                    train_loss,
                    loop,
                    target,
                    sampler.per_epoch,
                    meter,
                    model,
                    precision,
                    cfg.train,
                )
            losses = []
            state = (model, cfg, task, optimizer, scheduler, loop)  # what a checkpoint holds
            checkpoint_and_report(report, metrics, state, phases, rank)
    return loop.best


def checkpoint_and_report(
    report: Reporter, metrics: dict, state: tuple, phases: PhaseTimer, rank: int
) -> None:
    """Write the trial's checkpoint of ``state`` (:func:`write_trial_checkpoint`'s arguments
    after the folder; on rank 0 only) and report an evaluation's ``metrics`` with it and the
    trial's phases so far (this report's own time is counted in the next one's)."""
    with checkpoint_folder(rank) as folder:
        if folder is not None:
            with phases.phase("checkpoint_write"):
                write_trial_checkpoint(folder, *state)
        metrics.update(phases.result())
        with phases.phase("report"):
            report(metrics, folder)


def evaluation_result(
    val: dict[str, float],
    train_loss: float,
    loop: LoopState,
    target: TargetMetric,
    per_epoch: int,
    meter: TrialMeter,
    model: PromptedModel,
    precision: str,
    train_cfg: TrainConfig,
) -> dict:
    """What a trial reports after an evaluation (``val``: its validation metrics), the best
    evaluation kept in ``loop`` first. Shared by :func:`train` and the members of a pack
    (:mod:`raypeft.training.pack`), whose reports are those of a trial trained alone;
    ``train_cfg`` is the trial's own (its length and evaluation interval may be searched)."""
    if target.improves(val, loop.best):
        loop.keep_best(best_record(val, loop.step), model.trainable_state_dict())
    metrics = evaluation_metrics(target, val, loop.best, train_loss, loop.step)
    metrics["epoch"] = (loop.step - 1) // per_epoch
    metrics.update(meter.metrics(loop, val, model))
    metrics[PRECISION_KEY] = precision
    metrics[TRIAL_STEPS_KEY] = train_cfg.max_steps
    # the schedulers' clock: follows the steps, also when a trial started over from step 0
    metrics[EVALUATION_KEY] = evaluation_number(loop.step, train_cfg.eval_every)
    if loop.resumed_from is not None:
        metrics[RESUMED_KEY] = loop.resumed_from
    if loop.restarted_because is not None:
        metrics[RESTARTED_KEY] = loop.restarted_because
    return metrics


@contextmanager
def checkpoint_folder(rank: int = 0) -> Iterator[Path | None]:
    """A temporary folder for the trial's checkpoint on rank 0 (one copy is enough: DDP keeps
    the workers' models equal); ``None`` on the other workers."""
    if rank != 0:
        yield None
        return
    with tempfile.TemporaryDirectory() as folder:
        yield Path(folder)


def batches_from(
    loop: LoopState, sampler: GlobalBatchSampler, loader: DataLoader, steps: int
) -> Iterator[dict]:
    """Batches from the loop's step on, epoch after epoch, until it has taken ``steps``."""
    while loop.step < steps:
        sampler.at_step(loop.step)  # a resumed trial goes on with the batches it would have seen
        for batch in loader:
            yield batch
            if loop.step >= steps:
                return


def diverged_result(loss: torch.Tensor, step: int) -> dict:
    """The result that ends a trial whose loss became NaN or infinite at step ``step + 1``."""
    return {
        FAILURE_KEY: f"NonFiniteLossError: the training loss became "
        f"{loss.item()} at step {step + 1} (a learning rate too high?)",
        "step": step,
    }
