"""The device a step benchmark runs on: choosing it, describing it, waiting for it, and its
peak memory."""

from __future__ import annotations

import torch

from benchmarks.common.machine import cpu_name
from benchmarks.common.memory import MiB, peak_rss_bytes


def pick_device(name: str) -> torch.device:
    """``auto``: CUDA where there is a GPU, else the CPU; any other name as given."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def device_line(device: torch.device, threads: int) -> str:
    """What ran the benchmark, for the table's caption."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return f"{props.name} ({props.total_memory / 2**30:.0f} GiB), torch {torch.__version__}"
    return f"CPU {cpu_name()}, {threads} threads, torch {torch.__version__}"


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA runs asynchronously; a CPU needs no wait)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak_memory(device: torch.device) -> None:
    """Start measuring CUDA's peak allocation afresh (a CPU's peak RSS cannot be reset here)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_mib(device: torch.device) -> float | None:
    """CUDA: the most memory allocated since the reset; CPU: this process's peak resident
    set (meaningful in a fresh process only; the caller decides)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / MiB
    peak = peak_rss_bytes()
    return None if peak is None else peak / MiB
