"""Trial packing at the step level: trials per hour and peak memory of a pack of K trials on one
frozen backbone against K separate trials sharing the same hardware, per method, at real shapes.

Backbones and methods are gpu_step.py's (random weights built from the real configs: nothing is
downloaded; a step's time and memory do not depend on the weights' values), inputs random
token ids of the full ``--seq-len``. For each backbone, method and K, every measurement in a
fresh process (so that its peak memory is its own), started in this one run:

- packed: one process holds one frozen backbone and K members, each with its own method
  tensors, head, AdamW state, schedule and clipping, and times the pack's training step
  (:func:`raypeft.training.pack.packed_step`: the K batches in one forward and backward
  pass, then each member's own optimizer step), with every thread / the whole GPU;
- separate: K processes, each one trial stepping alone (the training loop's own step, as
  gpu_step.py times it), started together and stepping concurrently: on a CPU each with
  ``threads // K`` threads, as Ray gives each trial its share of the cores; on a GPU all on the
  one device, as K trials of ``gpus_per_worker: 1/K`` (fractional GPUs) run.

Trials per hour = total samples/s × 3600 / (``--trial-steps`` × batch size): trial-equivalents
of a fixed length (evaluations not counted). Peak memory: CUDA's most allocated (separate: the
K processes' sum; each also holds a CUDA context of its own, not counted), CPU's peak resident
set (separate: the sum). "Δ/member" is what each member beyond the first adds to the pack's
peak. All members of a pack have one shape here (no padding); members whose prompts differ in
length are padded to the longest (raypeft.modeling.packed.PackShape.padding_waste).

It imports only torch, transformers, pydantic and raypeft's training core (no Ray, MLflow,
Optuna or datasets), so it runs on a GPU machine that has none of them.

    python benchmarks/packing.py                                  # everything, on the GPU if any
    python benchmarks/packing.py --backbones minilm --methods pt --ks 1,2,4 --seq-len 64
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # raypeft from this checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu_step, beside this file

import gpu_step  # noqa: E402
from gpu_step import Setting  # noqa: E402

from raypeft.modeling.backbones import Backbone  # noqa: E402
from raypeft.modeling.packed import PackedBackbone, shared_copy  # noqa: E402
from raypeft.modeling.precision import backbone_dtype, cast_frozen, resolve_precision  # noqa: E402
from raypeft.modeling.prompted import PromptedModel  # noqa: E402
from raypeft.training.pack import Learner, packed_step  # noqa: E402

BACKBONES = ["minilm", "roberta-base"]  # MiniLM and base size (gpu_step.py has more)
KS = [1, 2, 4, 8, 16]


# ----------------------------------------------------------------------------- one pack


def build_pack(setting: Setting, k: int, device: torch.device) -> tuple[PackedBackbone, list]:
    """One frozen backbone (random weights, in the precision's layout) and K members on it,
    each with its own modules, head, method tensors and optimizer, as trials have them."""
    cfg = gpu_step.experiment(setting)
    base = gpu_step.build_backbone(setting.backbone, setting.seq_len, device)
    cast_frozen(base.model, backbone_dtype(setting.precision, device))
    learners = []
    for index in range(k):
        model = shared_copy(base.model)  # new modules over the same frozen tensors
        head = [p for p in model.parameters() if p.requires_grad]
        torch.manual_seed(cfg.train.seed + index)
        member = PromptedModel(Backbone(model, base.dims, head), cfg.method).to(device)
        member.precision = setting.precision
        member.train()
        learners.append(Learner.of(member, cfg, device))
    pack = PackedBackbone(shared_copy(base.model), base.dims.kind, setting.precision)
    del base  # the pack and the members hold the frozen tensors
    for learner in learners:
        pack.check_member(learner.model)
    return pack, learners


def time_pack(setting: Setting, k: int, device: torch.device, barrier=None) -> dict:
    """Build a pack of K members, step it ``warmup`` times, then time ``steps`` steps."""
    pack, learners = build_pack(setting, k, device)
    batches = [gpu_step.random_batch(x.model, setting, device) for x in learners]
    for _ in range(setting.warmup):
        packed_step(pack, learners, batches)
    gpu_step._sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    if barrier is not None:
        barrier.wait()
    times = []
    start = time.perf_counter()
    for _ in range(setting.steps):
        begin = time.perf_counter()
        outcome = packed_step(pack, learners, batches)
        gpu_step._sync(device)
        times.append(time.perf_counter() - begin)
    end = time.perf_counter()
    assert all(outcome.finite), "a member's loss is not finite"
    return {
        "step_s": statistics.median(times),
        "start": start,
        "end": end,
        "samples": setting.steps * setting.batch_size * k,
        "peak_mib": gpu_step._peak_mib(device),
    }


# ----------------------------------------------------------------------------- processes


def _worker(kind: str, setting: Setting, k: int, device: str, threads: int, barrier, results):
    """One measuring process: the pack of K (``kind`` pack) or one separate trial."""
    torch.set_num_threads(threads)
    if kind == "pack":
        results.put(time_pack(setting, k, torch.device(device), barrier))
    else:
        results.put(gpu_step.time_steps(setting, torch.device(device), barrier))


def run(kind: str, setting: Setting, device: torch.device, k: int, threads: int) -> dict:
    """The pack of K in one process, or K separate trials in K processes stepping together:
    total samples/s over the span from the first start to the last end, summed peak memory."""
    processes = 1 if kind == "pack" else k
    per = threads if kind == "pack" else max(1, threads // k)
    ctx = mp.get_context("spawn")  # CUDA cannot be forked
    barrier, results = ctx.Barrier(processes), ctx.Queue()
    args = (kind, setting, k, str(device), per, barrier, results)
    procs = [ctx.Process(target=_worker, args=args) for _ in range(processes)]
    for proc in procs:
        proc.start()
    got = [_result(results, procs) for _ in procs]
    for proc in procs:
        proc.join()
    results.close()
    span = max(r["end"] for r in got) - min(r["start"] for r in got)
    return {
        "samples_per_s": sum(r["samples"] for r in got) / span,
        "step_s": statistics.mean(r["step_s"] for r in got),
        "peak_mib": sum(r["peak_mib"] or 0 for r in got) or None,
    }


def _result(results, procs) -> dict:
    """The next process's result; fails (instead of waiting forever) when one died."""
    while True:
        try:
            return results.get(timeout=5)
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead:
                for proc in procs:
                    proc.kill()
                raise RuntimeError(f"a measuring process failed (exit {dead[0]})") from None


# ----------------------------------------------------------------------------- table

HEADER = (
    "| backbone | method | precision | K | pack step ms | pack trials/h | separate trials/h "
    "| × | pack peak MiB | separate peak MiB | memory × | Δ/member MiB |"
)


def _cell(value: float | None, fmt: str = ",.0f") -> str:
    return "-" if value is None else format(value, fmt)


def table(settings: list[Setting], device, ks: list[int], threads: int, trial_steps: int, say):
    """One row per backbone × method × K: packed and separate measured side by side."""
    say(HEADER)
    say("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows = []
    for setting in settings:
        why = gpu_step.applicable(setting, device)
        if why:
            say(f"| {setting.backbone} | {setting.method} | {setting.precision} | n/a: {why} |")
            continue
        per_trial = trial_steps * setting.batch_size  # samples one trial trains on
        first_peak = None
        for k in ks:
            packed = run("pack", setting, device, k, threads)
            separate = run("separate", setting, device, k, threads)
            pack_h = packed["samples_per_s"] * 3600 / per_trial
            separate_h = separate["samples_per_s"] * 3600 / per_trial
            peak, apart = packed["peak_mib"], separate["peak_mib"]
            first_peak = first_peak if first_peak is not None else (peak if k == 1 else None)
            growth = (peak - first_peak) / (k - 1) + 0.0 if peak and first_peak and k > 1 else None
            memory = f"{peak / apart:.2f}×" if peak and apart else "-"
            say(
                f"| {setting.backbone} | {setting.method} | {setting.precision} | {k} | "
                f"{1000 * packed['step_s']:.1f} | {_cell(pack_h)} | {_cell(separate_h)} | "
                f"{pack_h / separate_h:.2f}× | {_cell(peak)} | {_cell(apart)} | {memory} | "
                f"{_cell(growth)} |"
            )
            rows.append({**setting.__dict__, "k": k, "packed": packed, "separate": separate})
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backbones", default=",".join(BACKBONES), help="from gpu_step.BACKBONES")
    p.add_argument("--methods", default=",".join(gpu_step.METHODS))
    p.add_argument("--precision", default="auto", help="auto: bf16 where the hardware is fast")
    p.add_argument("--ks", default=",".join(map(str, KS)), help="pack sizes K")
    p.add_argument("--batch-size", type=int, default=16, help="each trial's batch")
    p.add_argument("--seq-len", type=int, default=128, help="input tokens (prompts come on top)")
    p.add_argument("--steps", type=int, default=10, help="timed steps (median reported)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--trial-steps", type=int, default=1000, help="steps of one trial (per hour)")
    p.add_argument("--device", default="auto", help="auto: cuda if available, else cpu")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: all)")
    p.add_argument("--tiny", action="store_true", help="tiny backbone and methods (tests)")
    return p.parse_args(argv)


def _say(*args) -> None:
    print(*args, flush=True)  # rows appear as they are measured, also when redirected


def main(argv: list[str] | None = None, say=_say) -> dict:
    args = parse_args(argv)
    device = torch.device(
        ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    )
    threads = args.threads or os.cpu_count() or 1
    precision = resolve_precision(args.precision, device)
    backbones = ["tiny"] if args.tiny else args.backbones.split(",")
    settings = [
        Setting(b, m, precision, args.batch_size, args.seq_len, args.steps, args.warmup, args.tiny)
        for b in backbones
        for m in args.methods.split(",")
    ]
    say(f"Device: {gpu_step.device_line(device, threads)}")
    say(
        f"Each trial: batch {args.batch_size} × {args.seq_len} tokens (+ prompts), "
        f"{args.trial_steps} steps; median of {args.steps} steps after {args.warmup}\n"
    )
    ks = [int(k) for k in args.ks.split(",")]
    rows = table(settings, device, ks, threads, args.trial_steps, say)
    return {"device": gpu_step.device_line(device, threads), "rows": rows}


if __name__ == "__main__":
    main()
