"""The numeric precision a trial's frozen backbone computes in (``train.precision``).

Only the frozen backbone runs in low precision: its weights are kept in :func:`backbone_dtype`
and every forward runs under :func:`autocast`. What trains (the method's tensors, the task
head), its gradients and the optimizer's state stay float32, so a checkpoint is float32 whatever
the precision. ``auto`` picks bf16 only where the hardware runs it fast, found by looking at the
hardware (:func:`fast_bf16`), never assumed.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from functools import lru_cache
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from raypeft.config.schema import PRECISIONS
from raypeft.errors import ConfigError

Precision = Literal["fp32", "bf16", "fp16"]  # what a setting resolves to on a device

_DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}

# The /proc/cpuinfo flag of x86 CPUs with bf16 tile instructions (AMX, Sapphire Rapids and
# later). AVX512-BF16 alone is not enough: on this project's 2-core AVX512-BF16 machine (no AMX)
# a MiniLM step under bf16 autocast took 0.71-0.76x fp32's time on 2026-11-23 and 1.33-1.46x
# on 2026-11-26, same torch and flags, so auto cannot count on it; bf16 stays one setting away.
_BF16_CPU_FLAGS = frozenset({"amx_bf16"})


def resolve_precision(
    requested: str, device: torch.device | str, *, strict: bool = True
) -> Precision:
    """The precision a trial on ``device`` runs in: ``auto`` becomes ``bf16`` where the hardware
    runs it fast (:func:`fast_bf16`), else ``fp32``; an explicit value is kept when ``device``
    can run it, and is a :class:`ConfigError` otherwise (``strict=False``: resolved as
    ``auto`` instead, for evaluating elsewhere a model trained on a GPU)."""
    device = torch.device(device)
    if requested == "auto":
        return "bf16" if fast_bf16(device) else "fp32"
    if requested not in _DTYPES:
        raise ConfigError(
            f"train.precision: must be one of {', '.join(PRECISIONS)}, got {requested!r}"
        )
    problem = _unsupported(requested, device)
    if problem is None:
        return requested  # type: ignore[return-value]
    if strict:
        raise ConfigError(f"train.precision: {problem}")
    return resolve_precision("auto", device)


def _unsupported(precision: str, device: torch.device) -> str | None:
    """Why ``device`` cannot run ``precision`` (None when it can)."""
    # fp16 exists for GPUs without bf16 (compute capability 7.x); on a CPU it is emulated and
    # would need a loss scaler for nothing: bf16 (or auto) is the CPU's low precision.
    if precision == "fp16" and device.type != "cuda":
        return f"fp16 needs a CUDA GPU, and this trial runs on {device.type}; use bf16 or auto"
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return f"bf16 is not supported by {torch.cuda.get_device_name(device)}; use fp16 or auto"
    return None


def fast_bf16(device: torch.device | str) -> bool:
    """Whether ``device`` runs bf16 reliably faster than fp32: a CUDA GPU of compute capability
    8 or more (Ampere, Hopper...), or a CPU with AMX (AVX512-BF16 alone was measured both
    faster and slower than fp32 on one machine, so it does not count)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device)[0] >= 8
    if device.type == "cpu":
        return bool(cpu_flags() & _BF16_CPU_FLAGS)
    return False


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as Linux reports them (empty where there is no /proc/cpuinfo:
    torch 2.13 exposes no bf16 query, and guessing would slow such machines down)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return frozenset(flags)


def compute_dtype(precision: str) -> torch.dtype:
    """The dtype a resolved ``precision`` computes matrix products in."""
    if precision not in _DTYPES:
        raise ValueError(f"a resolved precision (fp32, bf16, fp16) is needed, got {precision!r}")
    return _DTYPES[precision]


def backbone_dtype(precision: str, device: torch.device | str) -> torch.dtype:
    """The dtype the frozen backbone's weights are kept in under a resolved ``precision``.

    On a GPU the low-precision dtype itself: half the weight memory (several trials share a
    GPU) and no cast of every weight on every forward. On a CPU float32, with autocast doing
    the low-precision products: measured on an AVX512-BF16 CPU (MiniLM PT/DePT step), autocast
    over float32 weights ran 0.65-0.74x of fp32, bf16 weights 0.71-0.82x, and float32 weights
    keep embeddings and LayerNorm exact."""
    dtype = compute_dtype(precision)
    return dtype if torch.device(device).type == "cuda" else torch.float32


def cast_frozen(module: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Cast ``module``'s frozen floating-point parameters to ``dtype`` (:func:`backbone_dtype`),
    in place; the parameters that train stay float32. Buffers are left alone: the floating
    ones are small and some must stay float32 (rotary frequencies)."""
    for param in module.parameters():
        if not param.requires_grad and param.is_floating_point():
            param.data = param.data.to(dtype)
    return module


@contextmanager
def autocast(precision: str, device: torch.device | str) -> Iterator[None]:
    """Run the forward passes inside in ``precision`` (nothing changes for fp32)."""
    if precision == "fp32":
        with nullcontext():
            yield
        return
    with torch.autocast(torch.device(device).type, dtype=compute_dtype(precision)):
        yield
