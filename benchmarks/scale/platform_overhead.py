"""The platform's own cost per trial, from 10 to 1,000 trials (issue 41).

Three layers, each the same number of zero-time trials of three evaluations, at most C at a
time, Ray told of C CPUs:

- ``tune``: bare Ray Tune, a function that only reports (no raypeft, MLflow or Optuna);
- ``tune_optuna``: the same with Tune's ``OptunaSearch`` on an RDB study in the store;
- ``raypeft``: ``raypeft``'s whole search with replayed trials (``resources.trial_runner:
  replay``, ``replay.time_scale: 0``): the Optuna study, the MLflow runs, checkpoints, the
  live table's callback, the registry and the summary; only training replaced.

Each cell runs in a fresh interpreter (its own Ray, its driver's peak memory alone) and
appends one JSON line to ``--out`` as it ends; a cell already there is skipped (resumable).
Stores: ``sqlite`` (embedded files) or ``postgres`` (a real server this benchmark starts,
:mod:`benchmarks.common.servers`; one fresh database per cell for MLflow and one for Optuna;
where PostgreSQL cannot run, one line says why before any cell runs, exit code 2).

    python -m benchmarks.scale.platform_overhead --sizes 10,100,1000 --concurrency 2,8,32 \\
        --stores sqlite,postgres --out benchmarks/results/platform_overhead.jsonl

Time it alone on the machine: a run beside other work is not a timing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.common.paths import REPO, RESULTS
from benchmarks.common.results import ResultsFile
from benchmarks.common.servers import ServerUnavailable, postgres_runnable, postgres_server
from benchmarks.common.tiny_search import REPLAY_STEPS, REPLAYED, VALUES, replay_space, replay_table

LAYERS = ("tune", "tune_optuna", "raypeft")
NAME = "overhead"  # the raypeft layer's experiment


def cell_key(cell: dict[str, Any]) -> tuple:
    return (cell["store"], cell["concurrency"], cell["size"], cell["layer"])


# ----------------------------------------------------------------------------- one cell


def _driver_peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def _start_ray(concurrency: int) -> None:
    import ray  # why: each cell's own interpreter starts its own Ray

    ray.init(address="local", num_cpus=concurrency, include_dashboard=False, log_to_driver=False)


def bare_tune(cell: dict[str, Any], work: Path) -> dict[str, Any]:
    """Bare Ray Tune (with ``OptunaSearch`` on the cell's Optuna store for ``tune_optuna``)."""
    import optuna
    from ray import tune
    from ray.tune.search.optuna import OptunaSearch

    def trainable(config: dict) -> None:
        for step in REPLAY_STEPS:
            value = config["a"] * config["b"]
            tune.report({"val_accuracy": value, "step": step, "ended_at": time.time()})

    search = None
    space = {"a": tune.choice(VALUES), "b": tune.choice(VALUES)}
    if cell["layer"] == "tune_optuna":
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        storage = optuna.storages.RDBStorage(cell["optuna_url"])
        search = OptunaSearch(metric="val_accuracy", mode="max", storage=storage, seed=0,
                              study_name="bare")  # fmt: skip
    tuner = tune.Tuner(
        trainable,
        param_space=space,
        tune_config=tune.TuneConfig(
            metric="val_accuracy",
            mode="max",
            search_alg=search,
            num_samples=cell["size"],
            max_concurrent_trials=cell["concurrency"],
            reuse_actors=True,
        ),
        run_config=tune.RunConfig(storage_path=str(work / "ray"), verbose=0),
    )
    start = time.perf_counter()
    results = tuner.fit()
    fit_s = time.perf_counter() - start
    ends = [r.metrics["ended_at"] for r in results if r.metrics]
    return {"fit_s": fit_s, "trials": len(results), "pace_ms": pace(ends)}


def pace(ends: list[float]) -> list[float]:
    """Within one search, the ms per trial over its second tenth of trial ends and over its
    last tenth: a platform whose cost grows with the trials already run ends its last trials
    more slowly. Start and end costs fall outside both."""
    ends, n = sorted(ends), len(ends)
    if n < 20:  # too few ends for two spans of a tenth
        return []
    spans = [(n // 10, 2 * n // 10), (9 * n // 10, n - 1)]
    return [1000 * (ends[b] - ends[a]) / (b - a) for a, b in spans]


def raypeft_search(cell: dict[str, Any], work: Path) -> dict[str, Any]:
    """raypeft's whole search over replayed zero-time trials."""
    from raypeft.config.schema import ExperimentConfig
    from raypeft.search.run import run_experiment

    data = {
        "name": NAME,
        **REPLAYED,
        "space": replay_space(),
        "search": {
            "num_samples": cell["size"],
            "sampler": "random",
            "answer_repeats": False,
            "max_concurrent": cell["concurrency"],
            "scheduler": {"type": "none"},
            "storage": cell["optuna_url"],
        },  # fmt: skip
        "resources": {"trial_runner": "replay"},
        "replay": {"table": str(work / "table.json"), "time_scale": 0},
        "tracking": {"uri": cell["mlflow_url"]},
        "run": {"storage_path": str(work / "ray")},
    }
    replay_table(work / "table.json", data)
    # not quiet: the live table runs as in a real search; its lines go nowhere
    cfg = ExperimentConfig.model_validate(data)
    summary = run_experiment(cfg, printer=lambda *_: None, progress_interval=5.0)
    return {
        "fit_s": summary.phase_s["fit"],
        "phase_s": summary.phase_s,
        "wall_s": summary.wall_s,
        "trials": summary.num_trials,
        "pace_ms": pace(trial_ends(cell["mlflow_url"])),
    }


def trial_ends(mlflow_url: str) -> list[float]:
    """When each trial's MLflow run ended (seconds), read back through MLflow's client."""
    from mlflow.tracking import MlflowClient

    from raypeft.tracking.runs import parent_runs, trial_runs

    client = MlflowClient(tracking_uri=mlflow_url)
    experiment_id = client.get_experiment_by_name(NAME).experiment_id
    (parent,) = parent_runs(client, experiment_id)
    runs = trial_runs(client, experiment_id, parent.info.run_id)
    return [r.info.end_time / 1000 for r in runs if r.info.end_time]


def store_rows(url: str) -> dict[str, int]:
    """Rows per table of a store (MLflow's or Optuna's), empty tables left out."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(url)
    try:
        with engine.connect() as conn:
            names = sqlalchemy.inspect(conn).get_table_names()
            counts = {
                name: conn.execute(sqlalchemy.text(f'SELECT COUNT(*) FROM "{name}"')).scalar()
                for name in names
            }
    finally:
        engine.dispose()
    return {name: n for name, n in counts.items() if n}


def run_cell(cell: dict[str, Any]) -> dict[str, Any]:
    """One measurement, in this (fresh) interpreter."""
    work = Path(cell["work"])
    _start_ray(cell["concurrency"])
    if cell["layer"] == "raypeft":
        measured = raypeft_search(cell, work)
    else:
        measured = bare_tune(cell, work)
    measured["per_trial_ms"] = 1000 * measured["fit_s"] / cell["size"]
    measured["driver_peak_mb"] = _driver_peak_mb()
    if cell["layer"] == "raypeft":
        measured["mlflow_rows"] = store_rows(cell["mlflow_url"])
    if cell["layer"] != "tune":
        measured["optuna_rows"] = store_rows(cell["optuna_url"])
    keep = ("store", "concurrency", "size", "layer")
    return {**{k: cell[k] for k in keep}, **measured}


# ----------------------------------------------------------------------------- the grid


@contextlib.contextmanager
def stores(kind: str, work: Path) -> Iterator[Any]:
    """A function ``name -> (mlflow_url, optuna_url)`` of fresh, empty stores per cell."""
    if kind == "sqlite":
        yield lambda name: (
            f"sqlite:///{work / name / 'mlflow.db'}",
            f"sqlite:///{work / name / 'optuna.db'}",
        )
        return
    with postgres_server(work) as server:
        yield lambda name: (
            server.create_database(f"mlflow_{name}"),
            server.create_database(f"optuna_{name}"),
        )


def measure(cell: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Run one cell in a fresh interpreter; its JSON line, or what went wrong. The cell goes
    on its standard input, not its command line: its store URLs hold the database's password."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0",
           "MLFLOW_DISABLE_TELEMETRY": "true", "HF_HUB_OFFLINE": "1",
           "RAY_AUTH_MODE": "disabled"}  # fmt: skip
    cmd = [sys.executable, "-m", "benchmarks.scale.platform_overhead", "--cell"]
    try:
        proc = subprocess.run(cmd, cwd=cell["work"], env=env, input=json.dumps(cell),
                              capture_output=True, text=True, timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired:
        return {**{k: cell[k] for k in ("store", "concurrency", "size", "layer")},
                "error": f"timed out after {timeout:.0f} s"}  # fmt: skip
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return {**{k: cell[k] for k in ("store", "concurrency", "size", "layer")},
                "error": f"exit {proc.returncode}: {tail[0][:300]}"}  # fmt: skip
    return json.loads(lines[-1])


def run_grid(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every cell of the grid not in ``args.out`` yet, appended to it as each ends."""
    results, rows = ResultsFile(args.out, key=cell_key), []
    for kind in args.stores:
        with tempfile.TemporaryDirectory(prefix="overhead-") as tmp:
            work = Path(tmp)
            with stores(kind, work) as urls:
                for cell in _cells(args, kind, results):
                    name = f"{cell['layer']}_{cell['concurrency']}_{cell['size']}"
                    (work / name).mkdir()
                    mlflow_url, optuna_url = urls(name)
                    cell.update(work=str(work / name), mlflow_url=mlflow_url,
                                optuna_url=optuna_url)  # fmt: skip
                    rows.append(results.append(measure(cell, args.timeout)))
                    print(summary_line(rows[-1]), flush=True)
    return rows


def _cells(args: argparse.Namespace, store: str, results: ResultsFile) -> Iterator[dict[str, Any]]:
    """The grid's cells of ``store`` not measured yet, smallest concurrency and size first."""
    for conc in args.concurrency:
        for size in args.sizes:
            for layer in args.layers:
                cell = {"store": store, "concurrency": conc, "size": size, "layer": layer}
                if not results.done(cell_key(cell)):
                    yield cell


def summary_line(row: dict[str, Any]) -> str:
    where = f"{row['store']:8s} C={row['concurrency']:<3d} n={row['size']:<5d} {row['layer']:12s}"
    if "error" in row:
        return f"{where} error: {row['error']}"
    return f"{where} {row['per_trial_ms']:8.1f} ms/trial  driver {row['driver_peak_mb']:.0f} MB"


def marginal(points: list[tuple[int, float]]) -> list[tuple[int, int, float]]:
    """``(size, fit_s)`` points, sorted by size: the ms each added trial cost between
    consecutive sizes, ``(from, to, ms)``. What a search's start and end cost once (Ray's actors,
    the stores' tables, the summary) cancels out, so a flat platform gives equal numbers."""
    return [
        (a, b, 1000 * (fb - fa) / (b - a))
        for (a, fa), (b, fb) in zip(points, points[1:], strict=False)
    ]


def marginals(rows: list[dict[str, Any]]) -> dict[tuple, list[tuple[int, int, float]]]:
    """:func:`marginal` of each (store, concurrency, layer) of the measured rows."""
    groups: dict[tuple, list[tuple[int, float]]] = {}
    for r in rows:
        if "error" not in r:
            key = (r["store"], r["concurrency"], r["layer"])
            groups.setdefault(key, []).append((r["size"], r["fit_s"]))
    return {key: marginal(sorted(points)) for key, points in groups.items()}


def growth(rows: list[dict[str, Any]]) -> list[str]:
    """Per store, concurrency and layer: the ms per added trial between consecutive sizes
    (:func:`marginal`), and how much the last interval's exceeds the first's (issue 41's goal:
    within 20% from 100 to 1,000 trials)."""
    lines = []
    for (store, conc, layer), steps in sorted(marginals(rows).items()):
        if not steps:
            continue
        each = ", ".join(f"{a}->{b}: {ms:.1f}" for a, b, ms in steps)
        change = steps[-1][2] / steps[0][2] - 1 if steps[0][2] > 0 else float("nan")
        lines.append(
            f"{store} C={conc} {layer}: ms per added trial {each}; last against first {change:+.0%}"
        )
    return lines


def paces(rows: list[dict[str, Any]]) -> list[str]:
    """Per cell of at least 100 trials: :func:`pace`'s two figures and their change (issue
    41's goal, "no growth with the number of trials already run", read inside one search)."""
    lines = []
    for r in sorted(rows, key=cell_key):
        if r.get("pace_ms") and r["size"] >= 100:
            first, last = r["pace_ms"]
            where = f"{r['store']} C={r['concurrency']} n={r['size']} {r['layer']}"
            lines.append(
                f"{where}: ms per trial, 2nd tenth {first:.1f}, last tenth {last:.1f} "
                f"({last / first - 1:+.0%})"
            )
    return lines


def ratios(rows: list[dict[str, Any]]) -> list[str]:
    """Per store and concurrency: raypeft's ms per added trial over the largest interval
    against bare Tune's and Tune + OptunaSearch's (issue 41's goal: <= 2x the latter)."""
    last = {key: steps[-1][2] for key, steps in marginals(rows).items() if steps}
    lines = []
    for store, conc in sorted({(k[0], k[1]) for k in last}):
        ours = last.get((store, conc, "raypeft"))
        if ours is None:
            continue
        parts = [
            f"{ours / last[(store, conc, layer)]:.2f}x {layer}"
            for layer in ("tune", "tune_optuna")
            if last.get((store, conc, layer), 0) > 0
        ]
        if parts:
            lines.append(f"{store} C={conc} raypeft per added trial: " + ", ".join(parts))
    return lines


def parse(argv: list[str] | None) -> argparse.Namespace:
    ints = lambda text: [int(v) for v in text.split(",")]  # noqa: E731
    names = lambda text: text.split(",")  # noqa: E731
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=ints, default=[10, 100, 1000])
    parser.add_argument("--concurrency", type=ints, default=[2, 8, 32])
    parser.add_argument("--stores", type=names, default=["sqlite", "postgres"])
    parser.add_argument("--layers", type=names, default=list(LAYERS))
    parser.add_argument("--out", default=str(RESULTS / "platform_overhead.jsonl"))
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per cell")
    # one cell (JSON on stdin), in a fresh interpreter
    parser.add_argument("--cell", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.cell:
        print(json.dumps(run_cell(json.loads(sys.stdin.read()))), flush=True)
        return
    try:
        if "postgres" in args.stores:
            postgres_runnable()  # before the first cell, not after an hour of sqlite ones
        run_grid(args)
    except ServerUnavailable as exc:
        print(f"error: --stores postgres: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    rows = ResultsFile(args.out).rows()
    print("\n".join(growth(rows) + paces(rows) + ratios(rows)))


if __name__ == "__main__":
    main()
