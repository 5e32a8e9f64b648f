"""The Optuna study of a finished search says what raypeft says: its objective is named, its
best trial is the configuration raypeft chose (and registered), and it names that trial; with
repeated seeds, the seed-means study's best trial is the configuration chosen by mean. Where
the study could not record a trial's end, the search's summary names that trial."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import optuna
import pytest
import yaml
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState

from raypeft.search.seed_means import SEED_MEANS_STUDY_ATTR, SOURCE_TRIAL_ATTR
from raypeft.search.study import CHOSEN_ATTR, TUNE_TRIAL_ATTR
from raypeft.tracking.tags import BEST_TRIAL_TAG, OPTUNA_SEED_MEANS_TAG
from tests.helpers import TINY_SEARCH_BASE, run_cli, tiny_experiment
from tests.replay_tables import grid_table

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("shared_ray")]


def test_study_best_trial_is_the_chosen_one(finished_search):
    parent = finished_search.parent_run()
    chosen = parent.data.tags[BEST_TRIAL_TAG]
    storage = f"sqlite:///{finished_search.cwd / 'optuna.db'}"
    study = optuna.load_study(study_name=finished_search.experiment, storage=storage)
    assert study.metric_names == ["accuracy"]  # optuna-dashboard's axis, not "Objective 0"
    assert study.best_trial.user_attrs[TUNE_TRIAL_ATTR] == chosen
    assert study.user_attrs[CHOSEN_ATTR + parent.info.run_id] == study.best_trial.number


def test_with_repeats_the_seed_means_study_names_the_champion(tmp_path):
    """search.repeat_best chooses by the mean over seeds: the search's study keeps each
    training's own value (its best trial is the best single observation), and the seed-means
    study holds one trial per repeated configuration, valued at its mean, whose best trial
    is the chosen, registered configuration."""
    search = {
        "num_samples": 3,
        "scheduler": {"type": "none"},
        "repeat_best": {"top_k": 2, "seeds": 1},
    }
    path = tiny_experiment(tmp_path, search=search)
    proc = run_cli(["tune", "--space", str(path), "--quiet"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("tiny-dept")
    (parent,) = client.search_runs([exp.experiment_id], "tags.`raypeft.role` = 'experiment'")
    run_id, chosen = parent.info.run_id, parent.data.tags[BEST_TRIAL_TAG]
    repeats = json.loads(
        Path(client.download_artifacts(run_id, "repeats.json", str(tmp_path))).read_text()
    )
    means_by_trial = {group["trial_id"]: group["mean"] for group in repeats}
    assert len(means_by_trial) == 2 and chosen in means_by_trial

    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.load_study(study_name="tiny-dept", storage=storage)
    name = parent.data.tags[OPTUNA_SEED_MEANS_TAG]
    assert study.user_attrs[SEED_MEANS_STUDY_ATTR] == name == "tiny-dept.seed_means"
    means = optuna.load_study(study_name=name, storage=storage)
    assert means.best_trial.user_attrs[TUNE_TRIAL_ATTR] == chosen
    assert means.best_trial.value == pytest.approx(max(means_by_trial.values()))
    assert means.user_attrs[CHOSEN_ATTR + run_id] == means.best_trial.number
    assert {t.user_attrs[TUNE_TRIAL_ATTR]: t.value for t in means.trials} == pytest.approx(
        means_by_trial
    )
    searched = {t.number: t for t in study.trials}
    for trial in means.trials:  # each the configuration of its search trial
        assert trial.params == searched[trial.user_attrs[SOURCE_TRIAL_ATTR]].params
    chosen_number = study.user_attrs[CHOSEN_ATTR + run_id]
    assert searched[chosen_number].user_attrs[TUNE_TRIAL_ATTR] == chosen
    # the registered champion is that configuration's model
    champion = client.get_model_version_by_alias("tiny-dept", "champion")
    assert champion.run_id == parent.data.tags["raypeft.best_run_id"]
    assert f"seed means: study {name!r} (its best trial is the chosen" in proc.stdout


def test_a_trial_whose_end_the_study_refuses_is_named_by_the_summary(tmp_path):
    """The study's database refuses every trial's end (a trigger; attributes and values are
    still written), in a replayed search of two trials: the search finishes with both
    results, and its summary names both trials in one line, with the database's reason,
    while the study holds them RUNNING."""
    grid = {"method.lr_prompt": [0.1, 0.3]}
    cfg = {
        "name": "refused-ends",
        **TINY_SEARCH_BASE,
        "space": {key: {"grid": values} for key, values in grid.items()},
        "search": {"num_samples": 2, "sampler": "grid", "scheduler": {"type": "none"}},
        "resources": {"trial_runner": "replay"},
        "replay": {"table": str(tmp_path / "table.json"), "time_scale": 0},
        "run": {"storage_path": str(tmp_path / "ray_results")},
    }
    grid_table(tmp_path / "table.json", cfg, grid, [0], [4, 8, 12])
    path = tmp_path / "refused.yaml"
    path.write_text(yaml.safe_dump(cfg))
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    optuna.storages.RDBStorage(url)  # Optuna's tables, to put the trigger on
    with sqlite3.connect(tmp_path / "optuna.db") as db:
        db.execute(
            "CREATE TRIGGER refuse_ends BEFORE UPDATE OF state ON trials "
            "WHEN NEW.state != 'RUNNING' BEGIN SELECT * FROM \"no ends recorded here\"; END"
        )

    proc = run_cli(["tune", "--space", str(path), "--quiet"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Search finished: 2 trials (0 stopped early, 0 failed)" in proc.stdout
    (line,) = [x for x in proc.stdout.splitlines() if "could not record how" in x]
    study = optuna.load_study(study_name="refused-ends", storage=url)
    assert [t.state for t in study.trials] == [TrialState.RUNNING] * 2
    for trial in study.trials:
        assert f"{trial.user_attrs[TUNE_TRIAL_ATTR]} (Optuna trial {trial.number}: " in line
    assert line.count("no such table: main.no ends recorded here") == 2
