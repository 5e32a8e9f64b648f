"""The seed-means study of ``search.repeat_best`` on a real Optuna storage: its best trial is
the configuration chosen by mean, also where the search's own study (one seed per trial)
has another best trial, and a search that finishes twice (resumed) records it once."""

from __future__ import annotations

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.storages import RDBStorage

from raypeft.search.objectives import ResolvedObjective
from raypeft.search.repeats import RepeatGroup
from raypeft.search.seed_means import (
    SCORES_ATTR,
    SEED_MEANS_STUDY_ATTR,
    SEED_TRIALS_ATTR,
    SOURCE_TRIAL_ATTR,
    record_seed_means,
)
from raypeft.search.study import CHOSEN_ATTR, PARENT_RUN_ATTR, TUNE_TRIAL_ATTR

PARENT = "parent-run"
ACCURACY = ResolvedObjective("accuracy", "max", "best_val_accuracy")
LR = {"method.lr": CategoricalDistribution([0.1, 0.3, 0.5])}


def search_study(storage: str, scores: dict[str, tuple[float, float]]) -> optuna.Study:
    """The search's study: one trial per configuration, valued at its first seed's score."""
    study = optuna.create_study(storage=storage, study_name="s", direction="maximize")
    for tune_id, (lr, score) in scores.items():
        study.add_trial(
            optuna.trial.create_trial(
                params={"method.lr": lr},
                distributions=LR,
                value=score,
                user_attrs={TUNE_TRIAL_ATTR: tune_id, PARENT_RUN_ATTR: PARENT},
            )
        )
    return study


def test_the_seed_means_best_trial_is_the_configuration_chosen_by_mean(tmp_path):
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    # a scores 0.80 on its first seed and 0.60 on its second; b 0.75 on both: the search's
    # study (one seed per trial, values final once told) holds a as its best trial, the
    # repeats choose b
    study = search_study(storage, {"a": (0.1, 0.80), "b": (0.3, 0.75), "c": (0.5, 0.70)})
    groups = [
        RepeatGroup("a", {}, {0: 0.80, 1: 0.60}, {0: "a", 1: "a-r1"}),
        RepeatGroup("b", {}, {0: 0.75, 1: 0.75}, {0: "b", 1: "b-r1"}),
    ]
    name = record_seed_means(RDBStorage(storage), "s", PARENT, groups, ACCURACY, "b")
    assert name == "s.seed_means"
    assert study.best_trial.user_attrs[TUNE_TRIAL_ATTR] == "a"  # the best single observation

    means = optuna.load_study(study_name=name, storage=storage)
    best = means.best_trial
    assert best.user_attrs[TUNE_TRIAL_ATTR] == "b" and best.value == 0.75
    assert best.params == {"method.lr": 0.3}
    assert best.user_attrs[SCORES_ATTR] == {"0": 0.75, "1": 0.75}
    assert best.user_attrs[SEED_TRIALS_ATTR] == {"0": "b", "1": "b-r1"}
    assert best.user_attrs[SOURCE_TRIAL_ATTR] == 1  # b's trial in the search's study
    assert means.user_attrs[CHOSEN_ATTR + PARENT] == best.number
    assert means.metric_names == ["accuracy (mean over seeds)"]
    assert [t.value for t in means.trials] == [0.70, 0.75]  # a's mean, b's mean; c not repeated
    search = optuna.load_study(study_name="s", storage=storage)
    assert search.user_attrs[SEED_MEANS_STUDY_ATTR] == name

    # finishing again (a resumed search) adds nothing
    record_seed_means(RDBStorage(storage), "s", PARENT, groups, ACCURACY, "b")
    assert len(optuna.load_study(study_name=name, storage=storage).trials) == 2


def test_a_minimised_objective_keeps_its_direction(tmp_path):
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(storage=storage, study_name="s", direction="minimize")
    for tune_id, lr, loss in (("a", 0.1, 0.50), ("b", 0.3, 0.55)):
        study.add_trial(
            optuna.trial.create_trial(
                params={"method.lr": lr},
                distributions=LR,
                value=loss,
                user_attrs={TUNE_TRIAL_ATTR: tune_id, PARENT_RUN_ATTR: PARENT},
            )
        )
    groups = [
        RepeatGroup("a", {}, {0: 0.50, 1: 0.70}, {0: "a", 1: "a-r1"}),
        RepeatGroup("b", {}, {0: 0.55, 1: 0.55}, {0: "b", 1: "b-r1"}),
    ]
    loss = ResolvedObjective("loss", "min", "best_val_loss")
    name = record_seed_means(RDBStorage(storage), "s", PARENT, groups, loss, "b")
    best = optuna.load_study(study_name=name, storage=storage).best_trial
    assert best.user_attrs[TUNE_TRIAL_ATTR] == "b" and best.value == 0.55
