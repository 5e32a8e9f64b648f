"""The Optuna study of a finished search says what raypeft says: its objective is named, its
best trial is the configuration raypeft chose (and registered), and it names that trial; with
repeated seeds, the seed-means study's best trial is the configuration chosen by mean."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
from mlflow.tracking import MlflowClient

from raypeft.search.seed_means import SEED_MEANS_STUDY_ATTR, SOURCE_TRIAL_ATTR
from raypeft.search.study import CHOSEN_ATTR, TUNE_TRIAL_ATTR
from raypeft.tracking.tags import BEST_TRIAL_TAG, OPTUNA_SEED_MEANS_TAG
from tests.helpers import run_cli, tiny_experiment

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
