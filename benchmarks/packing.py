"""Trial packing at the step level: trials per hour and peak memory of a pack of K trials on one
frozen backbone against K separate trials sharing the same hardware, per method, at real shapes.

Backbones and methods are :mod:`benchmarks.gpu_step`'s (random weights built from the real
configs: nothing is downloaded; a step's time and memory do not depend on the weights'
values), inputs random token ids of the full ``--seq-len``. For each backbone, method and K,
every measurement in a fresh process (so that its peak memory is its own), started in this
one run:

- packed: one process holds one frozen backbone and K members, each with its own method
  tensors, head, AdamW state, schedule and clipping, and times the pack's training step
  (:func:`raypeft.training.pack.packed_step`: the K batches in one forward and backward
  pass, then each member's own optimizer step), with every thread / the whole GPU;
- separate: K processes, each one trial stepping alone (the training loop's own step, as
  :mod:`benchmarks.gpu_step` times it), started together and stepping concurrently: on a CPU
  each with ``threads // K`` threads, as Ray gives each trial its share of the cores; on a GPU
  all on the one device, as K trials of ``gpus_per_worker: 1/K`` (fractional GPUs) run.

Trials per hour = total samples/s × 3600 / (``--trial-steps`` × batch size): trial-equivalents
of a fixed length (evaluations not counted). Peak memory: CUDA's most allocated (separate: the
K processes' sum; each also holds a CUDA context of its own, not counted), CPU's peak resident
set (separate: the sum). "Δ/member" is what each member beyond the first adds to the pack's
peak. All members of a pack have one shape here (no padding); members whose prompts differ in
length are padded to the longest (raypeft.modeling.packed.PackShape.padding_waste).

It imports only torch, transformers, pydantic and raypeft's training core (no Ray, MLflow,
Optuna or datasets), so it runs on a GPU machine that has none of them.

    python -m benchmarks.packing                                  # everything, on the GPU if any
    python -m benchmarks.packing --backbones minilm --methods pt --ks 1,2,4 --seq-len 64
"""

from __future__ import annotations

import argparse
import os

import torch

from benchmarks import gpu_step
from benchmarks.common.devices import device_line, pick_device
from benchmarks.common.processes import measure_together, together
from benchmarks.common.tables import markdown_table, right_aligned_after
from benchmarks.gpu_step import Setting, say_flushed, timed_span
from raypeft.modeling.backbones import Backbone
from raypeft.modeling.packed import PackedBackbone, shared_copy
from raypeft.modeling.precision import backbone_dtype, cast_frozen, resolve_precision
from raypeft.modeling.prompted import PromptedModel
from raypeft.training.pack_step import Learner, packed_step

BACKBONES = ["minilm", "roberta-base"]  # MiniLM and base size (gpu_step has more)
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
    outcomes = []
    timed = timed_span(
        lambda: outcomes.append(packed_step(pack, learners, batches)), setting, device, barrier
    )
    assert all(outcomes[-1].finite), "a member's loss is not finite"
    return timed | {"samples": setting.steps * setting.batch_size * k}


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
    got = measure_together(_worker, [(kind, setting, k, str(device), per)] * processes)
    return together(got) | {"peak_mib": sum(r["peak_mib"] or 0 for r in got) or None}


# ----------------------------------------------------------------------------- table

HEADER = (
    "backbone", "method", "precision", "K", "pack step ms", "pack trials/h", "separate trials/h",
    "×", "sequential trials/h", "× sequential", "pack peak MiB", "separate peak MiB", "memory ×",
    "Δ/member MiB",
)  # fmt: skip


def _cell(value: float | None, fmt: str = ",.0f") -> str:
    return "-" if value is None else format(value, fmt)


def row_cells(
    setting: Setting, k: int, packed: dict, separate: dict, trial_steps: int, first, alone: dict
):
    """One row's cells: packed against separate and against sequential trials (``alone``: one
    trial on the whole device, as K trials run one after the other), and what each member
    beyond the first adds to the pack's peak (``first``: the peak of the pack of one)."""
    per_trial = trial_steps * setting.batch_size  # samples one trial trains on
    pack_h = packed["samples_per_s"] * 3600 / per_trial
    separate_h = separate["samples_per_s"] * 3600 / per_trial
    sequential_h = alone["samples_per_s"] * 3600 / per_trial
    peak, apart = packed["peak_mib"], separate["peak_mib"]
    growth = (peak - first) / (k - 1) + 0.0 if peak and first and k > 1 else None
    memory = f"{peak / apart:.2f}×" if peak and apart else "-"
    return [
        setting.backbone, setting.method, setting.precision, str(k),
        f"{1000 * packed['step_s']:.1f}", _cell(pack_h), _cell(separate_h),
        f"{pack_h / separate_h:.2f}×", _cell(sequential_h), f"{pack_h / sequential_h:.2f}×",
        _cell(peak), _cell(apart), memory, _cell(growth),
    ]  # fmt: skip


def table(settings: list[Setting], device, ks: list[int], threads: int, trial_steps: int, say):
    """One row per backbone × method × K: packed and separate measured side by side, and
    sequential trials (one trial alone: the separate K=1). Each row is printed as it is
    measured (a run cut off keeps them), the table at the end."""
    rows, cells = [], []
    for setting in settings:
        why = gpu_step.applicable(setting, device)
        if why:
            cells.append([setting.backbone, setting.method, setting.precision, f"n/a: {why}"])
            continue
        first_peak = alone = None
        for k in ks:
            packed = run("pack", setting, device, k, threads)
            separate = run("separate", setting, device, k, threads)
            if k == 1:
                first_peak, alone = packed["peak_mib"], separate
            alone = alone or run("separate", setting, device, 1, threads)
            cells.append(row_cells(setting, k, packed, separate, trial_steps, first_peak, alone))
            say(f"  measured | {' | '.join(cells[-1])} |")
            rows.append({**setting.__dict__, "k": k, "packed": packed, "separate": separate})
    cells = [c + [""] * (len(HEADER) - len(c)) for c in cells]
    say(markdown_table(HEADER, cells, right_aligned_after(3, len(HEADER))))
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


def main(argv: list[str] | None = None, say=say_flushed) -> dict:
    """Measure every backbone × method × K asked for; return what was measured."""
    args = parse_args(argv)
    device = pick_device(args.device)
    threads = args.threads or os.cpu_count() or 1
    precision = resolve_precision(args.precision, device)
    backbones = ["tiny"] if args.tiny else args.backbones.split(",")
    settings = [
        Setting(b, m, precision, args.batch_size, args.seq_len, args.steps, args.warmup, args.tiny)
        for b in backbones
        for m in args.methods.split(",")
    ]
    say(f"Device: {device_line(device, threads)}")
    say(
        f"Each trial: batch {args.batch_size} × {args.seq_len} tokens (+ prompts), "
        f"{args.trial_steps} steps; median of {args.steps} steps after {args.warmup}\n"
    )
    ks = [int(k) for k in args.ks.split(",")]
    rows = table(settings, device, ks, threads, args.trial_steps, say)
    return {"device": device_line(device, threads), "rows": rows}


if __name__ == "__main__":
    main()
