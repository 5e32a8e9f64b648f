"""Trial packing on the shipped search: ``search_spaces/dept.yaml`` unpacked against packed.

What it measures
----------------
The README's main command (``raypeft tune --space search_spaces/dept.yaml``) run through
``raypeft.search.run.run_experiment`` twice in one run, IN ORDER: unpacked (the file as
shipped, ``resources.trials_per_worker: 1``), then packed (``trials_per_worker=K``, ``--k``,
default 4; every other setting as shipped, so each trial asks Ray for 1/K of the shipped worker
and the two cores hold two packs of K). With ``--rounds 2`` the order is unpacked, packed,
packed, unpacked (ABBA), so a drift of the machine's load hits both alike. Each search starts
and shuts down its own local Ray, writes MLflow to a sqlite file and Ray to a storage path in a
temp dir.

Reported per variant: wall time (mean over rounds) and its ratio to unpacked; trials, stopped
early and failed; the training steps all trials took together (``trial-steps``: what ASHA's
decisions cost, since K trials in flight per pack change which trials reach a rung first); the
packs' padding waste (the mean over trials of ``pack_padding_waste``: members of other prompt
lengths m are padded to the pack's longest); the best trial's validation and test accuracy.
``--set k=v`` applies overrides to both searches as ``raypeft tune --set`` does, e.g. a tiny
run to check it starts:

    .venv/bin/python -m benchmarks.device.packing_search \\
        --set train.max_steps=4 --set train.eval_every=2 --set search.num_samples=4

Absolute numbers depend on the (shared, 2-core) machine; read the ratios.

How to run
----------
    .venv/bin/python -m benchmarks.device.packing_search              # ~30 min on 2 cores
    .venv/bin/python -m benchmarks.device.packing_search --k 2 --rounds 2
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from benchmarks.common.machine import load_note
from benchmarks.common.paths import REPO, SHIPPED_SEARCH
from benchmarks.common.searches import experiment_in, quiet_and_local, timed_search
from benchmarks.common.tables import print_table

SPACE = SHIPPED_SEARCH


def search_config(k: int, overrides: list[str], tmp: Path, round_no: int):
    """The shipped experiment with this round's own name and stores, packed by ``k``."""
    extra = [*overrides, f"resources.trials_per_worker={k}"]
    return experiment_in(SPACE, f"bench-packing-k{k}-{round_no}", extra, tmp)


def trial_records(tracking_uri: str, run_ids) -> tuple[int, float | None]:
    """The training steps the search's trials took together (each trial's last reported
    step), and the mean of their packs' padding waste (None unpacked), from their MLflow runs."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=tracking_uri)
    total, waste = 0, []
    for run_id in run_ids:
        history = client.get_metric_history(run_id, "train_loss")
        total += max((m.step for m in history), default=0)
        padding = client.get_run(run_id).data.metrics.get("pack_padding_waste")
        if padding is not None:
            waste.append(padding)
    return total, (statistics.mean(waste) if waste else None)


def run_search(k: int, args: argparse.Namespace, tmp: Path, round_no: int) -> dict:
    """One whole search; its wall time and outcome."""
    summary, wall = timed_search(search_config(k, args.set, tmp, round_no), tmp)
    steps, waste = trial_records(summary.tracking_uri, summary.trial_run_ids.values())
    out = {
        "wall": wall,
        "val": summary.best_validation.get("val_accuracy", float("nan")),
        "test": summary.test.get("test_accuracy", float("nan")),
        "trials": summary.num_trials,
        "stopped": summary.num_pruned,
        "errors": summary.num_errors,
        "steps": steps,
        "waste": waste,
        "best": summary.best_params,
    }
    print(
        f"  K={k} (round {round_no}): {wall:.1f} s wall, {out['trials']} trials "
        f"({out['stopped']} stopped early, {out['errors']} failed), {out['steps']} trial-steps, "
        f"padding waste {'-' if waste is None else f'{waste:.2f}'}, "
        f"best val {out['val']:.4f}, test {out['test']:.4f}, {out['best']}{load_note()}",
        flush=True,
    )
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--k", type=int, default=4, help="trials per pack in the packed search")
    p.add_argument("--rounds", type=int, choices=(1, 2), default=1, help="1, or 2 (ABBA)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override of dept.yaml for both searches, as raypeft tune --set",
    )
    args = p.parse_args(argv)
    if args.k < 2:
        p.error("--k must be at least 2")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    quiet_and_local()
    order = [1, args.k] if args.rounds == 1 else [1, args.k, args.k, 1]
    print(f"== {SPACE.relative_to(REPO)} with --set {args.set or '(none)'}; order K={order}")
    results: dict[int, list[dict]] = {1: [], args.k: []}
    with tempfile.TemporaryDirectory(prefix="raypeft_bench_") as tmpdir:
        for i, k in enumerate(order):
            results[k].append(run_search(k, args, Path(tmpdir), i))
    walls = {k: statistics.mean(r["wall"] for r in runs) for k, runs in results.items()}
    rows = [
        (
            "unpacked" if k == 1 else f"packed, K={k}",
            f"{walls[k]:.1f}",
            f"{walls[k] / walls[1]:.2f}",
            " ".join(f"{r['trials']}/{r['stopped']}/{r['errors']}" for r in runs),
            " ".join(str(r["steps"]) for r in runs),
            " ".join("-" if r["waste"] is None else f"{r['waste']:.2f}" for r in runs),
            " ".join(f"{r['val']:.4f}" for r in runs),
            " ".join(f"{r['test']:.4f}" for r in runs),
        )
        for k, runs in results.items()
    ]
    header = (
        "search",
        "wall (s)",
        "ratio",
        "trials/stopped/failed",
        "trial-steps",
        "padding waste",
        "best val acc",
        "its test acc",
    )
    print_table(header, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
