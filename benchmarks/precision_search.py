"""fp32 against the low precision: training steps, and the shipped default search.

What it measures
----------------
Part A (steps): a MiniLM training step (batch 16, s=64, frozen backbone; forward, backward,
gradient clipping, AdamW step and schedule through ``raypeft.training.optimizer.optimizer_step``,
as the training loop does) for PT (l=40) and DePT (m=40 within PT's l=100 budget), each built by
``raypeft.modeling.build.build_model`` once in fp32 and once in the low precision
(:func:`low_precision`: what ``auto`` resolves to on this machine where that is not fp32 --
bf16 on a CPU with AMX or a GPU of compute capability >= 8 -- else explicit bf16), and
a third time with its frozen weights cast to bf16 as well (the layout used on GPUs; on a CPU
raypeft keeps them fp32 under autocast, which this column justifies).
After ``--warmup`` steps each, the timed steps ALTERNATE between fp32 and low precision step
by step (the order rotates every round), so slow phases of a shared machine hit both alike.
Reported: the median step time of each and the median of its per-round ratios to fp32.

Part B (whole searches): ``search_spaces/dept.yaml`` (the README's main command, ``raypeft
tune --space search_spaces/dept.yaml``) run through ``raypeft.search.run.run_experiment`` with
``train.precision=fp32`` and with the low precision, IN ORDER: fp32 first, then low; with
``--rounds 2`` the order is fp32, low, low, fp32 (ABBA), so a drift of the machine's load
over the ~20 minutes hits both alike. Each search starts and shuts down its own local Ray,
writes MLflow to a sqlite file and Ray to a storage path in a temp dir. Reported per
precision: wall time (mean over rounds), the ratio low/fp32, and the best trial's validation
and test accuracy (the test split is scored once, for the best configuration). ``--set k=v``
applies overrides exactly as ``raypeft tune --set`` does: e.g. a tiny run to check it starts:

    .venv/bin/python -m benchmarks.precision_search --skip-steps \\
        --set train.max_steps=4 --set train.eval_every=2 --set search.num_samples=2

Absolute numbers depend on the (shared, 2-core) machine; read the ratios.

How to run
----------
    .venv/bin/python -m benchmarks.precision_search                 # Part A and Part B (~25 min)
    .venv/bin/python -m benchmarks.precision_search --skip-search   # Part A only (~3 min)
    .venv/bin/python -m benchmarks.precision_search --skip-steps --rounds 2
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common.machine import load_note
from benchmarks.common.paths import REPO, SHIPPED_SEARCH
from benchmarks.common.searches import experiment_in, quiet_and_local, timed_search
from benchmarks.common.tables import print_table
from benchmarks.common.timing import interleaved_seconds, median_ratio

SPACE = SHIPPED_SEARCH


# ----------------------------------------------------------------------------- Part A: steps


@dataclass
class _Labels:
    """What build_model reads of a task (3-class tweets, as the default search)."""

    problem: str = "classification"


@dataclass
class _Task:
    spec: _Labels
    num_labels: int = 3
    verbalizers: list[str] | None = None


def step_config(method: dict, precision: str):
    from raypeft.config.loading import validate_experiment

    return validate_experiment(
        {
            "name": "bench_precision",
            "model": {"name": "minilm", "max_length": 64},
            "task": {"name": "tweet_sentiment"},
            "method": method,
            "train": {"batch_size": 16, "precision": precision},
        },
        "benchmark",
    )


def timed_steps(models: dict, batch: dict, args: argparse.Namespace) -> dict[str, list[float]]:
    """One training step of each model per round, the order rotating every round."""
    from benchmarks.common.training import training_step

    def stepper(name: str):
        return lambda _round: training_step(models[name], batch)

    return interleaved_seconds({name: stepper(name) for name in models}, args.steps, args.warmup)


def models_for(method: dict, low: str) -> dict:
    """The method's model in fp32, in ``low`` under autocast, and in ``low`` with its frozen
    weights cast too (the GPU layout), each with what trains it."""
    from benchmarks.common.training import Trainee
    from raypeft.modeling.build import build_model
    from raypeft.modeling.precision import cast_frozen, compute_dtype

    models = {}
    for variant in ("fp32", low, f"{low}-weights"):
        precision = variant.removesuffix("-weights")
        cfg = step_config(method, precision)
        model = build_model(cfg, _Task(_Labels()), precision=precision)
        if variant.endswith("-weights"):  # the layout a GPU uses: frozen weights in bf16
            cast_frozen(model.backbone, compute_dtype(precision))
        model.train()
        models[variant] = Trainee.of(model, cfg)
    return models


def random_batch() -> dict:
    """A batch of 16 random tweets' worth of token ids (s=64) and 3-class labels."""
    import torch

    gen = torch.Generator().manual_seed(0)
    return {
        "input_ids": torch.randint(1000, 20000, (16, 64), generator=gen),
        "attention_mask": torch.ones(16, 64, dtype=torch.long),
        "token_type_ids": torch.zeros(16, 64, dtype=torch.long),
        "labels": torch.randint(0, 3, (16,), generator=gen),
    }


def part_a(args: argparse.Namespace) -> None:
    """PT and DePT steps in fp32 against the low precision, alternating; then the table."""
    import torch

    from raypeft.modeling.precision import resolve_precision

    torch.set_num_threads(args.threads)
    auto, low = resolve_precision("auto", "cpu"), low_precision()
    print(
        f"== Part A: MiniLM step, batch 16, s=64, {args.threads} threads; auto resolves to "
        f"{auto} here; fp32 vs {low}, {args.steps} alternating steps after {args.warmup} warm-up",
        flush=True,
    )
    batch = random_batch()
    methods = {
        "PT l=40": {"name": "pt", "prompt_length": 40},
        "DePT m=40": {"name": "dept", "budget_prompt_length": 100, "prompt_length": 40},
    }
    rows = []
    for label, method in methods.items():
        times = timed_steps(models_for(method, low), batch, args)
        cells = [label, f"{statistics.median(times['fp32']) * 1000:.0f}"]
        for variant in list(times)[1:]:
            ms = statistics.median(times[variant]) * 1000
            cells.append(f"{ms:.0f} ({median_ratio(times[variant], times['fp32']):.2f}x)")
        rows.append(tuple(cells))
        print(f"  {label}: done{load_note()}", flush=True)
    print_table(
        ("method", "fp32 (ms)", f"{low}: autocast, fp32 weights", f"{low}: bf16 weights too"),
        rows,
    )
    print("  (ratio: median over alternating pairs of the step time against fp32)")


# ----------------------------------------------------------------------------- Part B: searches


def search_config(precision: str, overrides: list[str], tmp: Path, round_no: int):
    extra = [*overrides, f"train.precision={precision}"]
    return experiment_in(SPACE, f"bench-precision-{precision}-{round_no}", extra, tmp)


def run_search(precision: str, args: argparse.Namespace, tmp: Path, round_no: int) -> dict:
    summary, wall = timed_search(search_config(precision, args.set, tmp, round_no), tmp)
    out = {
        "wall": wall,
        "val": summary.best_validation.get("val_accuracy", float("nan")),
        "test": summary.test.get("test_accuracy", float("nan")),
        "trials": summary.num_trials,
        "errors": summary.num_errors,
    }
    print(
        f"  {precision} (round {round_no}): {wall:.1f} s wall, {out['trials']} trials, "
        f"{out['errors']} errors, best val {out['val']:.4f}, test {out['test']:.4f}{load_note()}",
        flush=True,
    )
    return out


def low_precision() -> str:
    """The low precision to compare with fp32: what ``auto`` resolves to on this machine's CPU
    where that is not fp32, else bf16 (``auto`` keeps fp32 on a CPU without AMX)."""
    from raypeft.modeling.precision import resolve_precision

    auto = resolve_precision("auto", "cpu")
    return auto if auto != "fp32" else "bf16"


def part_b(args: argparse.Namespace) -> None:
    from raypeft.modeling.precision import resolve_precision

    low = low_precision()
    order = ["fp32", low] if args.rounds == 1 else ["fp32", low, low, "fp32"]
    print(
        f"== Part B: {SPACE.relative_to(REPO)} with --set {args.set or '(none)'}; auto resolves "
        f"to {resolve_precision('auto', 'cpu')} here; order {', '.join(order)}",
        flush=True,
    )
    results: dict[str, list[dict]] = {"fp32": [], low: []}
    with tempfile.TemporaryDirectory(prefix="raypeft_bench_") as tmpdir:
        for i, precision in enumerate(order):
            results[precision].append(run_search(precision, args, Path(tmpdir), i))
    walls = {p: statistics.mean(r["wall"] for r in runs) for p, runs in results.items()}
    rows = [
        (
            p,
            f"{walls[p]:.1f}",
            f"{walls[p] / walls['fp32']:.2f}",
            " ".join(f"{r['val']:.4f}" for r in runs),
            " ".join(f"{r['test']:.4f}" for r in runs),
        )
        for p, runs in results.items()
    ]
    print_table(("precision", "wall (s)", "ratio to fp32", "best val acc", "its test acc"), rows)


# ----------------------------------------------------------------------------- CLI


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--skip-steps", action="store_true", help="skip Part A")
    p.add_argument("--skip-search", action="store_true", help="skip Part B")
    p.add_argument("--threads", type=int, default=2, help="torch threads in Part A")
    p.add_argument("--steps", type=int, default=12, help="timed steps per model in Part A")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per model in Part A")
    p.add_argument("--rounds", type=int, choices=(1, 2), default=1, help="Part B: 1 or 2 (ABBA)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override of dept.yaml for both searches, as raypeft tune --set",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    quiet_and_local()
    if not args.skip_steps:
        part_a(args)
    if not args.skip_search:
        part_b(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
