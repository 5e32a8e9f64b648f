"""The persisted Optuna study a search records its trials in: its sampler, its storage (by
default ``optuna.db`` beside the MLflow store), what an earlier or a concurrent search left in
it, and which process runs which search (liveness), so that searches of one study started
together leave each other's trials alone.

Only Optuna's public API: a trial is addressed by its number, and the storage's own id for it
comes from ``BaseStorage.get_trial_id_from_study_id_trial_number``.
"""

from __future__ import annotations

import functools
import inspect
import os
import socket
import warnings
from dataclasses import dataclass
from typing import Any

import optuna
import psutil
from optuna.trial import TrialState

from raypeft.config.redact import redact_uri
from raypeft.config.schema import ExperimentConfig
from raypeft.config.space import is_conditional
from raypeft.errors import ConfigError
from raypeft.search.objectives import ResolvedObjective
from raypeft.tracking.stores import database_url, search_storage_url, sqlite_file, store_lock

METRICS_ATTR = "raypeft.metrics"  # user attribute: the trial's last reported metrics
TUNE_TRIAL_ATTR = "raypeft.tune_trial_id"
PARENT_RUN_ATTR = "raypeft.parent_run_id"  # the MLflow search the trial belongs to
ERROR_ATTR = "raypeft.error"  # why the trial failed
# A trial paused by Ctrl-C/SIGTERM is closed FAIL (nothing is left RUNNING) with this attribute
# (the signal's name); `--resume` continues it in a new trial, which names it (an Optuna trial
# cannot change once finished) with RESUMED_FROM_ATTR: the paused trial's number.
INTERRUPTED_ATTR = "raypeft.interrupted"
RESUMED_FROM_ATTR = "raypeft.resumed_from_trial"
# A trial asked for after Tune's last snapshot of the search (the driver died before Tune saved
# it again) is RUNNING in the study, but the Tune experiment `--resume` restores does not know
# it: no Tune trial would ever end it, nor train its configuration. `--resume` closes it FAIL
# with this reason (ERROR_ATTR) and enqueues its configuration again; the trial that trains it
# names the stale one with RERUN_OF_ATTR (its number).
UNSNAPSHOTTED = (
    "started after Ray Tune's last snapshot of the search (the driver died before Tune saved "
    "it); --resume trains its configuration again as a new trial"
)
RERUN_OF_ATTR = "raypeft.rerun_of_trial"
# In a discrete space, a proposal of a configuration the study already holds is not trained
# again: it is answered from that trial (its number, under this attribute).
ANSWERED_FROM_ATTR = "raypeft.answered_from_trial"
# The trial's configuration apart from its seed (ExperimentConfig.configuration_of).
CONFIGURATION_ATTR = "raypeft.configuration"
# A trial the scheduler stopped on a metric other than the objective is COMPLETE with the
# objective value its kept checkpoint holds; this attribute names the step it stopped at.
STOPPED_EARLY_ATTR = "raypeft.stopped_early_at_step"
# A study attribute per search (this prefix + its parent run id): the Optuna trial number of
# the configuration the search chose (the registered champion's trial).
CHOSEN_ATTR = "raypeft.chosen_trial."
# A study attribute per search (this prefix + its parent run id): the process running it,
# "host|pid|start time". A search started beside it leaves its trials alone.
DRIVER_ATTR = "raypeft.driver."


def build_sampler(cfg: ExperimentConfig, earlier_trials: int = 0) -> optuna.samplers.BaseSampler:
    """The Optuna sampler ``search.sampler`` names, seeded by ``search.seed`` plus the number
    of trials earlier searches left in the study (``earlier_trials``): a search continuing a
    study draws new configurations, not its first search's again, and is still reproducible.

    Constraints reach TPE and NSGA-II through each trial's ``set_constraint`` values
    (Optuna 5), set by :class:`~raypeft.search.searcher.StudySearcher`; the other samplers
    ignore them, but the best trial still has to meet them.
    """
    seed = cfg.search.seed + earlier_trials
    name = cfg.search.sampler
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        grid = {key: p.listed() for key, p in cfg.space.items()}
        return _GridSampler(grid, seed=seed)
    if name == "cmaes":
        # CMA-ES models the numeric keys jointly; categorical ones are sampled by TPE
        return optuna.samplers.CmaEsSampler(
            seed=seed,
            independent_sampler=optuna.samplers.TPESampler(seed=seed),
            warn_independent_sampling=False,
        )
    if name == "gp":  # a Gaussian process over the keys (categorical ones included)
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=startup_trials(cfg))
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    conditional = any(is_conditional(k) for k in cfg.space)
    # multivariate TPE with groups models keys that only some trials have (conditional knobs)
    return optuna.samplers.TPESampler(
        seed=seed,
        multivariate=conditional,
        group=conditional,
        n_startup_trials=startup_trials(cfg),
    )


MODEL_BASED = {"tpe": optuna.samplers.TPESampler, "gp": optuna.samplers.GPSampler}


def startup_trials(cfg: ExperimentConfig) -> int:
    """How many trials a tpe or gp sampler draws at random before it models the results:
    ``search.startup_trials``, else the Optuna sampler's own default."""
    if cfg.search.startup_trials is not None:
        return cfg.search.startup_trials
    sampler = MODEL_BASED[cfg.search.sampler]
    return inspect.signature(sampler).parameters["n_startup_trials"].default


class _GridSampler(optuna.samplers.GridSampler):
    """Optuna's grid sampler, minus ``study.stop()`` once every point is visited: that call
    only works inside ``study.optimize``, and here Tune's ``num_samples`` ends the search."""

    def after_trial(self, study, trial, state, values) -> None:
        pass


def directions(modes: list[str]) -> list[str]:
    """Optuna's study directions for raypeft's modes (max, min)."""
    return ["maximize" if m == "max" else "minimize" for m in modes]


def open_storage(url: str) -> optuna.storages.RDBStorage:
    """Optuna's storage at ``url``; a new sqlite file's tables are created under
    :func:`store_lock`, so that searches started together in one folder do not collide."""
    try:
        with store_lock(url, "search.storage"):
            return optuna.storages.RDBStorage(database_url(url))
    except Exception as exc:  # bad URL, unreachable database, missing driver
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(
            f"search.storage: cannot open Optuna storage {redact_uri(url)!r}: {redact_uri(first)}"
        ) from None


def prepare_study(
    storage: optuna.storages.BaseStorage,
    study_name: str,
    modes: list[str],
    resuming: bool = False,
) -> list[dict[str, Any]]:
    """Get a persisted study ready to be continued; returns the params of its finished trials.

    Trials left RUNNING or WAITING by a search that died are marked FAIL, so the sampler does
    not hand them out again - unless that search is being resumed (``resuming``): its trials
    continue. Trials of a search still running (started beside this one, in another process)
    are its own and left alone. A study created for other objective directions is refused.
    """
    if not check_directions(storage, study_name, modes):
        return []  # a new study
    study = optuna.load_study(study_name=study_name, storage=storage)
    study_id = storage.get_study_id_from_name(study_name)
    finished = []
    searches = dict(study.user_attrs)
    for trial in study.get_trials(deepcopy=False):
        if trial.state in (TrialState.RUNNING, TrialState.WAITING):
            if not resuming and not _of_live_search(trial, searches):
                storage.set_trial_state_values(
                    storage_id(storage, study_id, trial.number), TrialState.FAIL
                )
        elif trial.state in (TrialState.COMPLETE, TrialState.PRUNED):
            finished.append(dict(trial.params))
    return finished


def check_directions(
    storage: optuna.storages.BaseStorage, study_name: str, modes: list[str]
) -> bool:
    """Whether the storage holds a study of this name; raises :class:`ConfigError` when that
    study was created for directions other than ``modes`` (max, min), this search's."""
    try:
        study_id = storage.get_study_id_from_name(study_name)
    except KeyError:
        return False
    have = [
        "max" if d == optuna.study.StudyDirection.MAXIMIZE else "min"
        for d in storage.get_study_directions(study_id)
    ]
    if have != modes:
        raise ConfigError(
            f"search.study_name: Optuna study {study_name!r} was created for directions {have}, "
            f"this search optimises {modes}; set search.study_name to start a new study"
        )
    return True


def check_existing_study(cfg: ExperimentConfig, tracking_uri: str, modes: list[str]) -> None:
    """Before anything starts (``raypeft validate`` as ``tune``): a study the search would
    continue was created for its directions (:func:`check_directions`). Only a storage that
    exists is opened, and without creating its tables: a new one is the search's to create."""
    url, name = study_location(cfg, tracking_uri)
    path = sqlite_file(url)
    if path is not None and not path.is_file():
        return
    try:
        storage = optuna.storages.RDBStorage(url, skip_table_creation=True)
    except Exception:  # not an Optuna database yet, or unopenable: open_storage says why
        return  # in one line when the search opens it
    try:
        check_directions(storage, name, modes)
    except ConfigError:
        raise
    except Exception:  # no Optuna tables yet: the search creates them
        return
    finally:
        storage.engine.dispose()


def storage_id(storage: optuna.storages.BaseStorage, study_id: int, number: int) -> int:
    """The storage's id of trial ``number`` of study ``study_id`` (what the storage's
    methods take; a FrozenTrial knows it only privately)."""
    return storage.get_trial_id_from_study_id_trial_number(study_id, number)


@functools.cache
def _driver(pid: int) -> str:
    return f"{socket.gethostname()}|{pid}|{psutil.Process(pid).create_time():.3f}"


def this_driver() -> str:
    """This process, as :data:`DRIVER_ATTR` names a search's process."""
    return _driver(os.getpid())


def driver_alive(driver: str | None) -> bool:
    """Whether the search process ``driver`` (``host|pid|start time``) still runs. One on
    another machine cannot be checked from here: it counts as running."""
    try:
        host, pid, started = (driver or "").rsplit("|", 2)
        if host != socket.gethostname():
            return True
        return abs(psutil.Process(int(pid)).create_time() - float(started)) < 1.0
    except (ValueError, psutil.Error):  # no such process (any more), or no driver noted
        return False


def _of_live_search(trial: optuna.trial.FrozenTrial, searches: dict[str, Any]) -> bool:
    """A RUNNING or WAITING trial belongs to a search still running (started beside this
    one): its own search's process is alive; for a trial not yet claimed by a search (just
    asked for, or enqueued), any search of the study is."""
    parent = trial.user_attrs.get(PARENT_RUN_ATTR)
    if parent is not None:
        return driver_alive(searches.get(DRIVER_ATTR + str(parent)))
    return any(driver_alive(v) for k, v in searches.items() if k.startswith(DRIVER_ATTR))


def fail_orphans(
    storage: optuna.storages.BaseStorage,
    study_name: str,
    parent_run_id: str,
    reason: str = "interrupted before Ray Tune recorded it",
    interrupted_by: str | None = None,
) -> int:
    """Mark FAIL the trials of this search still RUNNING, with the reason. Returns how many.

    After a resumed search, they were asked for just before the driver died, after Tune's last
    snapshot of the experiment, so no Tune trial will ever finish them. When a search pauses
    (``interrupted_by``: the signal's name), they are the interrupted trials: ``--resume``
    takes each up again (:meth:`~raypeft.search.searcher.StudySearcher.take_up_interrupted`).
    """
    study = optuna.load_study(study_name=study_name, storage=storage)
    study_id = storage.get_study_id_from_name(study_name)
    orphans = [
        t
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        if t.user_attrs.get(PARENT_RUN_ATTR) == parent_run_id
    ]
    for trial in orphans:
        trial_id = storage_id(storage, study_id, trial.number)
        storage.set_trial_user_attr(trial_id, ERROR_ATTR, reason)
        if interrupted_by:
            storage.set_trial_user_attr(trial_id, INTERRUPTED_ATTR, interrupted_by)
        storage.set_trial_state_values(trial_id, TrialState.FAIL)
    return len(orphans)


def unrecorded_ends(
    storage: optuna.storages.BaseStorage,
    study_name: str,
    parent_run_id: str,
    ended: set[str],
) -> dict[int, str]:
    """The trials of this search the study still holds RUNNING although Tune ended them
    (``ended``: Tune trial ids): their ends were never recorded (a failed ``study.tell``).
    ``{Optuna trial number: Tune trial id}``. Read from the study, so it finds them whichever
    process's searcher told (or failed to tell) them, a resumed search's included."""
    study = optuna.load_study(study_name=study_name, storage=storage)
    return {
        t.number: t.user_attrs[TUNE_TRIAL_ATTR]
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        if t.user_attrs.get(PARENT_RUN_ATTR) == parent_run_id
        and t.user_attrs.get(TUNE_TRIAL_ATTR) in ended
    }


@dataclass
class Rerun:
    """A trial Tune's snapshot did not know, closed on ``--resume``, and the trial that
    trained its configuration again (None: the search ended before it asked for it)."""

    number: int  # the stale Optuna trial
    tune_trial_id: str | None  # the Tune trial it had been (its MLflow run's)
    again: str | None  # the Tune trial that ran its configuration again


def reruns(
    storage: optuna.storages.BaseStorage, study_name: str, parent_run_id: str
) -> list[Rerun]:
    """This search's trials ``--resume`` closed because Tune's snapshot did not know them
    (:data:`UNSNAPSHOTTED`), each with the Tune trial that ran its configuration again
    (:data:`RERUN_OF_ATTR`), read from the study."""
    study = optuna.load_study(study_name=study_name, storage=storage)
    own = [
        t
        for t in study.get_trials(deepcopy=False)
        if t.user_attrs.get(PARENT_RUN_ATTR) == parent_run_id
    ]
    again = {
        t.user_attrs[RERUN_OF_ATTR]: t.user_attrs.get(TUNE_TRIAL_ATTR)
        for t in own
        if RERUN_OF_ATTR in t.user_attrs
    }
    return [
        Rerun(t.number, t.user_attrs.get(TUNE_TRIAL_ATTR), again.get(t.number))
        for t in own
        if t.state == TrialState.FAIL and t.user_attrs.get(ERROR_ATTR) == UNSNAPSHOTTED
    ]


def remaining_grid_points(
    points: list[dict[str, Any]], finished: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Grid points no finished trial of the study has run yet (continuing a search)."""

    def matches(point: dict[str, Any], params: dict[str, Any]) -> bool:
        return all(k in params and params[k] == v for k, v in point.items())

    return [p for p in points if not any(matches(p, done) for done in finished)]


@dataclass
class StudyPlan:
    """Where the Optuna study lives and what is left of its grid."""

    storage_url: str
    storage: Any  # the opened optuna RDBStorage, handed to the searcher
    study_name: str
    points: list[dict[str, Any]]  # grid points still to run (all of them in a new study)
    finished_before: int  # trials of earlier searches of the same study


def study_location(cfg: ExperimentConfig, tracking_uri: str) -> tuple[str, str]:
    """Where a search's persisted Optuna study lives: its storage URL and study name."""
    url = database_url(search_storage_url(cfg, tracking_uri))
    return url, cfg.search.study_name or cfg.tracking.experiment or cfg.name


def plan_study(
    cfg: ExperimentConfig,
    tracking_uri: str,
    objectives: list[ResolvedObjective],
    resuming: bool = False,
) -> StudyPlan:
    """Open (or create) the persisted study, its objectives named (optuna-dashboard's axes and
    ``study.metric_names``); skip grid points an earlier search ran."""
    url, name = study_location(cfg, tracking_uri)
    storage = open_storage(url)  # opened once: prepared here, then used by the searcher
    modes = [o.mode for o in objectives]
    finished = prepare_study(storage, name, modes, resuming=resuming)
    study = optuna.create_study(
        storage=storage,
        study_name=name,
        directions=directions(modes),
        load_if_exists=True,
    )
    with warnings.catch_warnings():  # experimental since Optuna 3.2, and still so in 5.0
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names([o.name for o in objectives])
    grid = [] if cfg.search.sampler == "grid" else cfg.grid_points()
    return StudyPlan(url, storage, name, remaining_grid_points(grid, finished), len(finished))


def record_chosen(storage, study_name: str, parent_run_id: str, tune_trial_id: str) -> None:
    """Name on the study (:data:`CHOSEN_ATTR` + the search's parent run id) the Optuna trial
    of the configuration the search chose: the same one ``study.best_trial`` returns, once
    the search's trials are all told, except with ``search.repeat_best``, which chooses by
    the mean over seeds: the best trial of the seed-means study then
    (:mod:`raypeft.search.seed_means`)."""
    study = optuna.load_study(study_name=study_name, storage=storage)
    for trial in study.get_trials(deepcopy=False):
        attrs = trial.user_attrs
        if attrs.get(TUNE_TRIAL_ATTR) == tune_trial_id and attrs.get(PARENT_RUN_ATTR) == (
            parent_run_id
        ):
            study.set_user_attr(CHOSEN_ATTR + parent_run_id, trial.number)
            return
