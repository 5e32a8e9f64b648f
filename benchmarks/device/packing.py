"""Trial packing at the step level: trials per hour and peak memory of a pack of K trials on one
frozen backbone against K separate trials sharing the same hardware, per method, at real shapes.

Backbones and methods are :mod:`benchmarks.device.steps`' (random weights built from the real
configs: nothing is downloaded; a step's time and memory do not depend on the weights'
values), inputs random token ids of the full ``--seq-len``. For each backbone, method and K,
every measurement in a fresh process (so that its peak memory is its own), started in this
one run:

- packed: one process holds one frozen backbone and K members, each with its own method
  tensors, head, AdamW state, schedule and clipping, and times the pack's training step
  (:func:`raypeft.training.pack.packed_step`: the K batches in one forward and backward
  pass, then each member's own optimizer step), with every thread / the whole GPU;
- separate: K processes, each one trial stepping alone (the training loop's own step, as
  :mod:`benchmarks.device.gpu_step` times it), started together and stepping concurrently: on a CPU
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

    python -m benchmarks.device.packing                           # everything, on the GPU if any
    python -m benchmarks.device.packing --backbones minilm --methods pt --ks 1,2,4 --seq-len 64
"""

from __future__ import annotations

import argparse
import os

import torch
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.common.devices import device_line, pick_device
from benchmarks.common.processes import measure_together, together
from benchmarks.common.tables import markdown_table, right_aligned_after
from benchmarks.device import steps
from benchmarks.device.steps import Setting, build_pack, say_flushed, timed_span
from raypeft.modeling.packed import PackedBackbone
from raypeft.modeling.precision import resolve_precision
from raypeft.training.fused import FusedPack, fusing_refusal
from raypeft.training.pack_step import packed_step

BACKBONES = ["minilm", "roberta-base"]  # MiniLM and base size (steps has more)
KS = [1, 2, 4, 8, 16]


# ----------------------------------------------------------------------------- one pack


def pack_stepper(pack: PackedBackbone, learners: list, way: str, batch_size: int):
    """One step of the pack as ``way`` says: ``unfused`` member by member
    (:func:`packed_step`), ``fused`` (:class:`raypeft.training.fused.FusedPack`), or
    ``compiled`` (fused, compiled with static shapes); None where the members cannot fuse."""
    if way == "unfused":
        return lambda batches: packed_step(pack, learners, batches)
    if fusing_refusal(pack, learners) is not None:
        return None
    rows = batch_size if way == "compiled" else None
    fused = FusedPack(pack, learners, compile_rows=rows)
    slots = range(len(learners))
    return lambda batches: fused.step(slots, batches)


def time_pack(
    setting: Setting, k: int, device: torch.device, barrier=None, way: str = "unfused"
) -> dict:
    """Build a pack of K members, step it ``warmup`` times (a compiled pack compiles then),
    count one step's floating-point operations (eager ways), then time ``steps`` steps."""
    pack, learners = build_pack(setting, k, device)
    batches = [steps.random_batch(x.model, setting, device) for x in learners]
    step = pack_stepper(pack, learners, way, setting.batch_size)
    for _ in range(setting.warmup):
        step(batches)
    flops = None
    if way != "compiled":  # FlopCounterMode counts eager operators
        with FlopCounterMode(display=False) as counter:
            step(batches)
        flops = counter.get_total_flops()
    outcomes = []
    timed = timed_span(lambda: outcomes.append(step(batches)), setting, device, barrier)
    assert all(outcomes[-1].finite), "a member's loss is not finite"
    return timed | {"samples": setting.steps * setting.batch_size * k, "flops": flops}


# ----------------------------------------------------------------------------- processes


def _worker(kind: str, setting: Setting, k: int, device: str, threads: int, barrier, results):
    """One measuring process: the pack of K (``kind``: a way of stepping it, WAYS) or one
    separate trial (``separate``)."""
    torch.set_num_threads(threads)
    if kind in WAYS:
        results.put(time_pack(setting, k, torch.device(device), barrier, kind))
    else:
        results.put(steps.time_steps(setting, torch.device(device), barrier))


def run(kind: str, setting: Setting, device: torch.device, k: int, threads: int) -> dict:
    """The pack of K in one process (``kind``: one of WAYS), or K separate trials in K
    processes stepping together: total samples/s over the span from the first start to the
    last end, summed peak memory."""
    packed = kind in WAYS
    processes = 1 if packed else k
    per = threads if packed else max(1, threads // k)
    got = measure_together(_worker, [(kind, setting, k, str(device), per)] * processes)
    flops = got[0].get("flops") if packed else None
    return (
        together(got)
        | {"peak_mib": sum(r["peak_mib"] or 0 for r in got) or None}
        | {"flops": flops}
    )


# ----------------------------------------------------------------------------- table

HEADER = (
    "backbone", "method", "precision", "K", "pack step", "pack step ms", "pack trials/h",
    "separate trials/h", "×", "sequential trials/h", "× sequential", "pack peak MiB",
    "separate peak MiB", "memory ×", "Δ/member MiB", "TFLOP/s", "of peak",
)  # fmt: skip
# the ways a pack can step (raypeft.training.fused): member by member, fused, fused compiled
WAYS = ("unfused", "fused", "compiled")
# dense bf16 tensor-core peaks (TFLOP/s, NVIDIA's datasheets) of GPUs raypeft has met or
# expects, by a part of the name torch reports; elsewhere "of peak" is left blank
BF16_PEAK_TFLOPS = {"H200": 989.4, "H100": 989.4, "A100": 312.0, "L40S": 362.1, "A10G": 70.0}


def _cell(value: float | None, fmt: str = ",.0f") -> str:
    return "-" if value is None else format(value, fmt)


def peak_tflops(device: torch.device) -> float | None:
    """The device's dense bf16 peak, where :data:`BF16_PEAK_TFLOPS` knows its name."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for part, v in BF16_PEAK_TFLOPS.items() if part in name), None)


def row_cells(
    setting: Setting,
    k: int,
    way: str,
    packed: dict,
    separate: dict,
    trial_steps: int,
    first,
    alone: dict,
    peak: float | None = None,
):
    """One row's cells: the pack stepped ``way`` against separate and against sequential
    trials (``alone``: one trial on the whole device, as K trials run one after the other),
    what each member beyond the first adds to the pack's peak (``first``: the peak of the
    pack of one), and its arithmetic rate (``flops`` per step, counted) against ``peak``."""
    per_trial = trial_steps * setting.batch_size  # samples one trial trains on
    pack_h = packed["samples_per_s"] * 3600 / per_trial
    separate_h = separate["samples_per_s"] * 3600 / per_trial
    sequential_h = alone["samples_per_s"] * 3600 / per_trial
    mib, apart = packed["peak_mib"], separate["peak_mib"]
    growth = (mib - first) / (k - 1) + 0.0 if mib and first and k > 1 else None
    memory = f"{mib / apart:.2f}×" if mib and apart else "-"
    flops = packed.get("flops")
    rate = flops / packed["step_s"] / 1e12 if flops else None
    share = f"{100 * rate / peak:.1f} %" if rate and peak else "-"
    return [
        setting.backbone, setting.method, setting.precision, str(k), way,
        f"{1000 * packed['step_s']:.1f}", _cell(pack_h), _cell(separate_h),
        f"{pack_h / separate_h:.2f}×", _cell(sequential_h), f"{pack_h / sequential_h:.2f}×",
        _cell(mib), _cell(apart), memory, _cell(growth), _cell(rate, ".2f"), share,
    ]  # fmt: skip


def table(
    settings: list[Setting],
    device,
    ks: list[int],
    threads: int,
    trial_steps: int,
    say,
    ways: dict[str, list[int]] | None = None,
):
    """One row per backbone × method × K × way the pack steps (``ways``: each way's Ks, by
    default every K unfused): the pack and separate trials measured side by side, and
    sequential trials (one trial alone: the separate K=1). Each row is printed as it is
    measured (a run cut off keeps them), the table at the end."""
    ways = ways or {"unfused": ks}
    peak = peak_tflops(device)
    rows, cells = [], []
    for setting in settings:
        why = steps.applicable(setting, device)
        if why:
            cells.append([setting.backbone, setting.method, setting.precision, f"n/a: {why}"])
            continue
        first_peak = alone = None
        for k in ks:
            separate = run("separate", setting, device, k, threads)
            alone = separate if k == 1 else alone or run("separate", setting, device, 1, threads)
            for way in (w for w in WAYS if k in ways.get(w, [])):
                if way != "unfused" and not _fuses(setting, device):
                    continue
                packed = run(way, setting, device, k, threads)
                if k == 1 and way == "unfused":
                    first_peak = packed["peak_mib"]
                cells.append(
                    row_cells(
                        setting, k, way, packed, separate, trial_steps, first_peak, alone, peak
                    )
                )
                say(f"  measured | {' | '.join(cells[-1])} |")
                rows.append(
                    {**setting.__dict__, "k": k, "way": way, "packed": packed, "separate": separate}
                )
    cells = [c + [""] * (len(HEADER) - len(c)) for c in cells]
    say(markdown_table(HEADER, cells, right_aligned_after(3, len(HEADER))))
    return rows


def _fuses(setting: Setting, device: torch.device) -> bool:
    """Whether a pack of ``setting`` can step fused (a pack of two is built to ask)."""
    pack, learners = build_pack(setting, 2, device)
    return fusing_refusal(pack, learners) is None


def parse_ways(args: argparse.Namespace) -> dict[str, list[int]]:
    """Each way's Ks: unfused and fused at every K of ``--ks`` (``--fused-ks``), compiled at
    ``--compiled-ks`` (compiling costs a compilation per pack: a few Ks)."""

    def ks(text: str) -> list[int]:
        return [int(k) for k in text.split(",") if k]

    every = ks(args.ks)
    return {
        "unfused": every,
        "fused": ks(args.fused_ks) if args.fused_ks is not None else every,
        "compiled": ks(args.compiled_ks),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backbones", default=",".join(BACKBONES), help="from steps.BACKBONES")
    p.add_argument("--methods", default=",".join(steps.METHODS))
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
    p.add_argument("--fused-ks", default=None, help="Ks of fused packs (default: --ks)")
    p.add_argument("--compiled-ks", default="", help="Ks of compiled fused packs (default none)")
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
    rows = table(settings, device, ks, threads, args.trial_steps, say, parse_ways(args))
    return {"device": device_line(device, threads), "rows": rows}


if __name__ == "__main__":
    main()
