"""Timing training steps at a trial's shape: a full-length random batch, and the median step
over a span with the device's peak memory.

What the step benchmarks (``benchmarks.device.gpu_step``, ``benchmarks.device.packing``)
and the search's GPU probe (:mod:`raypeft.training.probe`) measure with. Only torch is
imported (no psutil, Ray or MLflow), so the benchmarks run on a GPU machine that has little
more than torch.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from raypeft.modeling.prompted import PromptedModel

TARGET_TOKENS = 3  # a seq2seq label as text: a word and the end token
MiB = 2**20


def random_batch(
    model: PromptedModel, batch_size: int, seq_len: int, device: torch.device | str
) -> dict:
    """A full-length batch of random token ids, labels and the method's per-example features
    (computed once per task before the trials, e.g. IDPG's M(x): random vectors here)."""
    b, s = batch_size, seq_len
    vocab = model.dims.vocab_size
    gen = torch.Generator().manual_seed(0)
    batch = {
        "input_ids": torch.randint(5, vocab, (b, s), generator=gen),
        "attention_mask": torch.ones(b, s, dtype=torch.long),
    }
    if model.kind == "seq2seq":
        batch["target_ids"] = torch.randint(5, vocab, (b, TARGET_TOKENS), generator=gen)
    else:
        batch["token_type_ids"] = torch.zeros(b, s, dtype=torch.long)
        batch["labels"] = torch.randint(0, 2, (b,), generator=gen)
    specs = model.method.config.feature_specs()
    if specs:
        width = model.dims.hidden_size
        batch["features"] = {name: torch.randn(b, width, generator=gen) for name in specs}
    return {k: _to(v, torch.device(device)) for k, v in batch.items()}


def _to(value, device: torch.device):
    if isinstance(value, dict):
        return {k: v.to(device) for k, v in value.items()}
    return value.to(device)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA runs asynchronously; a CPU needs no wait)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(
    step: Callable[[], object], steps: int, device: torch.device, wait: Callable | None = None
) -> dict:
    """Time ``steps`` calls of ``step`` (after ``wait()``, e.g. a barrier shared with other
    processes stepping on the same device): the median step, the span's start and end
    (``time.time()``, comparable between processes), and on CUDA the most memory allocated
    during the span (``peak_mib``; None on a CPU, where it is not measured in-process)."""
    synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    if wait is not None:
        wait()
    times = []
    start = time.time()
    for _ in range(steps):
        begin = time.perf_counter()
        step()
        synchronize(device)
        times.append(time.perf_counter() - begin)
    end = time.time()
    peak = torch.cuda.max_memory_allocated(device) / MiB if device.type == "cuda" else None
    return {"step_s": statistics.median(times), "start": start, "end": end, "peak_mib": peak}
