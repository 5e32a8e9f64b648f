"""A task's splits as the training loop reads them: tensors per example, plus the method's
per-example features (computed once per task)."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset

from raypeft.config.schema import ExperimentConfig
from raypeft.data import TokenizedTask
from raypeft.modeling.backbones import frozen_backbone


def ensure_features(
    task: TokenizedTask, cfg: ExperimentConfig, splits: tuple[str, ...] | None = None
) -> None:
    """Compute the method's per-example features the task does not hold yet (of ``splits``,
    default all).

    In a search the driver has computed them once for every trial (see
    :func:`raypeft.search.run.precompute_features`); this covers direct use (tests, scripts)
    and a checkpoint's resolved config, whose feature keys can differ from the driver's (IDPG's
    ``pooling: auto`` is saved as the pooling it resolved to).
    """
    for spec in cfg.method.feature_specs().values():
        held = task.features.setdefault(spec.key, {})
        for split in splits or tuple(task.splits):
            if split not in held:
                arrays = task.splits[split]
                held[split] = spec.compute(task.texts[split], arrays, frozen_backbone(cfg.model))


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


def to_device(batch: dict, device: torch.device) -> dict:
    """A batch (and its nested ``features``) on ``device``."""
    out = {}
    for key, value in batch.items():
        out[key] = to_device(value, device) if isinstance(value, dict) else value.to(device)
    return out
