"""Search efficiency: DePT's full grid against TPE + ASHA, on one real task.

What it measures
----------------
The full DePT grid of the paper (α1 ∈ {0.3, 0.4, 0.5} × α2 ∈ {1e-4, 5e-4, 1e-3, 5e-3} × m ∈
{20, 40, 60, 80}, r derived from the budget of PT with l=100: 48 configurations) is run to the
end by raypeft's own search (``sampler: grid``, ``scheduler: none``). The same space is then
searched by TPE with ASHA stopping trials early, for ``--tpe-trials`` trials, once per
``--tpe-seeds`` sampler seed. Both go through ``raypeft.search.run.run_experiment``: real Ray Tune,
real Optuna (persisted study), real MLflow (a temporary sqlite store per search).

For each search it prints, side by side: the compute spent in trial-steps (training steps
summed over trials, read back from MLflow) and the best validation metric reached (by any
trial, at any step it reached, as the search itself sees it), with the ratios against the
grid. The goal (issue 4) is the grid's best within 0.5 points at <= 30% of its compute.

Every trial trains with the same seed (``search.trial_seed: fixed``), so a configuration that
both searches run scores the same in both: the comparison measures the search, not the noise.

Usage::

    python benchmarks/search_efficiency.py --data-dir ../shared/data     # or RAYPEFT_SHARED_DATA
    python benchmarks/search_efficiency.py --data-dir ../shared/data --task mr --steps 90
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ALPHA1 = [3e-1, 4e-1, 5e-1]
ALPHA2 = [1e-4, 5e-4, 1e-3, 5e-3]
PROMPT_LENGTHS = [20, 40, 60, 80]


def experiment(args, name: str, store: Path, **search) -> dict:
    """The experiment file both searches share, but for their ``search`` sections."""
    return {
        "name": name,
        "model": {"name": "minilm", "max_length": args.max_length},
        "task": {
            "name": args.task,
            "data_dir": str(Path(args.data_dir) / args.task),
            "max_train_examples": args.train_examples,
            "max_eval_examples": args.eval_examples,
            "max_test_examples": args.test_examples,
        },
        "method": {"name": "dept", "budget_prompt_length": 100, "prompt_length": 40},
        "train": {
            "max_steps": args.steps,
            "eval_every": args.eval_every,
            "batch_size": 16,
            "head_lr": 5e-3,
            "seed": 0,
        },
        "space": {
            "method.lr_prompt": {"choice": ALPHA1},
            "method.lr_lowrank": {"choice": ALPHA2},
            "method.prompt_length": {"choice": PROMPT_LENGTHS},
        },
        "search": search,
        "resources": {"cpus_per_worker": 1},
        "tracking": {"uri": f"sqlite:///{store / 'mlflow.db'}"},
        "run": {"storage_path": str(store / "ray_results")},
    }


def run_search(args, label: str, **search) -> dict:
    from mlflow.tracking import MlflowClient

    from raypeft.config.schema import validate_experiment
    from raypeft.search.run import run_experiment

    store = Path(tempfile.mkdtemp(prefix=f"search-efficiency-{label}-"))
    cfg = validate_experiment(experiment(args, f"efficiency-{label}", store, **search), label)
    start = time.perf_counter()
    summary = run_experiment(cfg, quiet=True)
    wall = time.perf_counter() - start
    client = MlflowClient(tracking_uri=summary.tracking_uri)
    steps, full = 0, 0
    for run_id in summary.trial_run_ids.values():
        history = client.get_metric_history(run_id, f"val_{summary.metric}")
        last = max((m.step for m in history), default=0)
        steps += last
        full += last >= args.steps
    best = summary.best_validation[f"val_{summary.metric}"]
    params = summary.best_params
    print(
        f"  {label}: {summary.num_trials} trials ({full} to the end), {steps} trial-steps, "
        f"best val {summary.metric} {best:.4f} at α1={params['method.lr_prompt']} "
        f"α2={params['method.lr_lowrank']} m={params['method.prompt_length']}, "
        f"{wall / 60:.1f} min",
        flush=True,
    )
    return {
        "label": label,
        "steps": steps,
        "best": best,
        "wall": wall,
        "trials": summary.num_trials,
        "full": full,
        "params": params,
        "test": summary.test,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=os.environ.get("RAYPEFT_SHARED_DATA"))
    parser.add_argument("--task", default="subj")
    parser.add_argument("--max-length", type=int, default=48)
    parser.add_argument("--train-examples", type=int, default=2000)
    parser.add_argument("--eval-examples", type=int, default=400)
    parser.add_argument("--test-examples", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=90, help="training steps of a full trial")
    parser.add_argument("--eval-every", type=int, default=30, help="one ASHA rung step")
    parser.add_argument("--tpe-trials", type=int, default=20)
    parser.add_argument("--tpe-seeds", default="0", help="TPE sampler seeds, comma-separated")
    parser.add_argument("--reduction-factor", type=float, default=3)
    args = parser.parse_args()
    if not args.data_dir or not (Path(args.data_dir) / args.task).is_dir():
        print(
            f"error: no {args.task}/ under --data-dir {args.data_dir!r} (../shared/data)",
            file=sys.stderr,
        )
        return 2
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    grid_size = len(ALPHA1) * len(ALPHA2) * len(PROMPT_LENGTHS)
    print(
        f"DePT on {args.task} (MiniLM, s={args.max_length}, {args.train_examples} train / "
        f"{args.eval_examples} validation examples), trials of {args.steps} steps, "
        f"evaluated every {args.eval_every}; budget = PT with l=100",
        flush=True,
    )
    results = [
        run_search(args, "grid", sampler="grid", num_samples=grid_size, scheduler={"type": "none"})
    ]
    for seed in [int(s) for s in args.tpe_seeds.split(",") if s.strip()]:
        results.append(
            run_search(
                args,
                f"tpe-asha-seed{seed}",
                sampler="tpe",
                seed=seed,
                num_samples=args.tpe_trials,
                scheduler={
                    "type": "asha",
                    "grace_period": 1,
                    "reduction_factor": args.reduction_factor,
                },
            )
        )
    grid = results[0]
    print()
    print(
        "| search | trials (to the end) | trial-steps | compute / grid | best val | "
        "points below grid | wall / grid |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['label']} | {r['trials']} ({r['full']}) | {r['steps']:,} | "
            f"{r['steps'] / grid['steps']:.2f} | {100 * r['best']:.2f} | "
            f"{100 * (grid['best'] - r['best']):+.2f} | {r['wall'] / grid['wall']:.2f} |"
        )
    goal = [
        r["label"]
        for r in results[1:]
        if r["steps"] <= 0.3 * grid["steps"] and 100 * (grid["best"] - r["best"]) <= 0.5
    ]
    print(
        f"\nGoal (within 0.5 points of the grid's best at <= 30% of its compute) met by: "
        f"{', '.join(goal) or 'none'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
