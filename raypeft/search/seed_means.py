"""The repeated configurations (``search.repeat_best``) as an Optuna study of their own, whose
``best_trial`` is the configuration the search chose.

The search's study holds one trial per training, its value what that training scored on one
seed; Optuna's ``study.best_trial`` is the best of those observations, and a value once told
cannot change. With repeats the search chooses otherwise: among its ``top_k`` configurations,
the best mean over seeds. The two rules name different trials whenever a configuration's
other seeds score lower than its first (what repeats are for: the best of many noisy scores
is biased upwards), and no value in the search's study can say so without misreporting a
training. So the decision gets its own study, ``<study>.seed_means`` in the same storage:
one trial per repeated configuration, its params those of the configuration's search trial,
its value the mean over seeds, its seeds' scores, trials and MLflow runs as attributes. Its
``best_trial`` is the chosen configuration (ties aside: the best mean wins in both); the
search's study names the chosen trial under ``raypeft.chosen_trial.<parent run>`` and this
study under :data:`SEED_MEANS_STUDY_ATTR`. Only public Optuna API: ``create_study``,
``add_trial`` with ``create_trial``, user attributes.
"""

from __future__ import annotations

import warnings

import optuna

from raypeft.search.objectives import ResolvedObjective
from raypeft.search.repeats import RepeatGroup
from raypeft.search.study import (
    CHOSEN_ATTR,
    CONFIGURATION_ATTR,
    PARENT_RUN_ATTR,
    TUNE_TRIAL_ATTR,
    directions,
)

SEED_MEANS_SUFFIX = ".seed_means"
# a study attribute of the search's study: the name of its seed-means study
SEED_MEANS_STUDY_ATTR = "raypeft.seed_means_study"
# user attributes of a seed-means trial
SOURCE_TRIAL_ATTR = "raypeft.source_trial"  # the search study's trial of the configuration
SCORES_ATTR = "raypeft.scores_by_seed"  # seed -> validation score
SEED_TRIALS_ATTR = "raypeft.trials_by_seed"  # seed -> Tune trial id (MLflow: raypeft.trial_id)
STD_ATTR = "raypeft.std"  # the scores' sample standard deviation


def seed_means_study_name(study_name: str) -> str:
    """The name of the seed-means study of the search study ``study_name``."""
    return study_name + SEED_MEANS_SUFFIX


def record_seed_means(
    storage: optuna.storages.BaseStorage,
    study_name: str,
    parent_run_id: str,
    groups: list[RepeatGroup],
    primary: ResolvedObjective,
    chosen_trial_id: str,
) -> str:
    """Add each repeated configuration of the search (``groups``) to the seed-means study as
    one trial valued at its mean; name the chosen one on it (:data:`CHOSEN_ATTR` + the
    parent run id) and the study on the search's. A configuration already there (a resumed
    search finishing again) is not added twice. Returns the seed-means study's name."""
    name = seed_means_study_name(study_name)
    study = optuna.create_study(
        storage=storage,
        study_name=name,
        direction=directions([primary.mode])[0],
        load_if_exists=True,
    )
    with warnings.catch_warnings():  # experimental since Optuna 3.2, and still so in 5.0
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names([f"{primary.name} (mean over seeds)"])
    sources = _search_trials(storage, study_name, parent_run_id)
    held = {
        t.user_attrs.get(TUNE_TRIAL_ATTR)
        for t in study.get_trials(deepcopy=False)
        if t.user_attrs.get(PARENT_RUN_ATTR) == parent_run_id
    }
    for group in groups:
        source = sources.get(group.trial_id)
        if source is None or group.trial_id in held:
            continue  # not in the study (a search recorded elsewhere), or recorded already
        study.add_trial(_seed_mean_trial(group, source, parent_run_id))
    for trial in study.get_trials(deepcopy=False):
        attrs = trial.user_attrs
        if attrs.get(PARENT_RUN_ATTR) == parent_run_id and (
            attrs.get(TUNE_TRIAL_ATTR) == chosen_trial_id
        ):
            study.set_user_attr(CHOSEN_ATTR + parent_run_id, trial.number)
    optuna.load_study(study_name=study_name, storage=storage).set_user_attr(
        SEED_MEANS_STUDY_ATTR, name
    )
    return name


def _search_trials(
    storage: optuna.storages.BaseStorage, study_name: str, parent_run_id: str
) -> dict[str, optuna.trial.FrozenTrial]:
    """The search's trials in its study, by Tune trial id."""
    study = optuna.load_study(study_name=study_name, storage=storage)
    return {
        t.user_attrs[TUNE_TRIAL_ATTR]: t
        for t in study.get_trials(deepcopy=False)
        if t.user_attrs.get(PARENT_RUN_ATTR) == parent_run_id and TUNE_TRIAL_ATTR in t.user_attrs
    }


def _seed_mean_trial(
    group: RepeatGroup, source: optuna.trial.FrozenTrial, parent_run_id: str
) -> optuna.trial.FrozenTrial:
    """A finished trial of ``source``'s configuration, valued at the mean over its seeds."""
    attrs = {
        PARENT_RUN_ATTR: parent_run_id,
        TUNE_TRIAL_ATTR: group.trial_id,  # the configuration's search trial (its model)
        SOURCE_TRIAL_ATTR: source.number,
        SCORES_ATTR: {str(seed): score for seed, score in sorted(group.scores.items())},
        SEED_TRIALS_ATTR: {str(seed): t for seed, t in sorted(group.trial_ids.items())},
        STD_ATTR: group.std,
    }
    if CONFIGURATION_ATTR in source.user_attrs:
        attrs[CONFIGURATION_ATTR] = source.user_attrs[CONFIGURATION_ATTR]
    return optuna.trial.create_trial(
        value=group.mean,
        params=source.params,
        distributions=source.distributions,
        user_attrs=attrs,
    )
