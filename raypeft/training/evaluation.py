"""Evaluation: metrics of the current weights on a split, and which evaluation is the best."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import DataLoader

from raypeft.config.schema import EFFICIENCY_METRICS, ExperimentConfig, Objective
from raypeft.data.metrics import METRIC_MODE, compute_metrics
from raypeft.modeling.prompted import PromptedModel
from raypeft.training.datasets import ArrayDataset, to_device


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
        batch = to_device(batch, device)
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
    return split_metrics(metric_names, outputs, labels, loss_sum, elapsed)


def split_metrics(
    metric_names: tuple[str, ...],
    outputs: list[np.ndarray],
    labels: list[np.ndarray],
    loss_sum: float,
    seconds: float,
) -> dict[str, float]:
    """The metrics of one split from its batches' predictions and labels, the sum of their
    losses weighted by batch size, and the time they took (a pack's members evaluate in one
    pass each: :mod:`raypeft.training.pack`)."""
    y_all = np.concatenate(labels)
    metrics = compute_metrics(metric_names, np.concatenate(outputs), y_all)
    metrics["loss"] = loss_sum / len(y_all)
    metrics["samples_per_s"] = len(y_all) / seconds
    return metrics


@dataclass(frozen=True)
class TargetMetric:
    """The validation metric that picks a trial's best evaluation (and its checkpoint)."""

    name: str
    mode: str  # "max" or "min"

    @classmethod
    def of(cls, cfg: ExperimentConfig, primary: str) -> TargetMetric:
        """The first objective an evaluation measures (``search.metric``, or the first such
        of ``search.objectives``; default: the task's ``primary`` metric), in its direction.
        Where every objective is an efficiency figure (throughput, parameters), which no
        evaluation can improve, the task's primary metric keeps the checkpoint."""
        objectives = cfg.search.objective_list(primary)
        measured = [o for o in objectives if o.metric not in EFFICIENCY_METRICS]
        chosen = measured[0] if measured else Objective(metric=primary)
        return cls(chosen.metric, objective_mode(chosen))

    @property
    def result_key(self) -> str:
        """The key of this metric's value at the kept checkpoint in a trial's reports."""
        return f"best_val_{self.name}"

    def improves(self, val: dict[str, float], best: dict[str, float]) -> bool:
        """Whether validation metrics ``val`` beat ``best`` (a tie does not; none yet does)."""
        sign = 1 if self.mode == "max" else -1
        return not best or sign * val[self.name] > sign * best[f"val_{self.name}"]


def objective_mode(objective: Objective) -> str:
    """An objective's direction: its own ``mode`` (a single ``search.metric`` carries
    ``search.mode``), else the metric's natural one (accuracy up, loss and parameters down)."""
    natural = EFFICIENCY_METRICS.get(objective.metric) or METRIC_MODE.get(objective.metric)
    return objective.mode or natural or "max"


def best_record(val: dict[str, float], step: int) -> dict[str, float]:
    """What a trial keeps of its best evaluation: the validation metrics and the step."""
    return {f"val_{k}": v for k, v in val.items()} | {"step": step}


def evaluation_metrics(
    target: TargetMetric,
    val: dict[str, float],
    best: dict[str, float],
    train_loss: float,
    step: int,
) -> dict[str, float]:
    """What one evaluation reports: this evaluation's and the best one's metrics."""
    # Tune's progress table shows the first few keys: the searched metric first
    metrics = {
        target.result_key: best[f"val_{target.name}"],
        f"val_{target.name}": val[target.name],
        "train_loss": train_loss,
        "step": step,
    }
    metrics.update({f"val_{k}": v for k, v in val.items()})
    metrics.update({f"best_{k}": v for k, v in best.items()})
    return metrics
