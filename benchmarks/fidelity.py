"""Fidelity on real tasks: PT vs DePT vs M-IDPG-PHM vs IPT at one trainable-parameter budget.

What it measures
----------------
On the real GLUE/SentEval files of ``../shared/data`` (read in place; nothing is copied), with
the pre-trained all-MiniLM-L6-v2 (packaged, d=384, N=6) as the frozen backbone, every method
gets the same budget (``--budget``, default 23,040 = PT with l=60) and derives its size knob
from it through ``budget_params``: PT's length, DePT's rank (at ``m`` = ``--dept-m``), the
M-IDPG-PHM generator width, and IPT's encoder width (Encoder IPT with an MLP encoder and
k=4 prompt vectors, on the frozen table pretrained on BBC News: at this budget a TextCNN over
384-d rows fits 3 filters, and the random/pretrained tables cost V·d = 11.7M).

Per task and method, a small fixed tuning budget: each of the method's learning rates (two,
from each paper's grid) is trained with seed 0; the one with the best validation metric is
kept; it is trained again with seeds 1 and 2. Each run keeps its best checkpoint by the
validation metric (the loop evaluates every ``--eval-every`` steps) and is scored once on the
test split. Reported: the test metric (mean ± std over the 3 seeds; accuracy, STS-B Pearson,
MRPC F1) per task and method, the chosen learning rate, the trainable count, and each
method's mean over the tasks, side by side.

Where a task has no labelled test split (SST-2 and RTE as GLUE ships them), raypeft's DePT
rule applies: validation is split in half (test = one half). Training sets are capped at
``--train-examples`` and validation/test at ``--eval-examples``/``--test-examples`` (random
subsets, fixed seed) to keep the run to about an hour on 2 cores: the numbers measure
relative fidelity at small scale, not the papers' full-data results.

Runs go to ``--jobs`` worker processes (forked after the tasks are tokenised, and IDPG's
sentence encodings computed once per task, so workers share them), one torch thread each.

Usage::

    python benchmarks/fidelity.py --data-dir ../shared/data            # or RAYPEFT_SHARED_DATA
    python benchmarks/fidelity.py --data-dir ../shared/data --tasks mr,rte --seeds 1 --steps 60
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

TASKS = ["mr", "subj", "cr", "mpqa", "sst2", "rte", "mrpc", "stsb"]

# method label -> (method section at the budget, the learning rates tried: the upper part of
# each paper's grid, as the runs are short; DePT's are (α1, α2))
METHOD_SETTINGS = {
    "PT": ({"name": "pt"}, [0.3, 0.03]),
    "DePT": ({"name": "dept", "prompt_length": 30}, [(0.3, 5e-3), (0.03, 1e-3)]),
    "M-IDPG-PHM": (
        {
            "name": "idpg",
            "layers": "multi",
            "version": "M",
            "generator": "phm",
            "phm_n": 4,
            "prompt_length": 5,
            "generator_input": "previous_layer",
        },
        [1e-2, 5e-3],
    ),
    "IPT": (
        {"name": "ipt", "strategy": "encoder", "encoder": "mlp", "num_prompts": 4},
        [1e-2, 5e-3],
    ),
}

_TASK_DATA: dict = {}  # task -> TokenizedTask, filled before the workers fork


def base_config(args, task: str) -> dict:
    return {
        "name": f"fidelity-{task}",
        "model": {"name": "minilm", "max_length": args.max_length},
        "task": {
            "name": task,
            "data_dir": str(Path(args.data_dir) / task),
            "max_train_examples": args.train_examples,
            "max_eval_examples": args.eval_examples,
            "max_test_examples": args.test_examples,
        },
        "budget_params": args.budget,
        "method": {"name": "pt"},
        "train": {
            "max_steps": args.steps,
            "eval_every": args.eval_every,
            "batch_size": 16,
            "head_lr": 5e-3,
            "seed": 0,
        },
    }


def with_lr(method: dict, lr) -> dict:
    if method["name"] == "dept":
        return {**method, "lr_prompt": lr[0], "lr_lowrank": lr[1]}
    return {**method, "lr": lr}


def run_one(job: tuple) -> dict:
    """Train one (task, method, lr, seed); score its best checkpoint once on test."""
    import torch
    from safetensors.torch import load_file

    from raypeft.config.schema import validate_experiment
    from raypeft.modeling.build import build_model
    from raypeft.training.datasets import split_dataset
    from raypeft.training.evaluation import evaluate
    from raypeft.training.loop import train

    torch.set_num_threads(1)
    base, task_name, label, method, lr, seed = job
    data = _TASK_DATA[task_name]
    cfg_dict = {**base, "method": with_lr(method, lr)}
    cfg_dict["train"] = {**base["train"], "seed": seed}
    cfg = validate_experiment(cfg_dict, f"fidelity:{task_name}:{label}")
    best_state: dict = {}

    def report(metrics: dict, folder: Path | None) -> None:
        if folder is not None:  # an improvement: keep its trainable tensors in memory
            best_state["tensors"] = load_file(str(folder / "trainable.safetensors"))

    start = time.perf_counter()
    best = train(cfg, data, report)
    model = build_model(cfg, data)
    model.load_trainable_state_dict(best_state["tensors"])
    test = evaluate(
        model, split_dataset(data, cfg, "test"), data.spec.metrics, 64, torch.device("cpu")
    )
    metric = data.spec.primary_metric
    return {
        "task": task_name,
        "method": label,
        "lr": lr,
        "seed": seed,
        "val": best[f"val_{metric}"],
        "test": test[metric],
        "params": model.method.num_trainable(),
        "seconds": time.perf_counter() - start,
    }


def prepare(args) -> None:
    """Tokenise every task once and compute IDPG's encodings once per task (parent only)."""
    from raypeft.config.schema import validate_experiment
    from raypeft.data import prepare_task
    from raypeft.search.run import precompute_features

    for task in args.tasks:
        cfg = validate_experiment(base_config(args, task), f"fidelity:{task}")
        start = time.perf_counter()
        data = prepare_task(cfg.task, cfg.model)
        for label in args.methods:
            method, _ = METHOD_SETTINGS[label]
            one = validate_experiment({**base_config(args, task), "method": method}, label)
            precompute_features(one, data, say=lambda *_: None)
        _TASK_DATA[task] = data
        sizes = "/".join(str(data.size(s)) for s in ("train", "validation", "test"))
        print(f"  {task}: {sizes} examples, prepared in {time.perf_counter() - start:.1f} s")


def run_pool(jobs: list[tuple], processes: int) -> list[dict]:
    if processes <= 1:
        return [run_one(job) for job in jobs]
    with mp.get_context("fork").Pool(processes) as pool:
        return pool.map(run_one, jobs, chunksize=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=os.environ.get("RAYPEFT_SHARED_DATA"))
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--methods", default=",".join(METHOD_SETTINGS))
    parser.add_argument("--budget", type=int, default=23040, help="trainable parameters")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--eval-every", type=int, default=30)
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--train-examples", type=int, default=2000)
    parser.add_argument("--eval-examples", type=int, default=200)
    parser.add_argument("--test-examples", type=int, default=500)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--markdown", type=Path, help="also write the tables here")
    args = parser.parse_args()
    if not args.data_dir or not Path(args.data_dir).is_dir():
        sys.exit("error: name the shared data folder with --data-dir or RAYPEFT_SHARED_DATA")
    args.tasks = args.tasks.split(",")
    args.methods = args.methods.split(",")
    unknown = [m for m in args.methods if m not in METHOD_SETTINGS]
    if unknown:
        sys.exit(f"error: --methods: unknown {unknown}; choose from {list(METHOD_SETTINGS)}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.chdir(tempfile.mkdtemp(prefix="raypeft-fidelity-"))  # checkpoints' temp files land here
    start = time.perf_counter()
    print(f"Preparing {len(args.tasks)} tasks (MiniLM, s={args.max_length}) ...")
    prepare(args)

    # round 1: every learning rate at seed 0
    jobs = []
    for task in args.tasks:
        base = base_config(args, task)
        for label in args.methods:
            method, lrs = METHOD_SETTINGS[label]
            jobs += [(base, task, label, method, lr, 0) for lr in lrs]
    print(f"Round 1: {len(jobs)} runs (each method's learning rates, seed 0) ...")
    results = run_pool(jobs, args.jobs)
    # round 2: the validation-chosen learning rate with the other seeds
    chosen = {}
    for task in args.tasks:
        for label in args.methods:
            runs = [r for r in results if r["task"] == task and r["method"] == label]
            chosen[task, label] = max(runs, key=lambda r: r["val"])
    jobs = [
        (base_config(args, task), task, label, METHOD_SETTINGS[label][0], best["lr"], seed)
        for (task, label), best in chosen.items()
        for seed in range(1, args.seeds)
    ]
    print(f"Round 2: {len(jobs)} runs (chosen learning rate, seeds 1..{args.seeds - 1}) ...")
    results += run_pool(jobs, args.jobs)
    lines = report(args, results, chosen, time.perf_counter() - start)
    print("\n".join(lines))
    if args.markdown:
        args.markdown.write_text("\n".join(lines) + "\n")


def report(args, results: list[dict], chosen: dict, wall: float) -> list[str]:
    lines = [
        f"Test metric (x100), mean ± std over {args.seeds} seeds, budget {args.budget:,} "
        f"trainable parameters (task head excluded), MiniLM s={args.max_length}, "
        f"{args.steps} steps, train ≤{args.train_examples}",
        "",
        "| task | metric | " + " | ".join(args.methods) + " |",
        "|---|---|" + "---|" * len(args.methods),
    ]
    means: dict[str, list[float]] = {m: [] for m in args.methods}
    for task in args.tasks:
        metric = _TASK_DATA[task].spec.primary_metric
        cells = []
        for label in args.methods:
            lr = chosen[task, label]["lr"]
            scores = [
                100 * r["test"]
                for r in results
                if r["task"] == task and r["method"] == label and r["lr"] == lr
            ]
            mean = statistics.mean(scores)
            std = statistics.stdev(scores) if len(scores) > 1 else 0.0
            means[label].append(mean)
            cells.append(f"{mean:.1f} ± {std:.1f}")
        lines.append(f"| {task} | {metric} | " + " | ".join(cells) + " |")
    lines.append(
        "| **mean** | | "
        + " | ".join(f"**{statistics.mean(means[m]):.1f}**" for m in args.methods)
        + " |"
    )
    lines += [
        "",
        "| method | trainable parameters | learning rate chosen (per task) |",
        "|---|---|---|",
    ]
    for label in args.methods:
        params = {r["params"] for r in results if r["method"] == label}
        lrs = ", ".join(f"{t}: {chosen[t, label]['lr']}" for t in args.tasks)
        lines.append(f"| {label} | {', '.join(f'{p:,}' for p in sorted(params))} | {lrs} |")
    seconds = sum(r["seconds"] for r in results)
    lines += ["", f"{len(results)} runs, {seconds / 60:.1f} run-minutes, wall {wall / 60:.1f} min"]
    return lines


if __name__ == "__main__":
    main()
