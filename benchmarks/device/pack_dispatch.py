"""Operators dispatched by one training step of a pack of K trials, per method that packs, and
the pack's step time against the same members stepping one after another.

The yardstick of fusing a pack (issue 56: the members' per-member work as batched tensor
operations, so that a step's number of operators does not depend on K). For every registered
method whose tiny setting (:data:`benchmarks.device.steps.TINY_METHODS`) can pack on the
backbone (:func:`raypeft.modeling.packed.packable`) and each K, a pack of K members is built as
:mod:`benchmarks.device.packing` builds one (:func:`benchmarks.device.steps.build_pack`: one
frozen backbone with random weights, K members each with its own method tensors, head, AdamW,
schedule and clipping), stepped once to warm up, then one step of
:func:`raypeft.training.pack.packed_step` is counted: every ATen operator it dispatches, split

- forward: inside the packed backbone's forward (public module hooks on it): the fused
  batch's pass and each member's prompts, heads and loss;
- backward: from the first member's loss receiving its gradient (a tensor hook) until every
  trainable tensor has accumulated its own (``register_post_accumulate_grad_hook``);
- rest: the per-member work outside them: zero_grad, the losses' finiteness check and sum,
  gradient clipping, AdamW and the schedule.

Beside them, one step of a member alone (through its own model, as the training loop steps a
trial): a pack of K dispatches fewer operators than K of those exactly where it shares work.

Counting uses :class:`torch.utils._python_dispatch.TorchDispatchMode`, the class PyTorch's
"Extending PyTorch" notes use for modes ("Extending all torch API with Modes"; its module's
name is private, no public alias exists in torch 2.13; the unit test runs it): it sees each
operator once as it reaches the kernels, after autograd and after composite operators have
decomposed, in the forward and in the backward alike.
``torch.profiler`` records nested operators too (``aten::linear`` and the ``aten::addmm``
inside it), which would count one call twice. Counts are for this device: on a CPU AdamW
loops over its tensors one by one; on CUDA it uses foreach kernels (fewer operators).

Timing (single thread by default, at ``--time-k``): the pack's step against the same members
stepping one after another in this process (each alone, through its own model:
:func:`benchmarks.common.training.training_step`, the training loop's step), alternating
which goes first, the median of ``--repeats`` each; the ratio is pack ÷ sequential.

    python -m benchmarks.device.pack_dispatch                 # every method, K = 1, 2, 4, 8, 16
    python -m benchmarks.device.pack_dispatch --methods pt,dept --ks 1,2 --time-k 2 --repeats 3
    python -m benchmarks.device.pack_dispatch --smoke         # seconds: the test's size
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager

import torch
from torch.utils._python_dispatch import TorchDispatchMode  # why: the documented mode class
from transformers import AutoConfig

from benchmarks.common.machine import cpu_name, load_note
from benchmarks.common.tables import markdown_table, right_aligned_after
from benchmarks.common.training import Trainee, training_step
from benchmarks.device import steps
from benchmarks.device.steps import Setting, build_pack
from raypeft.methods import METHODS, BackboneDims
from raypeft.modeling.backbones import backbone_dims
from raypeft.modeling.packed import PackedBackbone, packable
from raypeft.training.fused import FusedPack, fusing_refusal
from raypeft.training.pack_step import Learner, packed_step

# every registered method, and the settings the step benchmarks add (prefix-kv: deep
# prompts' key/value style)
EVERY_METHOD = list(dict.fromkeys([*METHODS, *steps.TINY_METHODS]))
KS = [1, 2, 4, 8, 16]
PHASES = ("forward", "backward", "rest")
CPU = torch.device("cpu")
STEPS = 100_000  # the schedule's length: far beyond the steps taken, its rate never reaches 0


# ----------------------------------------------------------------------------- counting


class OpCounter(TorchDispatchMode):
    """Counts the ATen operators dispatched while it is active, per :attr:`phase`."""

    def __init__(self) -> None:
        super().__init__()
        self.phase = "rest"
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[self.phase] += 1
        return func(*args, **(kwargs or {}))


def _trained(learners: Sequence[Learner]) -> list[torch.Tensor]:
    """The tensors a step gives gradients (after a step, those whose ``grad`` is set)."""
    params = (p for x in learners for g in x.optimizer.param_groups for p in g["params"])
    return [p for p in params if p.grad is not None]


@contextmanager
def phase_marks(counter: OpCounter, pack: PackedBackbone, learners: Sequence[Learner]):
    """Move ``counter`` between phases with public hooks only (removed on exit): the pack's
    forward hooks, a hook on each member's loss and the trained tensors' accumulation hooks."""
    trained = _trained(learners)
    pending: set[int] = set()

    def backward_starts(grad):
        if counter.phase != "backward":
            counter.phase = "backward"
            pending.update(id(p) for p in trained)

    def forward_ends(module, args, result):
        counter.phase = "rest"
        for out in result[0]:
            if out.loss is not None and out.loss.requires_grad:
                stack.enter_context(_removing(out.loss.register_hook(backward_starts)))

    def accumulated(param):
        pending.discard(id(param))
        if not pending:
            counter.phase = "rest"

    def forward_starts(module, args):
        counter.phase = "forward"

    with ExitStack() as stack:
        stack.enter_context(_removing(pack.register_forward_pre_hook(forward_starts)))
        stack.enter_context(_removing(pack.register_forward_hook(forward_ends)))
        for p in trained:
            stack.enter_context(_removing(p.register_post_accumulate_grad_hook(accumulated)))
        yield


@contextmanager
def _removing(handle) -> Iterator[None]:
    try:
        yield
    finally:
        handle.remove()


@contextmanager
def fused_phase_marks(counter: OpCounter, pack: PackedBackbone, fused: FusedPack):
    """:func:`phase_marks` for a fused step (public hooks only): the forward from the word
    embeddings' lookup (the batch's concatenation before it counts as rest), the backward
    from the gradient reaching the heads' output (the loss's few backward operators before
    it count as forward) until every stack has accumulated its gradient."""
    pending: set[int] = set()
    stacks = list(fused.params.values())

    def forward_starts(module, args):
        counter.phase = "forward"

    def backward_starts(grad):
        if counter.phase != "backward":
            counter.phase = "backward"
            pending.update(id(p) for p in stacks)

    def head_ends(module, args, result):
        if result.requires_grad:
            stack.enter_context(_removing(result.register_hook(backward_starts)))

    def accumulated(param):
        pending.discard(id(param))
        if not pending:
            counter.phase = "rest"

    with ExitStack() as stack:
        embeddings = pack.backbone.get_input_embeddings()
        stack.enter_context(_removing(embeddings.register_forward_pre_hook(forward_starts)))
        for path in pack.head_paths:
            head = pack.backbone.get_submodule(path)
            stack.enter_context(_removing(head.register_forward_hook(head_ends)))
        for p in stacks:
            stack.enter_context(_removing(p.register_post_accumulate_grad_hook(accumulated)))
        yield


def count_step(
    pack: PackedBackbone, learners: Sequence[Learner], batches, fused: FusedPack | None = None
) -> dict[str, int]:
    """The operators one pack step dispatches, per phase and in all: member by member
    (:func:`packed_step`) or, given ``fused``, its fused step."""
    counter = OpCounter()
    if fused is None:
        marks = phase_marks(counter, pack, learners)
    else:
        marks = fused_phase_marks(counter, pack, fused)
    with marks, counter:
        if fused is None:
            outcome = packed_step(pack, learners, batches)
        else:
            outcome = fused.step(range(len(learners)), batches)
    assert all(outcome.finite), "a member's loss is not finite"
    counts = {phase: counter.counts[phase] for phase in PHASES}
    return counts | {"total": sum(counts.values())}


def count_alone(learner: Learner, batch: dict) -> int:
    """The operators one step of the member alone dispatches (through its own model, as the
    training loop steps a trial), after a warm-up step of it."""
    trainee = _trainee(learner)
    training_step(trainee, batch)
    with OpCounter() as counter:
        training_step(trainee, batch)
    return counter.counts.total()


def _trainee(x: Learner) -> Trainee:
    return Trainee(x.model, x.optimizer, x.scheduler, x.scaler, x.max_grad_norm)


# ----------------------------------------------------------------------------- timing


def time_against_sequential(
    pack, learners: Sequence[Learner], batches, repeats: int, fused: FusedPack | None = None
) -> dict:
    """Median seconds of one pack step (member by member, and fused where given) and of the
    same members' steps one after another (each through its own model, as a trial alone),
    rotating which runs first."""
    trainees = [_trainee(x) for x in learners]

    def packed():
        packed_step(pack, learners, batches)

    def fused_step():
        fused.step(range(len(learners)), batches)

    def sequential():
        for trainee, batch in zip(trainees, batches, strict=True):
            training_step(trainee, batch)

    sequential()  # a warm-up of the members' own models (the pack's was warmed up)
    order = [("pack", packed), ("sequential", sequential)]
    if fused is not None:
        order.append(("fused", fused_step))
    times: dict[str, list[float]] = {name: [] for name, _ in order}
    for r in range(repeats):
        for name, step in order[r % len(order) :] + order[: r % len(order)]:
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    median = {k: statistics.median(v) for k, v in times.items()}
    timed = {"pack_s": median["pack"], "sequential_s": median["sequential"]}
    timed["ratio"] = median["pack"] / median["sequential"]
    if fused is not None:
        timed["fused_s"] = median["fused"]
        timed["fused_ratio"] = median["fused"] / median["sequential"]
    return timed


# ----------------------------------------------------------------------------- one method


def _dims(setting: Setting) -> BackboneDims:
    """The backbone's facts, from its config alone (nothing built)."""
    spec = dict(steps.BACKBONES[setting.backbone])
    config = AutoConfig.for_model(spec.pop("model_type"), **spec)
    return backbone_dims(config, setting.seq_len)


def packing_methods(names: Sequence[str], setting_of) -> dict[str, str | None]:
    """Each asked method's reason not to be measured (None: it packs and is measured): as the
    search decides it (:func:`raypeft.modeling.packed.packable`), on this backbone."""
    why = {}
    for name in names:
        if name not in steps.TINY_METHODS or name not in steps.METHODS:
            why[name] = "no setting in benchmarks.device.steps' METHODS"
            continue
        setting = setting_of(name)
        why[name] = steps.applicable(setting, CPU)
        if why[name] is None:
            dims = _dims(setting)
            why[name] = packable(steps.experiment(setting).method.resolve(dims), dims.kind)
    return why


def measure(setting: Setting, k: int, time_k: int, repeats: int) -> dict:
    """One pack of K: its step's operators after a warm-up step, its first member's alone,
    and (at ``time_k``) its step time against the same members stepping one after another."""
    pack, learners = build_pack(setting, k, CPU)
    batches = [steps.random_batch(x.model, setting, CPU) for x in learners]
    packed_step(pack, learners, batches)  # warm-up: lazy state (AdamW's moments) is built
    row = {"method": setting.method, "k": k, "ops": count_step(pack, learners, batches)}
    row["alone"] = count_alone(learners[0], batches[0])
    row["not_fused"] = fusing_refusal(pack, learners)
    fused = None if row["not_fused"] else FusedPack(pack, learners)
    if fused is not None:
        fused.step(range(k), batches)  # warm-up, as the pack's
        row["fused_ops"] = count_step(pack, learners, batches, fused)
    if k == time_k and repeats > 0:
        row["time"] = time_against_sequential(pack, learners, batches, repeats, fused)
    return row


# ----------------------------------------------------------------------------- tables


def _growth_ks(ks: Sequence[int]) -> tuple[int, int] | None:
    """The smallest K ≥ 2 and the largest (None: fewer than two such K)."""
    many = sorted(k for k in ks if k >= 2)
    return (many[0], many[-1]) if len(many) >= 2 else None


def growth(ops: dict[int, int], ks: Sequence[int]) -> str:
    """How much the count grows from the smallest K ≥ 2 to the largest, in %."""
    pair = _growth_ks(ks)
    return "-" if pair is None else f"{100 * (ops[pair[1]] / ops[pair[0]] - 1):+.0f} %"


# each way a pack can step: the row's key of its counts, and its name in the tables
WAYS = (("ops", "member by member"), ("fused_ops", "fused"))
TIMES = {"ops": "ratio", "fused_ops": "fused_ratio"}


def summary_table(rows: list[dict], ks: Sequence[int], time_k: int, skipped: dict) -> str:
    """Method × way × K → operators per pack step, their growth, and the time ratio at
    ``time_k`` (the pack's step ÷ its members' steps one after another)."""
    pair = _growth_ks(ks)
    label = "growth" if pair is None else f"growth K={pair[0]}→{pair[1]}"
    header = [
        "method", "step", "one trial alone", *(f"K={k}" for k in ks), label,
        f"step ÷ sequential time, K={time_k}",
    ]  # fmt: skip
    cells = []
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = {r["k"]: r for r in rows if r["method"] == method}
        alone = f"{mine[ks[0]]['alone']:,}"
        for key, way in WAYS:
            if key not in mine[ks[0]]:
                why = mine[ks[0]].get("not_fused")
                cells.append([method, way, f"n/a: {why}"] + [""] * (len(header) - 3))
                continue
            ops = {k: mine[k][key]["total"] for k in ks}
            timed = mine.get(time_k, {}).get("time", {})
            ratio = f"{timed[TIMES[key]]:.2f}×" if TIMES[key] in timed else "-"
            counts = (f"{ops[k]:,}" for k in ks)
            cells.append([method, way, alone, *counts, growth(ops, ks), ratio])
    cells += [[m, "", f"n/a: {why}"] + [""] * (len(header) - 3) for m, why in skipped.items()]
    return markdown_table(header, cells, right_aligned_after(2, len(header)))


def phase_table(rows: list[dict]) -> str:
    """Method × way × K → operators per phase (forward, backward, rest) and in all."""
    header = ["method", "step", "K", *PHASES, "total"]
    cells = [
        [r["method"], way, str(r["k"]), *(f"{r[key][p]:,}" for p in (*PHASES, "total"))]
        for key, way in WAYS
        for r in rows
        if key in r
    ]
    return markdown_table(header, cells, right_aligned_after(3, len(header)))


def timing_lines(rows: list[dict]) -> list[str]:
    """The timed rows' medians, one line per method."""
    lines = []
    for r in rows:
        if "time" not in r:
            continue
        t = r["time"]
        fused = (
            f", fused {1000 * t['fused_s']:.2f} ms ({t['fused_ratio']:.2f}×)"
            if "fused_s" in t
            else ""
        )
        lines.append(
            f"- {r['method']}, K={r['k']}: the {r['k']} members one after another "
            f"{1000 * t['sequential_s']:.2f} ms; pack step member by member "
            f"{1000 * t['pack_s']:.2f} ms ({t['ratio']:.2f}×){fused}"
        )
    return lines


# ----------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--methods", default=",".join(EVERY_METHOD), help="default: EVERY_METHOD")
    p.add_argument("--ks", default=",".join(map(str, KS)), help="pack sizes K")
    p.add_argument("--time-k", type=int, default=8, help="the K whose step is timed")
    p.add_argument("--repeats", type=int, default=50, help="timed steps of each (0: no timing)")
    p.add_argument("--backbone", default="tiny", help="steps.BACKBONES' (tiny: tiny methods)")
    p.add_argument("--batch-size", type=int, default=8, help="each member's batch")
    p.add_argument("--seq-len", type=int, default=32, help="input tokens (prompts come on top)")
    p.add_argument("--threads", type=int, default=1, help="torch's CPU threads")
    p.add_argument("--smoke", action="store_true", help="K=1,2, tiny batches, 2 repeats (tests)")
    args = p.parse_args(argv)
    if args.smoke:
        args.ks, args.time_k, args.repeats, args.batch_size, args.seq_len = "1,2", 2, 2, 2, 8
    return args


def main(argv: list[str] | None = None, say=print) -> list[dict]:
    """Count (and time) every method × K asked for; print the tables; return the rows."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    ks = [int(k) for k in args.ks.split(",")]
    tiny = args.backbone == "tiny"

    def setting_of(method: str) -> Setting:
        return Setting(args.backbone, method, "fp32", args.batch_size, args.seq_len, STEPS, 1, tiny)

    skipped = packing_methods(args.methods.split(","), setting_of)
    given = " ".join(argv or sys.argv[1:])
    say(f"Command: python -m benchmarks.device.pack_dispatch {given}".rstrip())
    say(f"Machine: CPU {cpu_name()}, {args.threads} thread(s), torch {torch.__version__}")
    say(
        f"Backbone {args.backbone} (random weights), fp32; each member: batch "
        f"{args.batch_size} × {args.seq_len} tokens; counted: one step after a warm-up step\n"
    )
    rows = []
    for method, why in skipped.items():
        if why is None:
            for k in ks:
                rows.append(measure(setting_of(method), k, args.time_k, args.repeats))
                row = rows[-1]
                fused = row.get("fused_ops", {}).get("total")
                fused = f", fused {fused:,}" if fused else ""
                say(f"  measured {method} K={k}: {row['ops']['total']:,} ops{fused}{load_note()}")
    skipped = {m: why for m, why in skipped.items() if why is not None}
    say("\nOperators dispatched per pack step:\n")
    say(summary_table(rows, ks, args.time_k, skipped))
    say("\nBy phase:\n")
    say(phase_table(rows))
    say(f"\nTimes (median of {args.repeats} each, alternating):")
    say("\n".join(timing_lines(rows)) or "- not timed")
    return rows


if __name__ == "__main__":
    main()
