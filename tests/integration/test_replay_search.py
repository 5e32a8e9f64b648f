"""A 50-trial replayed search end to end (``resources.trial_runner: replay``): the real
``raypeft tune`` with Ray Tune, the Optuna study and MLflow, trials reporting a table's curves
at once (``replay.time_scale: 0``); every trial's MLflow metric history is the recorded curve
of its configuration at its seed."""

from __future__ import annotations

import optuna
import yaml
from mlflow.tracking import MlflowClient

from raypeft.config.space import configuration_key
from tests.helpers import TINY_SEARCH_BASE, children, run_cli, run_driver
from tests.replay_tables import grid_table

GRID = {
    "method.lr_prompt": [0.1, 0.2, 0.3, 0.4, 0.5],
    "method.lr_lowrank": [1.0e-4, 5.0e-4, 1.0e-3, 5.0e-3, 1.0e-2],
}
SEEDS = [0, 1]
STEPS = [4, 8, 12]  # TINY_SEARCH_BASE: max_steps 12, eval_every 4


def _experiment(tmp_path, table_path) -> dict:
    return {
        "name": "replay-50",
        **TINY_SEARCH_BASE,
        "space": {key: {"grid": values} for key, values in GRID.items()},
        "search": {
            "num_samples": 50,
            "sampler": "grid",
            "seeds": SEEDS,
            "scheduler": {"type": "none"},  # every curve whole
        },
        "resources": {"trial_runner": "replay"},
        "replay": {"table": str(table_path), "time_scale": 0},
        "run": {"storage_path": str(tmp_path / "ray_results")},
    }


def test_a_replayed_search_reports_the_table_it_replays(tmp_path, shared_ray):
    cfg = _experiment(tmp_path, tmp_path / "table.json")
    table = grid_table(tmp_path / "table.json", cfg, GRID, SEEDS, STEPS)
    path = tmp_path / "replay.yaml"
    path.write_text(yaml.safe_dump(cfg))

    proc = run_cli(["tune", "--space", str(path), "--quiet"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Search finished: 50 trials (0 stopped early, 0 failed)" in proc.stdout

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("replay-50")
    (parent,) = client.search_runs([experiment.experiment_id], "tags.`raypeft.role` = 'experiment'")
    runs = children(client, experiment.experiment_id, parent.info.run_id)
    assert len(runs) == 50
    replayed = set()
    for run in runs:
        params = run.data.params
        configuration = configuration_key({key: float(params[key]) for key in GRID})
        seed = int(params["train.seed"])
        curve = table.curve(configuration, seed)
        for name, values in curve.values.items():
            history = sorted(client.get_metric_history(run.info.run_id, name), key=lambda m: m.step)
            assert [m.step for m in history] == STEPS, (run.info.run_id, name)
            assert [m.value for m in history] == values, (configuration, seed, name)
        assert run.info.status == "FINISHED"
        replayed.add((configuration, seed))
    assert len(replayed) == 50  # the whole grid at both seeds, each once

    # the Optuna study holds the 50 trials, each told the best value its curve reached
    study = optuna.load_study(study_name="replay-50", storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    done = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert sorted(t.value for t in done) == sorted(
        max(c.values["val_accuracy"]) for c in table.curves
    )
    # checkpoints are real: the chosen trial's model was logged and registered
    assert "Registered model 'replay-50' version 1" in proc.stdout
    # each trial wrote one per evaluation; a finished trial keeps its latest only
    folders = [p for p in (tmp_path / "ray_results").glob("replay-50-*/dept_*") if p.is_dir()]
    assert len(folders) == 50
    assert all([c.name for c in f.glob("checkpoint_*")] == ["checkpoint_000002"] for f in folders)


# A search in a driver that counts the experiment snapshots Tune takes: Tune reads every
# callback's state at each one (Callback.get_state), raypeft's MLflow callback's included.
COUNTING_DRIVER = """
import sys

import ray

from raypeft.config.loading import load_experiment
from raypeft.search.run import run_experiment
from raypeft.tracking.callback import MLflowTrialCallback

snapshots = []
get_state = MLflowTrialCallback.get_state


def counted(self):
    snapshots.append(1)
    return get_state(self)


MLflowTrialCallback.get_state = counted
ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
run_experiment(load_experiment(sys.argv[1]), source=sys.argv[1], printer=lambda *_: None)
print("snapshots", len(snapshots))
"""


def test_trial_checkpoints_do_not_each_snapshot_the_experiment(tmp_path):
    """Issue 41's growth: with Tune's num_to_keep, every trial checkpoint forced a snapshot of
    the whole experiment (every trial's state), so a search's snapshots cost trials x
    checkpoints x trials. 20 replayed trials write 60 checkpoints; the snapshots are Tune's
    periodic ones, not one per checkpoint."""
    cfg = _experiment(tmp_path, tmp_path / "table.json")
    grid = {"method.lr_prompt": GRID["method.lr_prompt"], "method.lr_lowrank": [1e-3, 5e-3]}
    cfg["space"] = {key: {"grid": values} for key, values in grid.items()}
    cfg["search"]["num_samples"] = 20
    grid_table(tmp_path / "table.json", cfg, grid, SEEDS, STEPS)
    path = tmp_path / "replay.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = run_driver(COUNTING_DRIVER, path, tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("snapshots ")]
    snapshots = int(line.split()[1])
    # measured: 62 with num_to_keep (one per checkpoint, and two), 3 without (Tune's periodic
    # ones, every 10 s or more, and the end's): fewer than one per trial either way it runs
    assert 0 < snapshots < 20, snapshots
