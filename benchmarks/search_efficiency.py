"""Search efficiency: DePT's full grid against TPE + ASHA, on one real task.

What it measures
----------------
The full DePT grid of the paper (α1 ∈ {0.3, 0.4, 0.5} × α2 ∈ {1e-4, 5e-4, 1e-3, 5e-3} × m ∈
{20, 40, 60, 80}, r derived from the budget of PT with l=100: 48 configurations) is run to the
end by raypeft's own search (``sampler: grid``, ``scheduler: none``). The same space is then
searched by TPE with ASHA stopping trials early, for ``--tpe-trials`` proposals, once per
``--tpe-seeds`` sampler seed. Both go through ``raypeft.search.run.run_experiment``: real Ray Tune,
real Optuna (persisted study), real MLflow (a temporary sqlite store per search).

For each search it prints, side by side: the compute spent in trial-steps (training steps
summed over trials, read back from MLflow) and the best validation metric reached (by any
trial, at any step it reached, as the search itself sees it), with the ratios against the
grid. The goal (issue 12) is the grid's best within 0.5 points at <= 30% of its compute, as the
median over the TPE seeds.

Every trial trains with the same seed (``search.trial_seed: fixed``) in fp32, so a
configuration that both searches run scores the same in both: the comparison measures the
search, not the noise. That is also why a grid, once run, can be reused: every grid run writes
``--grid-out`` (per-configuration best value and steps, totals, settings, date, git revision),
and ``--grid-from FILE`` compares new TPE seeds against it without running the grid again (its
settings must match this run's). ``--check`` runs chosen configurations alone, to confirm that
a grid file still reproduces on today's code.

Usage::

    python -m benchmarks.search_efficiency --data-dir ../shared/data     # or RAYPEFT_SHARED_DATA
    python -m benchmarks.search_efficiency --data-dir ../shared/data --tpe-seeds 0,1,2 \\
        --grid-from benchmarks/results/search_efficiency_grid_subj.json
    python -m benchmarks.search_efficiency --data-dir ../shared/data --check 0.3,1e-4,20
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common.results import ResultsFile
from benchmarks.common.tables import print_table as print_markdown

ALPHA1 = [3e-1, 4e-1, 5e-1]
ALPHA2 = [1e-4, 5e-4, 1e-3, 5e-3]
PROMPT_LENGTHS = [20, 40, 60, 80]
KEYS = ("method.lr_prompt", "method.lr_lowrank", "method.prompt_length")
# settings a grid file must share with the TPE runs compared against it
SETTINGS = ("task", "max_length", "train_examples", "eval_examples", "steps", "eval_every")


def settings(args) -> dict:
    """The benchmark settings that decide a configuration's score."""
    return {k: getattr(args, k) for k in SETTINGS} | {"precision": "fp32", "seed": 0}


def train_section(args) -> dict:
    """Training settings of every trial; fp32 pinned where the platform has the key, since
    the reference grid was measured in fp32 (bf16 would score configurations differently)."""
    from raypeft.config.schema import TrainConfig  # why: the benchmark's CLI starts fast

    train = {
        "max_steps": args.steps,
        "eval_every": args.eval_every,
        "batch_size": 16,
        "head_lr": 5e-3,
        "seed": 0,
    }
    if "precision" in TrainConfig.model_fields:
        train["precision"] = "fp32"
    return train


def experiment(args, name: str, store: Path, space: dict | None = None, **search) -> dict:
    """The experiment file every search shares, but for its ``search`` section (and, for
    ``--check``, a space narrowed to one configuration)."""
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
        "train": train_section(args),
        "space": space
        or {
            "method.lr_prompt": {"choice": ALPHA1},
            "method.lr_lowrank": {"choice": ALPHA2},
            "method.prompt_length": {"choice": PROMPT_LENGTHS},
        },
        "search": search,
        "resources": {"cpus_per_worker": 1},
        "tracking": {"uri": f"sqlite:///{store / 'mlflow.db'}"},
        "run": {"storage_path": str(store / "ray_results")},
    }


def typed(params: dict) -> dict:
    """A configuration as numbers (MLflow keeps params as strings)."""
    return {k: (int if k.endswith("prompt_length") else float)(params[k]) for k in KEYS}


def trial_records(summary, metric: str) -> list[dict]:
    """Per trial, read back from MLflow: its configuration, steps trained, best value."""
    from mlflow.tracking import MlflowClient  # why: the benchmark's CLI starts fast

    client = MlflowClient(tracking_uri=summary.tracking_uri)
    out = []
    for run_id in summary.trial_run_ids.values():
        history = client.get_metric_history(run_id, f"val_{metric}")
        params = client.get_run(run_id).data.params
        out.append(
            {
                "params": typed(params),
                "steps": max((m.step for m in history), default=0),
                "best": max((m.value for m in history), default=float("nan")),
            }
        )
    return out


def answered_proposals(summary) -> int:
    """Proposals the search answered from its Optuna study instead of training (a
    configuration it had already run)."""
    import optuna  # why: the benchmark's CLI starts fast

    from raypeft.search.study import ANSWERED_FROM_ATTR

    study = optuna.load_study(study_name=summary.optuna_study, storage=summary.optuna_storage)
    return sum(ANSWERED_FROM_ATTR in t.user_attrs for t in study.get_trials(deepcopy=False))


def run_search(args, label: str, space: dict | None = None, **search) -> dict:
    """Run one search through raypeft; its compute, best value and per-trial records."""
    from raypeft.config.loading import validate_experiment
    from raypeft.search.run import run_experiment

    store = Path(tempfile.mkdtemp(prefix=f"search-efficiency-{label}-"))
    raw = experiment(args, f"efficiency-{label}", store, space, **search)
    cfg = validate_experiment(raw, label)
    start = time.perf_counter()
    summary = run_experiment(cfg, quiet=True)
    wall = time.perf_counter() - start
    trials = trial_records(summary, summary.metric)
    best = summary.best_validation[f"val_{summary.metric}"]
    params = summary.best_params
    result = {
        "label": label,
        "steps": sum(t["steps"] for t in trials),
        "best": best,
        "wall": wall,
        "trials": summary.num_trials,
        "full": sum(t["steps"] >= args.steps for t in trials),
        "answered": answered_proposals(summary),
        "params": typed(params),
        "configurations": trials,
        "search": search,
        "store": str(store),
    }
    print(
        f"  {label}: {result['trials']} trials ({result['full']} to the end, "
        f"{result['answered']} proposals answered from the study), {result['steps']} "
        f"trial-steps, best val {summary.metric} {best:.4f} at α1={params[KEYS[0]]} "
        f"α2={params[KEYS[1]]} m={params[KEYS[2]]}, {wall / 60:.1f} min  [{store}]",
        flush=True,
    )
    return result


def git_rev() -> str:
    """The raypeft revision measured (``+dirty`` when the work tree has changes);
    ``RAYPEFT_REV`` names it for a copy of the tree outside git."""
    if os.environ.get("RAYPEFT_REV"):
        return os.environ["RAYPEFT_REV"]
    here = Path(__file__).resolve().parent
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain"], cwd=here, capture_output=True, text=True
        ).stdout.strip()
        return rev + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write_grid(args, grid: dict) -> None:
    """The grid's record, for ``--grid-from``."""
    record = {
        "source": "measured by benchmarks/search_efficiency.py",
        "date": datetime.date.today().isoformat(),
        "raypeft_rev": git_rev(),
        "settings": settings(args),
        **{k: grid[k] for k in ("steps", "best", "wall", "trials", "full", "params")},
        "configurations": grid["configurations"],
    }
    Path(args.grid_out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.grid_out).write_text(json.dumps(record, indent=2) + "\n")
    print(f"  grid written to {args.grid_out}", flush=True)


def read_grid(args) -> dict:
    """A grid record written earlier (or transcribed); its settings must match this run's."""
    record = json.loads(Path(args.grid_from).read_text())
    mine = settings(args)
    differ = {k: (v, mine.get(k)) for k, v in record["settings"].items() if mine.get(k) != v}
    if differ:
        raise SystemExit(f"error: --grid-from was measured with other settings: {differ}")
    print(f"  grid from {args.grid_from} ({record['source']}, {record['date']})", flush=True)
    return {"label": "grid", **record}


def unrun_grid(args) -> dict:
    """The grid, not run: its trial-steps are known (every configuration runs to the end),
    its best value is not (``--skip-grid``: compute ratios only, compare later)."""
    size = len(ALPHA1) * len(ALPHA2) * len(PROMPT_LENGTHS)
    nan = float("nan")
    return {
        "label": "grid (not run)",
        "steps": size * args.steps,
        "best": nan,
        "wall": nan,
        "trials": size,
        "full": size,
    }


def check_configurations(args) -> int:
    """Run each ``--check`` configuration alone and compare with the grid file's value."""
    known = {}
    if args.grid_from:
        grid = read_grid(args)
        known = {json.dumps(c["params"], sort_keys=True): c["best"] for c in grid["configurations"]}
    ok = True
    for spec in args.check:
        values = [float(v) for v in spec.split(",")]
        point = dict(zip(KEYS, [values[0], values[1], int(values[2])], strict=True))
        space = {k: {"choice": [v]} for k, v in point.items()}
        r = run_search(
            args, "check", space, sampler="grid", num_samples=1, scheduler={"type": "none"}
        )
        want = known.get(json.dumps(point, sort_keys=True))
        same = want is None or round(100 * r["best"], 2) == round(100 * want, 2)
        ok &= same
        print(
            f"  check {point}: {100 * r['best']:.2f} (grid file: {want and 100 * want})", flush=True
        )
    return 0 if ok else 1


def tpe_search(args, seed: int) -> dict:
    """TPE with the scheduler under test, one sampler seed."""
    scheduler = {
        "type": "asha",
        "grace_period": args.grace_period,
        "reduction_factor": args.reduction_factor,
    }
    if args.scheduler_metric:
        scheduler["metric"] = args.scheduler_metric
    return run_search(
        args,
        f"tpe-asha-seed{seed}",
        sampler="tpe",
        seed=seed,
        num_samples=args.tpe_trials,
        scheduler=scheduler,
    )


SEARCH_HEADER = (
    "search", "trials (to the end)", "answered from study", "trial-steps", "compute / grid",
    "best val", "points below grid", "wall / grid",
)  # fmt: skip


def print_table(results: list[dict]) -> None:
    """Side by side against the grid (the first row), then the median over TPE seeds."""
    grid = results[0]
    rows = [
        (
            r["label"],
            f"{r['trials']} ({r['full']})",
            str(r.get("answered", 0)),
            f"{r['steps']:,}",
            f"{r['steps'] / grid['steps']:.2f}",
            f"{100 * r['best']:.2f}",
            f"{100 * (grid['best'] - r['best']):+.2f}",
            f"{r['wall'] / grid['wall']:.2f}",
        )  # fmt: skip
        for r in results
    ]
    print()
    print_markdown(SEARCH_HEADER, rows)
    tpe = results[1:]
    if not tpe:
        return
    compute = statistics.median(r["steps"] / grid["steps"] for r in tpe)
    below = statistics.median(100 * (grid["best"] - r["best"]) for r in tpe)
    met = compute <= 0.3 and below <= 0.5
    print(
        f"\nMedian over {len(tpe)} TPE seed(s): compute / grid {compute:.2f}, {below:+.2f} points "
        f"below the grid's best. Goal (within 0.5 points at <= 30% of the grid's compute): "
        f"{'met' if met else 'not met'}"
    )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=os.environ.get("RAYPEFT_SHARED_DATA"))
    parser.add_argument("--task", default="subj")
    parser.add_argument("--max-length", type=int, default=48)
    parser.add_argument("--train-examples", type=int, default=2000)
    parser.add_argument("--eval-examples", type=int, default=400)
    parser.add_argument("--test-examples", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=90, help="training steps of a full trial")
    parser.add_argument("--eval-every", type=int, default=30, help="one ASHA rung step")
    parser.add_argument("--tpe-trials", type=int, default=20, help="proposals per TPE search")
    parser.add_argument("--tpe-seeds", default="0,1,2", help="TPE sampler seeds, comma-separated")
    parser.add_argument("--reduction-factor", type=float, default=3)
    parser.add_argument("--grace-period", type=int, default=1, help="first rung, in evaluations")
    parser.add_argument("--scheduler-metric", default="val_loss", help="'' = the search metric")
    parser.add_argument("--grid-from", help="a grid record (JSON) instead of running the grid")
    parser.add_argument("--grid-out", default="search_efficiency_grid.json")
    parser.add_argument("--check", nargs="+", metavar="A1,A2,M", help="run these alone")
    parser.add_argument("--skip-grid", action="store_true", help="compute ratios only")
    parser.add_argument("--tpe-out", default="search_efficiency_tpe.jsonl", help="appended to")
    parser.add_argument("--tpe-from", help="TPE results (JSON lines) instead of running seeds")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    if not args.data_dir or not (Path(args.data_dir) / args.task).is_dir():
        print(
            f"error: no {args.task}/ under --data-dir {args.data_dir!r} (../shared/data)",
            file=sys.stderr,
        )
        return 2
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    print(
        f"DePT on {args.task} (MiniLM, s={args.max_length}, {args.train_examples} train / "
        f"{args.eval_examples} validation examples), trials of {args.steps} steps, "
        f"evaluated every {args.eval_every}; budget = PT with l=100",
        flush=True,
    )
    if args.check:
        return check_configurations(args)
    if args.skip_grid:
        results = [unrun_grid(args)]
    elif args.grid_from:
        results = [read_grid(args)]
    else:
        grid_size = len(ALPHA1) * len(ALPHA2) * len(PROMPT_LENGTHS)
        results = [
            run_search(
                args, "grid", sampler="grid", num_samples=grid_size, scheduler={"type": "none"}
            )
        ]
        write_grid(args, results[0])
    if args.tpe_from:
        results += ResultsFile(args.tpe_from).rows()
    for seed in [int(s) for s in args.tpe_seeds.split(",") if s.strip()]:
        results.append(tpe_search(args, seed))
        # kept: a later grid run can be compared
        ResultsFile(args.tpe_out).append(results[-1] | {"settings": settings(args)})
        print_table(results)  # after each seed: a partial table survives an interruption
    print_table(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
