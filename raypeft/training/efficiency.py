"""What a trial costs, reported with every evaluation: the searcher can trade accuracy against
it (objectives such as ``peak_memory_mb``: :func:`raypeft.search.objectives.resolve_objectives`)."""

from __future__ import annotations

import os
import time

import psutil
import torch

from raypeft.modeling.prompted import PromptedModel
from raypeft.training.resume import LoopState


class PeakMemory:
    """Peak memory of one trial: CUDA's allocator peak, or the process's sampled RSS on CPU.

    ``ru_maxrss`` would not do on CPU: Tune reuses trial actors, so the process-lifetime
    maximum would carry over from earlier trials. RSS is sampled after every step instead.
    """

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device
        self.process = psutil.Process(os.getpid())
        self.peak = 0
        if self.cuda:
            # the meter starts before the model moves to the GPU, and CUDA's allocator
            # statistics exist only once CUDA is initialised: resetting them in a fresh trial
            # process fails with "Invalid device argument" (seen on an H200, 2026-11-28)
            torch.cuda.init()
            torch.cuda.reset_peak_memory_stats(device)
        self.sample()

    def sample(self) -> None:
        if not self.cuda:
            self.peak = max(self.peak, self.process.memory_info().rss)

    def peak_mb(self) -> float:
        peak = torch.cuda.max_memory_allocated(self.device) if self.cuda else self.peak
        return peak / 2**20


class TrialMeter:
    """A trial's wall time (from its start, over every process that ran it) and peak memory
    (sampled after every step)."""

    def __init__(self, device: torch.device, memory: PeakMemory | None = None):
        self.started = time.perf_counter()
        # the trials of a pack share their process, and so its memory: one PeakMemory for all
        # (a new one resets CUDA's peak, which the other members are measuring)
        self.memory = memory or PeakMemory(device)

    def sample_memory(self) -> None:
        """Sample memory after a step (CPU: RSS; CUDA keeps its own peak)."""
        self.memory.sample()

    def metrics(
        self, loop: LoopState, val: dict[str, float], model: PromptedModel
    ) -> dict[str, float]:
        """Throughput of training (``loop``) and evaluation (``val``), the method's size (its
        closed-form count: the task head is left out, as in the papers), memory and the trial's
        wall time so far, which ``loop`` keeps for its checkpoint: a resumed trial's
        ``wall_time_s`` goes on from its checkpoint's (the learning-curve tables pace replays
        by it, :mod:`raypeft.search.simulate.table`)."""
        loop.wall_time = loop.wall_before + time.perf_counter() - self.started
        return dict(
            train_samples_per_s=loop.seen / loop.train_time,
            eval_samples_per_s=val["samples_per_s"],
            trainable_params=model.method.config.num_params(model.dims),
            peak_memory_mb=self.memory.peak_mb(),
            wall_time_s=loop.wall_time,
        )
