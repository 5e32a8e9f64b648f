"""The files-and-data stage: the task, its files and every row ``tune`` will train on.

The same checks ``tune`` runs when it loads the task, so that ``validate`` catches a one-class
training set, a class id out of range or a batch larger than the training split too.
"""

from __future__ import annotations

from dataclasses import dataclass

from raypeft.config.schema import ExperimentConfig
from raypeft.data.tasks import (
    TaskSpec,
    check_batch_fits,
    check_task_files,
    infer_labels,
    load_splits,
    resolve_task_spec,
)
from raypeft.search.objectives import resolve_constraints, resolve_objectives


@dataclass(frozen=True)
class CheckedTask:
    """The task as the search will see it."""

    spec: TaskSpec  # with its number of labels
    sizes: dict[str, int]  # examples per split, after task.max_*_examples


def check_task(cfg: ExperimentConfig) -> CheckedTask:
    """The task resolves and reports the metrics the search names; its local files exist and
    parse; every split's texts and labels are usable (2+ classes, ids in range, one kind of
    label); the largest batch the space can sample fits the training split."""
    spec = resolve_task_spec(cfg.task)
    resolve_objectives(cfg, spec.metrics)  # search.metric / objectives / constraints name
    resolve_constraints(cfg, spec.metrics)  # metrics this task reports
    check_task_files(cfg.task)  # cheap first: exist, readable, not empty, columns in the header
    splits = load_splits(cfg.task, spec)  # every row, as the search loads it
    spec, _ = infer_labels(splits, spec)  # the classes left after task.max_*_examples
    sizes = {split: len(ds) for split, ds in splits.items()}
    check_batch_fits(cfg, sizes["train"])
    return CheckedTask(spec, sizes)
