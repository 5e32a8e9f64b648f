"""What ``raypeft simulate`` writes: a summary per search file, each replay's row, and an
MLflow run per search file (its search settings, the summary as metrics, the folder as
artefacts), in the experiment ``<table's experiment>-simulate``."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import statistics
from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient

from raypeft.config.dotted import flatten
from raypeft.search.simulate.runs import Simulation
from raypeft.search.simulate.table import CurveTable
from raypeft.tracking.parent_run import log_params
from raypeft.tracking.tags import ROLE_SIMULATION, ROLE_TAG

FIGURES = ("heldout", "regret", "normalised", "steps", "wall")  # each replay's scores
LABELS = {
    "heldout": "regret on the held-out seed (points)",
    "regret": "regret by seed-mean, in-sample (points)",
    "normalised": "regret (normalised)",
    "steps": "trial-steps / grid",
    "wall": "wall time / grid",
}


def summary(sim: Simulation) -> dict[str, Any]:
    """The simulation in numbers: per figure median, IQM, their 95% intervals, quartiles."""
    grid_steps, grid_wall_s = sim.grid_figures()
    return {
        "search": sim.name,
        "replays": len(sim.scores),
        "concurrency": sim.concurrency,
        "figures": {name: dataclasses.asdict(sim.spread(name)) for name in FIGURES},
        "goal": sim.goal(),
        "best_configuration": sim.quality.best,
        "best_seed_mean": sim.quality.means[sim.quality.best],
        "configurations": len(sim.quality.means),
        "trials_median": statistics.median([s.trials for s in sim.scores]),
        "stopped_median": statistics.median([s.stopped for s in sim.scores]),
        "grid_trial_steps": grid_steps,
        "grid_wall_s": grid_wall_s,
    }


def write_replays(sim: Simulation, out: Path) -> None:
    """``replays.csv`` (one row per replay) and ``summary.json`` into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "replays.csv", "w", newline="") as f:
        fields = ["replay", "chosen", "heldout_seed", *FIGURES, "trials", "stopped"]
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        for score in sim.scores:
            writer.writerow(dataclasses.asdict(score))
    # why null: NaN (no replay finished a trial, no unseen seed left) is not JSON; strict
    # readers (jq, JavaScript, most JSON libraries) refuse the file Python would write
    text = json.dumps(nan_as_null(summary(sim)), indent=1, allow_nan=False)
    (out / "summary.json").write_text(text + "\n")


def nan_as_null(value: Any) -> Any:
    """``value`` with every NaN float, however deeply nested, replaced by ``None``."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: nan_as_null(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [nan_as_null(v) for v in value]
    return value


def log_simulation(
    sim: Simulation, table: CurveTable, folder: Path, tracking_uri: str
) -> tuple[str, str]:
    """One MLflow run for ``sim``: the replayed search section as params, the summary as
    metrics, ``folder`` as artefacts. Returns (experiment name, run id)."""
    client = MlflowClient(tracking_uri)
    name = f"{table.source.get('experiment', 'table')}-simulate"
    found = client.get_experiment_by_name(name)
    experiment_id = found.experiment_id if found else client.create_experiment(name)
    run = client.create_run(experiment_id, run_name=sim.name, tags={ROLE_TAG: ROLE_SIMULATION})
    run_id = run.info.run_id
    params = flatten({"search": sim.cfg.search.model_dump(mode="json")})
    params.update({f"space.{k}": v.model_dump() for k, v in sim.cfg.space.items()})
    params.update({f"table.{k}": v for k, v in table.source.items()})
    log_params(client, run_id, params)
    for figure in FIGURES:
        spread = sim.spread(figure)
        for stat in ("median", "iqm", "q25", "q75"):
            value = getattr(spread, stat)
            if not math.isnan(value):
                client.log_metric(run_id, f"{figure}_{stat}", value)
    client.log_artifacts(run_id, str(folder))
    client.set_terminated(run_id)
    return name, run_id
