"""Which examples each training step sees, for one worker or several (DDP)."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from raypeft.config.schema import TrainConfig


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


def training_batches(
    dataset: Dataset, train: TrainConfig, rank: int = 0, world_size: int = 1
) -> tuple[GlobalBatchSampler, DataLoader]:
    """The loader of this worker's share of each global batch, and the sampler that places it
    at a step (:meth:`GlobalBatchSampler.at_step`)."""
    sampler = GlobalBatchSampler(len(dataset), train.batch_size, train.seed, rank, world_size)
    if sampler.per_epoch == 0:
        raise ValueError(f"train.batch_size={train.batch_size} exceeds the training set")
    # its own generator: DataLoader draws a seed from the global RNG per iteration, which
    # would make a resumed trial's RNG (dropout in some methods) drift from an uninterrupted one
    return sampler, DataLoader(dataset, batch_sampler=sampler, generator=torch.Generator())
