"""A real seeded grid (``search.seeds``) read back as a learning-curve table, and replayed:
the replay of the recorded search reports exactly what the real trials reported."""

from __future__ import annotations

import json
import random

import optuna
import pytest
import yaml
from mlflow.tracking import MlflowClient

from raypeft.config.loading import load_experiment
from raypeft.config.space import configuration_key
from raypeft.modeling.precision import resolve_precision
from raypeft.search.simulate import CurveTable, replay_config
from raypeft.search.simulate.replay import draw_seeds, replay_search
from raypeft.search.study import CONFIGURATION_ATTR
from raypeft.tracking.tags import BEST_TRIAL_TAG, CONFIGURATION_TAG, ROLE_TAG
from raypeft.training.result_keys import PRECISION_PARAM
from tests.helpers import TINY_SEARCH_BASE, run_cli

EXPERIMENT = "tiny-rec"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, _process_ray):
    """A grid of 2 configurations with seeds [0, 1] (4 trials) on tiny BERT, run by
    ``raypeft tune`` on this pytest process's Ray."""
    cwd = tmp_path_factory.mktemp("recorded")
    cfg = {
        "name": EXPERIMENT,
        **TINY_SEARCH_BASE,
        "space": {"method.lr_prompt": {"grid": [0.3, 0.5]}},
        "search": {"num_samples": 4, "sampler": "grid", "seeds": [0, 1],
                   "scheduler": {"type": "none"}},
        "run": {"storage_path": str(cwd / "ray_results")},
    }  # fmt: skip
    (cwd / "rec.yaml").write_text(yaml.safe_dump(cfg))
    done = run_cli(["tune", "--space", "rec.yaml", "--quiet", "--address", _process_ray], cwd)
    assert done.returncode == 0, done.stderr[-3000:]
    table = run_cli(["table", EXPERIMENT, "--out", "table.json"], cwd)
    assert table.returncode == 0, table.stderr[-3000:]
    assert "4 curves, 2 configurations" in table.stdout
    return cwd


def curve_key(table: CurveTable, config: dict) -> tuple[str, str]:
    """A trial config's configuration (as tagged) and seed (as MLflow logs it)."""
    params = {k: v for k, v in config.items() if k in table.space()}
    return configuration_key(params), str(config["train.seed"])


def trial_runs(cwd):
    client = MlflowClient(f"sqlite:///{cwd / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(EXPERIMENT)
    runs = client.search_runs([experiment.experiment_id], f"tags.`{ROLE_TAG}` = 'trial'")
    return client, runs


def test_seeds_are_grouped_by_configuration_in_mlflow_and_optuna(recorded):
    _, runs = trial_runs(recorded)
    groups: dict[str, set[str]] = {}
    for run in runs:
        groups.setdefault(run.data.tags[CONFIGURATION_TAG], set()).add(
            run.data.params["train.seed"]
        )
    assert len(groups) == 2 and all(seeds == {"0", "1"} for seeds in groups.values())
    study = optuna.load_study(study_name=EXPERIMENT, storage=f"sqlite:///{recorded / 'optuna.db'}")
    attrs = {t.user_attrs[CONFIGURATION_ATTR] for t in study.trials}
    assert attrs == set(groups)


def test_the_table_holds_every_trials_curve_as_mlflow_recorded_it(recorded):
    table = CurveTable.load(recorded / "table.json")
    client, runs = trial_runs(recorded)
    assert len(table.curves) == len(runs) == 4
    for run in runs:
        curve = table.curve(run.data.tags[CONFIGURATION_TAG], int(run.data.params["train.seed"]))
        history = client.get_metric_history(run.info.run_id, "val_accuracy")
        assert curve.steps == [4, 8, 12]
        assert curve.values["val_accuracy"] == [
            m.value for m in sorted(history, key=lambda m: m.step)
        ]
    source = json.loads((recorded / "table.json").read_text())["source"]
    assert source["command"].startswith("raypeft table")
    # what `auto` resolved to on the recording machine (the trials' own param)
    assert source["precision"] == resolve_precision("auto", "cpu")
    assert {run.data.params[PRECISION_PARAM] for run in runs} == {source["precision"]}
    # the wall time of each evaluation, as the trial logged it
    for run in runs:
        curve = table.curve(run.data.tags[CONFIGURATION_TAG], int(run.data.params["train.seed"]))
        history = client.get_metric_history(run.info.run_id, "wall_time_s")
        assert curve.wall_s == [m.value for m in sorted(history, key=lambda m: m.step)]


def test_replaying_the_recorded_search_reproduces_its_results(recorded):
    table = CurveTable.load(recorded / "table.json")
    cfg = replay_config(load_experiment(recorded / "rec.yaml"), table, table.concurrency())
    replay = replay_search(cfg, table, draw_seeds(table, random.Random(0)), table.concurrency())
    client, runs = trial_runs(recorded)
    real = {(run.data.tags[CONFIGURATION_TAG], run.data.params["train.seed"]): run for run in runs}
    assert len(replay.trials) == 4
    for trial in replay.trials:
        key = curve_key(table, trial.config)
        run = real[key]
        assert trial.metrics["best_val_accuracy"] == run.data.metrics["best_val_accuracy"]
        assert trial.metrics["step"] == 12
    parent = client.get_run(runs[0].data.tags["mlflow.parentRunId"])
    chosen = next(
        r for r in runs if r.data.tags["raypeft.trial_id"] == parent.data.tags[BEST_TRIAL_TAG]
    )
    assert curve_key(table, replay.chosen.config) == (
        chosen.data.tags[CONFIGURATION_TAG],
        chosen.data.params["train.seed"],
    )


def test_simulate_runs_on_the_recorded_table(recorded):
    result = run_cli(
        ["simulate", "rec.yaml", "--table", "table.json", "--replays", "3", "--no-log"],
        recorded,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "tiny-rec" in result.stdout and "goal" in result.stdout
