"""What one training step of each prompt method costs on a frozen backbone at real shapes, in
each precision, and what K trials sharing one device get done together.

Backbones are built from their configs (written out in :mod:`~benchmarks.device.steps`:
MiniLM-L6-H384, RoBERTa-base, T5-base, RoBERTa-large) with random weights, so nothing is
downloaded: a step's time and memory do not depend on the weights' values. Inputs are random
token ids (no tokenizer) of the full length ``--seq-len``; IDPG's sentence encodings, computed
once per task before any trial, are random vectors of the backbone's width.

Each step is the training loop's own step: raypeft's model (frozen backbone in the precision's
layout, :mod:`raypeft.modeling.precision`), forward under autocast, loss, backward, gradient
clipping and AdamW (:func:`raypeft.training.optimizer.optimizer_step`, with fp16's loss
scaler). Two tables, every ratio measured in this one run:

1. per backbone, method and precision: step time, samples/s, peak memory (CUDA: the most
   memory allocated during the steps; CPU: not measured in-process, "-"), and the speed
   against fp32 of the same method;
2. K trials sharing one device (``--share``): K separate processes, as Ray runs K trials of
   ``gpus_per_worker: 1/K`` (each its own model and CUDA context), start together and step
   concurrently; their total samples/s against K=1 measured the same way, and each process's
   peak memory (CUDA: allocated; CPU: peak resident set). On a CPU each process gets
   ``threads // K`` threads, as Ray would give each trial its share of the cores.

It imports only torch, transformers, pydantic and raypeft's training core (no Ray, MLflow,
Optuna or datasets), so it runs on a GPU machine that has none of them.

    python -m benchmarks.device.gpu_step                       # everything, on the GPU if any
    python -m benchmarks.device.gpu_step --backbones minilm --seq-len 64 --share 1,2
"""

from __future__ import annotations

import argparse
import os

import torch

from benchmarks.common.devices import device_line, pick_device
from benchmarks.common.processes import measure_together, together
from benchmarks.common.tables import markdown_table, right_aligned_after
from benchmarks.device.steps import (
    METHODS,
    REAL_BACKBONES,
    Setting,
    applicable,
    say_flushed,
    time_steps,
)
from raypeft.modeling.precision import resolve_precision

# ----------------------------------------------------------------------------- K trials


def _share_worker(setting: Setting, device: str, threads: int, barrier, results) -> None:
    """One of K trials sharing the device: its own process, model and (CUDA) context."""
    torch.set_num_threads(threads)
    results.put(time_steps(setting, torch.device(device), barrier))


def shared_run(setting: Setting, device: torch.device, k: int, threads: int) -> dict:
    """K processes stepping ``setting`` together: total samples/s over the span from the
    first start to the last end, each process's step time and peak memory."""
    per = max(1, threads // k)  # each trial its share of the cores, as Ray gives it
    got = measure_together(_share_worker, [(setting, str(device), per)] * k)
    return together(got) | {"peak_mib": max((r["peak_mib"] or 0) for r in got) or None}


# ----------------------------------------------------------------------------- tables


def mib_cell(value: float | None) -> str:
    """Memory in MiB, or "-" where it was not measured."""
    return "-" if value is None else f"{value:,.0f}"


STEP_HEADER = (
    "backbone", "method", "precision", "trainable", "step ms", "samples/s", "vs fp32", "peak MiB",
)  # fmt: skip
SHARE_HEADER = (
    "backbone", "method", "precision", "K", "step ms (each)", "total samples/s", "vs K=1",
    "peak MiB (each)",
)  # fmt: skip


def step_table(settings: list[Setting], device: torch.device, say) -> list[dict]:
    """Table 1: one row per setting, each measured in this process (a progress line as each
    is measured, the table at the end)."""
    rows, cells, fp32 = [], [], {}
    for setting in settings:
        names = [setting.backbone, setting.method, setting.precision]
        why = applicable(setting, device)
        if why:
            cells.append([*names, f"n/a: {why}", "", "", "", ""])
            continue
        r = time_steps(setting, device)
        speed = setting.batch_size / r["step_s"]
        key = (setting.backbone, setting.method)
        if setting.precision == "fp32":
            fp32[key] = speed
        ratio = f"{speed / fp32[key]:.2f}×" if key in fp32 else "-"
        peak = r["peak_mib"] if device.type == "cuda" else None  # CPU: RSS of the whole run
        step_ms = f"{1000 * r['step_s']:.1f}"
        cells.append([*names, f"{r['params']:,}", step_ms, f"{speed:.1f}", ratio, mib_cell(peak)])
        say(f"  measured {' '.join(names)}: {step_ms} ms a step")
        rows.append({**setting.__dict__, **r, "samples_per_s": speed})
    say(markdown_table(STEP_HEADER, cells, right_aligned_after(3, len(STEP_HEADER))))
    return rows


def share_table(
    settings: list[Setting], device: torch.device, ks: list[int], threads: int, say
) -> list[dict]:
    """Table 2: K processes sharing the device, against K=1 measured the same way."""
    rows, cells = [], []
    for setting in settings:
        if applicable(setting, device):
            continue
        single = None
        for k in ks:
            r = shared_run(setting, device, k, threads)
            single = single or (r["samples_per_s"] if k == 1 else None)
            ratio = f"{r['samples_per_s'] / single:.2f}×" if single else "-"
            names = [setting.backbone, setting.method, setting.precision, str(k)]
            speed = f"{r['samples_per_s']:.1f}"
            cells.append(
                [*names, f"{1000 * r['step_s']:.1f}", speed, ratio, mib_cell(r["peak_mib"])]
            )
            say(f"  measured {' '.join(names[:3])} K={k}: {speed} samples/s in all")
            rows.append({**setting.__dict__, "k": k, **r})
    say(markdown_table(SHARE_HEADER, cells, right_aligned_after(3, len(SHARE_HEADER))))
    return rows


# ----------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backbones", default=",".join(REAL_BACKBONES))
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--precisions", default=None, help="default: fp32,bf16 (+fp16 on CUDA)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=128, help="input tokens (prompts come on top)")
    p.add_argument("--steps", type=int, default=10, help="timed steps (median reported)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--share", default="1,2,4", help="K values for table 2; empty: skip it")
    p.add_argument("--share-precisions", default=None, help="default: as --precisions")
    p.add_argument("--share-methods", default=None, help="default: as --methods")
    p.add_argument("--device", default="auto", help="auto: cuda if available, else cpu")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: all)")
    p.add_argument("--tables", default="steps,share", help="which tables: steps, share or both")
    p.add_argument("--tiny", action="store_true", help="tiny backbone and methods (tests)")
    return p.parse_args(argv)


def settings_for(args, methods: str, precisions: list[str]) -> list[Setting]:
    """Every backbone × method × precision asked for, in that order."""
    backbones = ["tiny"] if args.tiny else args.backbones.split(",")
    return [
        Setting(b, m, p, args.batch_size, args.seq_len, args.steps, args.warmup, args.tiny)
        for b in backbones
        for m in methods.split(",")
        for p in precisions
    ]


def main(argv: list[str] | None = None, say=say_flushed) -> dict:
    """Run the tables asked for; return what they measured."""
    args = parse_args(argv)
    device = pick_device(args.device)
    threads = args.threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
    default = "fp32,bf16,fp16" if device.type == "cuda" else "fp32,bf16"
    precisions = [resolve_precision(p, device) for p in (args.precisions or default).split(",")]
    say(f"Device: {device_line(device, threads)}")
    say(
        f"Batch {args.batch_size} × {args.seq_len} tokens (+ prompts), median of {args.steps} "
        f"steps after {args.warmup}\n"
    )
    tables = args.tables.split(",")
    steps, shared = [], []
    if "steps" in tables:
        steps = step_table(settings_for(args, args.methods, precisions), device, say)
    if args.share and "share" in tables:
        say("\nK trials sharing the device: K processes stepping together\n")
        share_p = (args.share_precisions or ",".join(precisions)).split(",")
        ks = [int(k) for k in args.share.split(",")]
        methods = args.share_methods or args.methods
        share_settings = settings_for(
            args, methods, [resolve_precision(p, device) for p in share_p]
        )
        shared = share_table(share_settings, device, ks, threads, say)
    return {"device": device_line(device, threads), "steps": steps, "shared": shared}


if __name__ == "__main__":
    main()
