"""Simulation agrees with reality (issue 25, item 3): real searches against the replayed band.

Runs a search file (default: the shipped ``search_spaces/dept.yaml``) for real, as
``raypeft tune`` does, on a learning-curve table's recording: the very experiment
``raypeft simulate`` replays (:func:`raypeft.search.simulate.plan.replay_config`: the table's
model, task, training length and evaluations; the file's space and search; the table's
concurrency), in the precision the recorded trials resolved ``train.precision`` to (``auto``
depends on the machine and the day). Real run *k* uses sampler seed ``search.seed + k`` and
trains every trial with ``train.seed`` = ``--train-seed`` + k, a seed the table did not
record, so each real run is a fresh draw of the noise, not a replay of recorded values.

Each real run is scored as a replay is, against the same table: its compute (trial-steps,
and the wall time from its first trial's start to its last trial's end, as fractions of the
full grid's: ``len(grid) x steps`` and the grid's simulated wall, median over the replays'
seed draws) and the regret of the configuration it chose (by the table's seed-means). The
wall fraction is printed twice: as measured, and divided by the run's **pace** (its trials'
clock over the table's at the same configuration and step: how much slower this machine
trains than the recording's), since the simulated grid runs at the recording machine's pace.
The same file is then replayed ``--replays`` times, and each real figure is printed with the
percentile where it falls among the replays and whether it lies inside their 5th-95th
percentile band.

Real runs are appended to ``--out`` (JSON lines) as each finishes; one already there (same
table, the file's settings and seeds) is not run again, so an interrupted check continues;
``--chunk N`` stops after N new real runs (resumable chunks on a shared machine).

**Means, not a band** (issue 57, item 5): one real run placed in the replays' band of
single-seed scores says little (on README's task the band ran from -1.44 to 3.55 points). Each
real run is also scored by its **unseen-seed mean**: the mean, over the table's seeds (none of
which it trained), of its choice's held-out regret on that seed against the reference picked
without it (:meth:`Quality.heldout_regret`), the figure a replay's held-out regret estimates
from one seed. The real runs' mean of it (bootstrap interval over runs) is printed beside the
replays' mean held-out regret (hierarchical interval: seeds, then replays).

**Paired real runs** (``--pair FILE``, a second search file): real run k of each file at the
same seeds (sampler ``search.seed + k``, ``train.seed`` ``--train-seed + k``), run one after
the other so that a chunk ends with whole pairs; the paired differences (the file minus the
pair, unseen-seed mean regret, trial-steps and wall) with a bootstrap interval over pairs,
beside what the replays predict for the same two files (paired, hierarchical interval).

Usage::

    python -m benchmarks.search.simulation_check --table benchmarks/results/table_dept_subj.json \\
        --set task.data_dir=../shared/data/subj --runs 3
    git show 538285c:search_spaces/dept.yaml > /tmp/dept_previous.yaml   # the search before
    python -m benchmarks.search.simulation_check \\
        --table benchmarks/results/table_dept_tweets.json \\
        --runs 6 --pair /tmp/dept_previous.yaml --chunk 2   # again until 6 pairs are stored
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
from pathlib import Path

import numpy as np
import optuna
import yaml

from benchmarks.common.paths import REPO, RESULTS, digest
from benchmarks.common.results import ResultsFile
from benchmarks.common.searches import quiet_and_local, timed_search
from benchmarks.common.tables import print_table
from raypeft.config.dotted import set_dotted
from raypeft.config.loading import load_experiment, parse_override, validate_experiment
from raypeft.config.space import configuration_key
from raypeft.search.simulate.plan import fixed_values, replay_config
from raypeft.search.simulate.runs import simulate
from raypeft.search.simulate.scores import Quality, hierarchical_interval
from raypeft.search.simulate.table import WALL_METRIC, CurveTable
from raypeft.tracking.tags import CONFIGURATION_TAG

BAND = (5, 95)  # a real run "agrees" when it lies inside this percentile band of the replays


def real_config(search, table: CurveTable, k: int, train_seed: int, overrides: list[str],
                folder: Path):  # fmt: skip
    """The replayed experiment, to be run for real: sampler seed ``search.seed + k``, every
    trial at ``train.seed`` ``train_seed + k``, records in ``folder``."""
    cfg = replay_config(search, table, table.concurrency())
    data = cfg.model_dump(mode="json")
    data["name"] = f"{search.name}-check-{k}"
    data["search"]["seed"] = cfg.search.seed + k
    data["train"]["seed"] = train_seed + k
    if table.source.get("precision") in ("fp32", "bf16", "fp16"):  # what `auto` was then
        data["train"]["precision"] = table.source["precision"]
    data["tracking"] = {"uri": f"sqlite:///{folder / 'mlflow.db'}"}
    data["run"] = {**data.get("run", {}), "storage_path": str(folder / "ray_results")}
    for override in overrides:
        set_dotted(data, *parse_override(override))
    return validate_experiment(data, "the real check")


def pace(client, trials, table: CurveTable) -> float | None:
    """How much slower this machine trains than the table's did: the median, over the real
    trials' evaluations, of the trial's clock at that step over the table's median clock for
    the same configuration and step (every recorded seed). The wall fractions are measured
    against the table's simulated grid, so a machine 1.5 times slower than the recording's
    shows a search 1.5 times costlier than it is; divided by this, they compare like with
    like. None when no real evaluation has a recorded twin."""
    recorded = {}
    for configuration, curves in table.by_configuration().items():
        for curve in curves:
            for step, wall in zip(curve.steps, curve.wall_s, strict=True):
                recorded.setdefault((configuration, step), []).append(wall)
    ratios = []
    for trial in trials:
        # the tag each trial's run carries: the table's configuration_key of its values
        configuration = trial.data.tags.get(CONFIGURATION_TAG)
        for m in client.get_metric_history(trial.info.run_id, WALL_METRIC):
            walls = recorded.get((configuration, m.step))
            if walls:
                ratios.append(m.value / float(np.median(walls)))
    return float(np.median(ratios)) if ratios else None


def real_run(cfg, table: CurveTable, quality: Quality, grid_steps: int, grid_wall: float,
             folder: Path) -> dict:  # fmt: skip
    """Run ``cfg`` for real and score it as a replay is scored."""
    from mlflow.tracking import MlflowClient

    summary, wall = timed_search(cfg, folder)
    client = MlflowClient(summary.tracking_uri)
    trials = [client.get_run(run_id) for run_id in summary.trial_run_ids.values()]
    steps = [
        max((m.step for m in client.get_metric_history(t.info.run_id, "val_loss")), default=0)
        for t in trials
    ]
    makespan = (
        max(t.info.end_time for t in trials) - min(t.info.start_time for t in trials)
    ) / 1000
    searched = {k: v for k, v in summary.best_params.items() if k in cfg.space}
    chosen = configuration_key({**fixed_values(cfg, table), **searched})
    return {
        "sampler_seed": cfg.search.seed,
        "train_seed": cfg.train.seed,
        "chosen": chosen,
        "regret": quality.regret(chosen),
        "normalised": quality.normalised(chosen),
        "steps": sum(steps) / grid_steps,
        "wall": makespan / grid_wall,
        "pace": pace(client, trials, table),
        "trials": len(trials),
        "stopped": sum(s < cfg.train.max_steps for s in steps),
        "search_wall_s": round(wall, 1),
        "trials_wall_s": round(makespan, 1),
        "best_val": summary.best_validation.get(f"val_{summary.metric}"),
        "test": summary.test.get(f"test_{summary.metric}"),
    }


def percentile_of(value: float, values: list[float]) -> float:
    """Where ``value`` falls among ``values``: the percentage of them at or below it."""
    return 100.0 * sum(v <= value for v in values) / len(values)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    quiet_and_local()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # a line per study otherwise
    table = CurveTable.load(args.table)
    spaces = [args.space] + ([args.pair] if args.pair else [])
    searches = [load_experiment(space) for space in spaces]
    sims = [
        simulate(
            search, table, replays=args.replays, concurrency=table.concurrency(), label=space.stem
        )
        for search, space in zip(searches, spaces, strict=True)
    ]
    grid_steps, grid_wall = sims[0].grid_figures()  # each real run is scored against these
    keys = [run_key(args.table, space, args.train_seed) for space in spaces]
    results = ResultsFile(args.out, key=lambda r: (r["key"], r["k"]))
    runs = [[r for r in results.rows() if r["key"] == key] for key in keys]
    started = 0
    for k in range(args.runs):
        for search, key, done in zip(searches, keys, runs, strict=True):
            if results.done((key, k)):
                continue
            if args.chunk is not None and started >= args.chunk:
                break
            started += 1
            with tempfile.TemporaryDirectory(prefix="simulation-check-") as tmp:
                cfg = real_config(search, table, k, args.train_seed, args.set, Path(tmp))
                print(f"real run {k} of {search.name}: sampler seed {cfg.search.seed}, "
                      f"train.seed {cfg.train.seed}", flush=True)  # fmt: skip
                row = {"key": key, "k": k}
                row |= real_run(cfg, table, sims[0].quality, grid_steps, grid_wall, Path(tmp))
            done.append(results.append(row))
            print(f"real run {k}: {json.dumps(row)}", flush=True)
    for space, sim, done in zip(spaces, sims, runs, strict=True):
        report(sim, done, argparse.Namespace(space=space, table=args.table), grid_steps,
               grid_wall)  # fmt: skip
        print(means_line(sim, done))
    if args.pair:
        print(pairs_line(sims, runs))


def unseen_mean(quality: Quality, chosen: str) -> float:
    """A real run's choice scored on every seed of the table (it trained none of them): the
    mean of its held-out regret on each, against the reference picked without that seed."""
    seeds = sorted(next(iter(quality.values.values())))
    return float(np.mean([quality.heldout_regret(chosen, seed) for seed in seeds]))


def mean_interval(values: list[float]) -> str:
    """``mean [bootstrap 95% interval]`` over independent values (real runs or pairs)."""
    if not values:
        return "-"
    if len(values) < 2:
        return f"{values[0]:+.2f} (one run)"
    low, high = hierarchical_interval(np.asarray(values), list(range(len(values))))
    return f"{np.mean(values):+.2f} [{low:+.2f}, {high:+.2f}]"


def means_line(sim, runs: list[dict]) -> str:
    """The real runs' unseen-seed mean regret beside the replays' mean held-out regret."""
    real = [unseen_mean(sim.quality, r["chosen"]) for r in sorted(runs, key=lambda r: r["k"])]
    replayed = sim.spread("heldout")
    held = [s.heldout for s in sim.scores if np.isfinite(s.heldout)]
    groups = [s.heldout_seed for s in sim.scores if np.isfinite(s.heldout)]
    low, high = hierarchical_interval(np.asarray(held), groups) if held else (np.nan, np.nan)
    return (f"{sim.name}: real runs' unseen-seed mean regret {mean_interval(real)} points "
            f"({len(real)} runs: {', '.join(f'{v:.2f}' for v in real)}); the replays' mean "
            f"held-out regret {np.mean(held):+.2f} [{low:+.2f}, {high:+.2f}] ({replayed.n} "
            f"replays, seeds then replays)")  # fmt: skip


def pairs_line(sims, runs: list[list[dict]]) -> str:
    """The first file minus the pair, real run k against real run k, beside the replays'."""
    a, b = ({r["k"]: r for r in done} for done in runs)
    both = sorted(a.keys() & b.keys())
    quality = sims[0].quality
    cells = []
    for name, figure in (("unseen-seed mean regret", None), ("trial-steps / grid", "steps"),
                         ("wall / grid", "wall")):  # fmt: skip
        if figure is None:
            d = [unseen_mean(quality, a[k]["chosen"]) - unseen_mean(quality, b[k]["chosen"])
                 for k in both]  # fmt: skip
        else:
            d = [a[k][figure] - b[k][figure] for k in both]
        cells.append(f"{name} {mean_interval(d)}")
    replayed = sims[0].paired(sims[1])
    return (
        f"{sims[0].name} minus {sims[1].name}, {len(both)} real pairs: "
        + "; ".join(cells)
        + f". The replays predict {replayed.describe()} on held-out regret."
    )


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", type=Path, required=True)
    parser.add_argument("--space", type=Path, default=REPO / "search_spaces" / "dept.yaml")
    parser.add_argument(
        "--pair", type=Path, help="a second search file, run at the same seeds: paired real runs"
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--chunk", type=int, help="stop after this many new real runs (run again to go on)"
    )
    parser.add_argument("--replays", type=int, default=30)
    parser.add_argument("--train-seed", type=int, default=100,
                        help="real run k trains at TRAIN_SEED + k (unrecorded)")  # fmt: skip
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a key of the real runs (e.g. task.data_dir)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=RESULTS / "simulation_check.jsonl")
    return parser.parse_args(argv)


def run_key(table: Path, space: Path, train_seed: int) -> str:
    """What a real run's result depends on: the table, the file's settings and the seeds'
    base."""
    return f"{digest(table)}/{settings_digest(space)}/{train_seed}"


def settings_digest(path: Path) -> str:
    """A short hash of a search file's settings, not of its bytes: editing its comments (a
    header that cites the file's measured time) leaves its real runs standing; changing a
    value redoes them."""
    data = yaml.safe_load(Path(path).read_text())
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def done_runs(out: Path, key: str) -> list[dict]:
    """The real runs ``out`` holds for ``key`` (a resumed check skips them)."""
    return [r for r in ResultsFile(out).rows() if r["key"] == key]


def report(sim, runs: list[dict], args, grid_steps: int, grid_wall: float) -> None:
    """Each real run beside the replays' band, figure by figure.

    A real run's regret is scored on the table's seed-means of the configuration it chose,
    seeds it never trained at, so it is placed twice: among the replays' in-sample regrets
    (scored on a seed-mean that includes the draw the replay chose by, which flatters it)
    and among their held-out-seed regrets (on the seed the replay never saw: the same
    expectation, one seed's noise), the like-for-like comparison; normalised, it is placed
    among the latter only."""
    columns = {  # header -> (the replays' figure, the real run's figure)
        "regret (points)": ("regret", "regret"),
        "regret, held-out seed": ("heldout", "regret"),
        "normalised, held-out seed": ("heldout_normalised", "normalised"),
        "trial-steps / grid": ("steps", "steps"),
        "wall / grid": ("wall", "wall"),
        "wall / grid at the table's pace": ("wall", "wall_at_pace"),
    }
    replayed = {
        figure: [v for s in sim.scores if np.isfinite(v := getattr(s, figure))]
        for figure in ("regret", "heldout", "steps", "wall")
    }
    gap = sim.quality.median_gap  # normalised regret is regret over it
    replayed["heldout_normalised"] = [v / gap for v in replayed["heldout"]] if gap > 0 else []
    rows = []
    for label, quantiles in (("replays: median", [50]), ("replays: 5th-95th", list(BAND))):
        rows.append([label] + [
            "-".join(f"{np.percentile(replayed[f], q):.2f}" for q in quantiles)
            if replayed[f] else "n/a"
            for f, _ in columns.values()
        ])  # fmt: skip
    for run in sorted(runs, key=lambda r: r["k"]):
        label = f"real run {run['k']} (seeds {run['sampler_seed']}/{run['train_seed']})"
        figures = {**run, "wall_at_pace": run["wall"] / run["pace"] if run.get("pace") else None}
        cells = [band_cell(figures[real], replayed[f]) for f, real in columns.values()]
        rows.append([label, *cells])
    print(
        f"\n{args.space.name} on {args.table.name}: {len(sim.scores)} replays, {len(runs)} real "
        f"runs; grid {grid_steps} trial-steps, simulated wall {grid_wall / 60:.1f} min"
    )
    print_table(["", *columns], rows)
    for run in sorted(runs, key=lambda r: r["k"]):
        print(f"real run {run['k']}: chose {run['chosen']}; {run['trials']} trials, "
              f"{run['stopped']} stopped; search {run['search_wall_s'] / 60:.1f} min "
              f"(trials {run['trials_wall_s'] / 60:.1f} min); val {run['best_val']:.4f}, "
              f"test {run['test']:.4f}; pace {pace_text(run.get('pace'))}")  # fmt: skip


def pace_text(value: float | None) -> str:
    return "not measured" if value is None else f"{value:.2f}x the table's clock"


def band_cell(value: float, replayed: list[float]) -> str:
    """``value`` with its percentile among ``replayed`` and whether it is inside the band."""
    if value is None:  # e.g. the pace of a run recorded before it was measured
        return "n/a"
    if not replayed:  # e.g. held-out regret when the table had no seed to spare
        return f"{value:.2f} (no replays)"
    lo, hi = np.percentile(replayed, BAND)
    inside = "in" if lo <= value <= hi else "OUT"
    return f"{value:.2f} (p{percentile_of(value, replayed):.0f}, {inside})"


if __name__ == "__main__":
    main()
