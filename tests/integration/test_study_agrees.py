"""The Optuna study of a finished search says what raypeft says: its objective is named, its
best trial is the configuration raypeft chose (and registered), and it names that trial."""

from __future__ import annotations

import optuna
import pytest

from raypeft.search.study import CHOSEN_ATTR, TUNE_TRIAL_ATTR
from raypeft.tracking.tags import BEST_TRIAL_TAG

pytestmark = pytest.mark.integration


def test_study_best_trial_is_the_chosen_one(finished_search):
    parent = finished_search.parent_run()
    chosen = parent.data.tags[BEST_TRIAL_TAG]
    storage = f"sqlite:///{finished_search.cwd / 'optuna.db'}"
    study = optuna.load_study(study_name=finished_search.experiment, storage=storage)
    assert study.metric_names == ["accuracy"]  # optuna-dashboard's axis, not "Objective 0"
    assert study.best_trial.user_attrs[TUNE_TRIAL_ATTR] == chosen
    assert study.user_attrs[CHOSEN_ATTR + parent.info.run_id] == study.best_trial.number
