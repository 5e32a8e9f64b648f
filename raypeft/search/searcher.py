"""Optuna behind Ray Tune: samplers, a persisted study, pruned trials, objectives, constraints.

Ray's ``OptunaSearch`` tells Optuna that a trial the scheduler stopped early is COMPLETE, with
the low-fidelity value it had reached, and keeps the study in memory. ``PruningAwareSearch``
tells Optuna such a trial was PRUNED at the training step it reached (its intermediate values
are reported by step), records each trial's metrics as user attributes (which constraint
functions and optuna-dashboard read), and works on an RDB storage, by default ``optuna.db``
next to the MLflow store, so a later search of the same study continues its history.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import psutil
from optuna.trial import TrialState
from ray.tune.search import Searcher
from ray.tune.search.optuna import OptunaSearch

from raypeft.config.redact import redact_uri
from raypeft.config.schema import (
    EFFICIENCY_METRICS,
    Bound,
    ChoiceParam,
    ExperimentConfig,
    GridParam,
    is_conditional,
)
from raypeft.data.metrics import METRIC_MODE
from raypeft.errors import ConfigError
from raypeft.tracking.stores import store_lock
from raypeft.training.evaluation import objective_mode
from raypeft.training.result_keys import FAILURE_KEY, ran_to_end

logger = logging.getLogger(__name__)

METRICS_ATTR = "raypeft.metrics"  # user attribute: the trial's last reported metrics
TUNE_TRIAL_ATTR = "raypeft.tune_trial_id"
PARENT_RUN_ATTR = "raypeft.parent_run_id"  # the MLflow search the trial belongs to
ERROR_ATTR = "raypeft.error"  # why the trial failed
# A trial paused by Ctrl-C/SIGTERM is closed FAIL (nothing is left RUNNING) with this attribute
# (the signal's name); `--resume` continues it in a new trial, which names it (an Optuna trial
# cannot change once finished) with RESUMED_FROM_ATTR: the paused trial's number.
INTERRUPTED_ATTR = "raypeft.interrupted"
RESUMED_FROM_ATTR = "raypeft.resumed_from_trial"
# In a discrete space, a proposal of a configuration the study already holds is not trained
# again: it is answered from that trial (its number, under this attribute).
ANSWERED_FROM_ATTR = "raypeft.answered_from_trial"
# A trial the scheduler stopped on a metric other than the objective is COMPLETE with the
# objective value its kept checkpoint holds; this attribute names the step it stopped at.
STOPPED_EARLY_ATTR = "raypeft.stopped_early_at_step"
# A study attribute per search (this prefix + its parent run id): the Optuna trial number of
# the configuration the search chose (the registered champion's trial).
CHOSEN_ATTR = "raypeft.chosen_trial."
# A study attribute per search (this prefix + its parent run id): the process running it,
# "host|pid|start time". A search started beside it leaves its trials alone.
DRIVER_ATTR = "raypeft.driver."


@dataclass(frozen=True)
class ResolvedObjective:
    """An objective as Tune results carry it."""

    name: str  # as written in the file: accuracy, train_samples_per_s, ...
    mode: str  # max | min
    result_key: str  # best_val_accuracy (a quality metric's best so far) or the efficiency key


def result_key(name: str) -> str:
    """Efficiency figures are reported under their own name; quality metrics as the best
    validation value so far (what the kept checkpoint scored)."""
    return name if name in EFFICIENCY_METRICS else f"best_val_{name}"


def _check_name(name: str, task_metrics: tuple[str, ...], where: str) -> None:
    known = (*task_metrics, "loss", *EFFICIENCY_METRICS)
    if name not in known:
        raise ConfigError(f"{where}: {name!r} is not reported for this task; choose one of {known}")


def resolve_objectives(
    cfg: ExperimentConfig, task_metrics: tuple[str, ...]
) -> list[ResolvedObjective]:
    """The search's objectives (first one primary), checked against the task's metrics (and
    so is the scheduler's own metric, ``search.scheduler.metric``)."""
    check_scheduler_metric(cfg, task_metrics)
    out = []
    for i, objective in enumerate(cfg.search.objective_list(task_metrics[0])):
        where = f"search.objectives[{i}].metric" if cfg.search.objectives else "search.metric"
        _check_name(objective.metric, task_metrics, where)
        mode = objective_mode(objective)
        out.append(ResolvedObjective(objective.metric, mode, result_key(objective.metric)))
    return out


def scheduler_target(cfg: ExperimentConfig, key: str, mode: str) -> tuple[str, str]:
    """The result key and direction the trial scheduler compares trials on:
    ``search.scheduler.metric`` (this evaluation's value, e.g. ``val_loss``) where set, else
    the search's own (``key``, ``mode``). Names are checked by :func:`check_scheduler_metric`."""
    name = cfg.search.scheduler.metric
    if not name:
        return key, mode
    bare = name.removeprefix("val_")
    return f"val_{bare}", cfg.search.scheduler.mode or METRIC_MODE.get(bare, "max")


def check_scheduler_metric(cfg: ExperimentConfig, task_metrics: tuple[str, ...]) -> None:
    """``search.scheduler.metric`` must be a validation metric every evaluation reports."""
    name = cfg.search.scheduler.metric
    known = tuple(f"val_{m}" for m in (*task_metrics, "loss"))
    if name and f"val_{name.removeprefix('val_')}" not in known:
        raise ConfigError(
            f"search.scheduler.metric: {name!r} is not reported at each evaluation of this "
            f"task; choose one of {known}"
        )


def stops_on_objective(cfg: ExperimentConfig, primary: ResolvedObjective) -> bool:
    """Whether the trial scheduler stops trials by the primary objective itself (Optuna's
    idea of pruning: judged unpromising on the objective's intermediate values). A scheduler
    on another metric (``search.scheduler.metric: val_loss`` under accuracy) judges
    something else: the objective value such a trial's checkpoint holds is a real result."""
    if cfg.search.scheduler.type == "none":
        return False
    return scheduler_target(cfg, primary.result_key, primary.mode)[0] == primary.result_key


def resolve_constraints(cfg: ExperimentConfig, task_metrics: tuple[str, ...]) -> Constraints:
    """``search.constraints`` keyed by the Tune result key, names checked."""
    for name in cfg.search.constraints:
        _check_name(name, task_metrics, f"search.constraints.{name}")
    return Constraints({result_key(k): v for k, v in cfg.search.constraints.items()})


class Constraints:
    """``search.constraints``: a value <= 0 per bound means satisfied (Optuna's convention)."""

    def __init__(self, bounds: dict[str, Bound]):
        self.bounds = bounds

    def named_values(self, metrics: dict[str, Any]) -> dict[str, float]:
        out = {}
        for key, bound in self.bounds.items():
            value = metrics.get(key)
            if value is None or not math.isfinite(float(value)):
                value = math.nan  # never reported: not shown to satisfy anything
            if bound.max is not None:
                out[f"{key}<={bound.max:g}"] = float(value) - bound.max
            if bound.min is not None:
                out[f"{key}>={bound.min:g}"] = bound.min - float(value)
        return {k: (math.inf if math.isnan(v) else v) for k, v in out.items()}

    def feasible(self, metrics: dict[str, Any]) -> bool:
        return all(v <= 0 for v in self.named_values(metrics).values())

    def __bool__(self) -> bool:
        return bool(self.bounds)


def build_sampler(cfg: ExperimentConfig, earlier_trials: int = 0) -> optuna.samplers.BaseSampler:
    """The Optuna sampler ``search.sampler`` names, seeded by ``search.seed`` plus the number
    of trials earlier searches left in the study (``earlier_trials``): a search continuing a
    study draws new configurations, not its first search's again, and is still reproducible.

    Constraints reach TPE and NSGA-II through each trial's ``set_constraint`` values
    (Optuna 5), set by :class:`PruningAwareSearch`; the other samplers ignore them, but the
    best trial still has to meet them.
    """
    seed = cfg.search.seed + earlier_trials
    name = cfg.search.sampler
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        grid = {
            key: (p.grid if isinstance(p, GridParam) else p.choice) for key, p in cfg.space.items()
        }
        return _GridSampler(grid, seed=seed)
    if name == "cmaes":
        # CMA-ES models the numeric keys jointly; categorical ones are sampled by TPE
        return optuna.samplers.CmaEsSampler(
            seed=seed,
            independent_sampler=optuna.samplers.TPESampler(seed=seed),
            warn_independent_sampling=False,
        )
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    conditional = any(is_conditional(k) for k in cfg.space)
    # multivariate TPE with groups models keys that only some trials have (conditional knobs)
    return optuna.samplers.TPESampler(seed=seed, multivariate=conditional, group=conditional)


class _GridSampler(optuna.samplers.GridSampler):
    """Optuna's grid sampler, minus ``study.stop()`` once every point is visited: that call
    only works inside ``study.optimize``, and here Tune's ``num_samples`` ends the search."""

    def after_trial(self, study, trial, state, values) -> None:
        pass


_DIRECTIONS = {"max": "maximize", "min": "minimize"}


def default_storage(tracking_uri: str) -> str:
    """``optuna.db`` beside a local sqlite MLflow store; else in the working directory."""
    if tracking_uri.startswith("sqlite:///"):
        folder = Path(tracking_uri[len("sqlite:///") :]).expanduser().resolve().parent
        return f"sqlite:///{folder / 'optuna.db'}"
    return f"sqlite:///{Path('optuna.db').resolve()}"


def open_storage(url: str) -> optuna.storages.RDBStorage:
    """Optuna's storage at ``url``; a new sqlite file's tables are created under
    :func:`store_lock`, so that searches started together in one folder do not collide."""
    try:
        with store_lock(url, "search.storage"):
            return optuna.storages.RDBStorage(url)
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
    try:
        study = optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:
        return []  # a new study
    wanted = [
        optuna.study.StudyDirection.MAXIMIZE if m == "max" else optuna.study.StudyDirection.MINIMIZE
        for m in modes
    ]
    if list(study.directions) != wanted:
        have = [
            "max" if d == optuna.study.StudyDirection.MAXIMIZE else "min" for d in study.directions
        ]
        raise ConfigError(
            f"search.study_name: Optuna study {study_name!r} was created for directions {have}, "
            f"this search optimises {modes}; set search.study_name to start a new study"
        )
    finished = []
    searches = dict(study.user_attrs)
    for trial in study.get_trials(deepcopy=False):
        if trial.state in (TrialState.RUNNING, TrialState.WAITING):
            if not resuming and not _of_live_search(trial, searches):
                storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
        elif trial.state in (TrialState.COMPLETE, TrialState.PRUNED):
            finished.append(dict(trial.params))
    return finished


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
    takes each up again (:meth:`PruningAwareSearch.take_up_interrupted`).
    """
    study = optuna.load_study(study_name=study_name, storage=storage)
    orphans = [
        t
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        if t.user_attrs.get(PARENT_RUN_ATTR) == parent_run_id
    ]
    for trial in orphans:
        storage.set_trial_user_attr(trial._trial_id, ERROR_ATTR, reason)
        if interrupted_by:
            storage.set_trial_user_attr(trial._trial_id, INTERRUPTED_ATTR, interrupted_by)
        storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
    return len(orphans)


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


def plan_study(
    cfg: ExperimentConfig,
    tracking_uri: str,
    objectives: list[ResolvedObjective],
    resuming: bool = False,
) -> StudyPlan:
    """Open (or create) the persisted study, its objectives named (optuna-dashboard's axes and
    ``study.metric_names``); skip grid points an earlier search ran."""
    url = cfg.search.storage or default_storage(tracking_uri)
    name = cfg.search.study_name or cfg.tracking.experiment or cfg.name
    storage = open_storage(url)  # opened once: prepared here, then used by the searcher
    modes = [o.mode for o in objectives]
    finished = prepare_study(storage, name, modes, resuming=resuming)
    study = optuna.create_study(
        storage=storage,
        study_name=name,
        directions=[_DIRECTIONS[m] for m in modes],
        load_if_exists=True,
    )
    study.set_metric_names([o.name for o in objectives])
    grid = [] if cfg.search.sampler == "grid" else cfg.grid_points()
    return StudyPlan(url, storage, name, remaining_grid_points(grid, finished), len(finished))


def discrete_space(cfg: ExperimentConfig) -> bool:
    """Whether a configuration alone decides its trial's result: every searched key takes
    listed values (grid or choice) and every trial trains with the same seed. Then a
    configuration run once need not be trained again."""
    categorical = all(isinstance(p, (GridParam, ChoiceParam)) for p in cfg.space.values())
    return categorical and (cfg.search.trial_seed == "fixed" or "train.seed" in cfg.space)


# the trial a repeated configuration is answered from: a finished one first (a full run, then
# the furthest pruned), else one of this search still training (answered when it ends)
_ORIGINAL_RANK = {TrialState.COMPLETE: 0, TrialState.PRUNED: 1, TrialState.RUNNING: 2}


def _rank(trial: optuna.trial.FrozenTrial) -> tuple:
    step = trial.user_attrs.get(METRICS_ATTR, {}).get("step", 0)
    return _ORIGINAL_RANK[trial.state], -step, trial.number


class PruningAwareSearch(OptunaSearch):
    """``OptunaSearch`` that tells Optuna which trials the scheduler pruned, and at what step.

    A trial whose last result is not from its own last step (and no error) was stopped by the
    scheduler. Stopped on the objective itself (``prune_stopped``, :func:`stops_on_objective`),
    Optuna records it as PRUNED, its intermediate values keyed by training step, so TPE treats
    it as a pruned trial rather than a finished one with a low-fidelity score, and
    ``study.best_trial`` (COMPLETE trials only) leaves it out, as raypeft's choice does when
    any trial ran to its end. Stopped on another metric, its checkpoint's objective value is a
    real result: COMPLETE with that value (and :data:`STOPPED_EARLY_ATTR`), so the samplers,
    ``study.best_trial`` and optuna-dashboard see it as raypeft does.
    """

    def __init__(
        self,
        *args,
        objectives: list[ResolvedObjective],
        constraints: Constraints,
        parent_run_id: str,
        answer_repeats: bool = False,
        prune_stopped: bool = True,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        self.objectives = objectives
        self.prune_stopped = prune_stopped  # stops_on_objective: a stopped trial is PRUNED
        self.constraints = constraints
        self.parent_run_id = parent_run_id
        self.answer_repeats = answer_repeats  # the space is discrete (discrete_space)
        self._waiting: list[tuple[optuna.trial.Trial, int]] = []  # (repeat, original's id)
        self._note_driver()

    def _note_driver(self) -> None:
        """Name this process in the study as the one running this search (once per process:
        a resumed search is another process), before it asks for trials."""
        driver = this_driver()
        study = getattr(self, "_ot_study", None)
        if study is not None and getattr(self, "_driver", None) != driver:
            study.set_user_attr(DRIVER_ATTR + self.parent_run_id, driver)
            self._driver = driver

    def suggest(self, trial_id: str):
        """The next configuration to train. With ``answer_repeats``, a proposal of a
        configuration the study already holds is answered from it (not a trial: Tune's
        ``num_samples`` counts trained configurations) and the sampler asked again; after
        :attr:`MAX_REPEATS` repeats in a row, a configuration not yet run is drawn at random,
        and when none is left the search ends."""
        self._note_driver()
        self._answer_waiting()
        repeats = 0
        while True:
            if repeats >= self.MAX_REPEATS:
                unrun = self._unrun_configuration()
                if unrun is None:
                    logger.info("Every configuration of the space has run: the search ends")
                    return Searcher.FINISHED
                self._ot_study.enqueue_trial(unrun)  # what the next ask returns
            config = super().suggest(trial_id)
            ot_trial = self._ot_trials.get(trial_id)
            if ot_trial is None:
                return config
            # cross-references for optuna-dashboard and MLflow
            ot_trial.set_user_attr(PARENT_RUN_ATTR, self.parent_run_id)
            original = self._same_configuration(ot_trial) if self.answer_repeats else None
            if original is None:
                ot_trial.set_user_attr(TUNE_TRIAL_ATTR, trial_id)
                return config
            del self._ot_trials[trial_id]  # so that super().suggest asks Optuna again
            self._set_aside(ot_trial, original)
            repeats += 1

    # A sampler that converged keeps proposing its best configuration; answering it again
    # and again would only grow the study, so after this many repeats in a row it explores.
    MAX_REPEATS = 3

    def _own_trials(self) -> list[optuna.trial.FrozenTrial]:
        """The study's trials of this search (its ``--resume`` included), answered repeats
        aside. A later search of the same study trains its configurations again: it is run
        to check them again (another seed policy, changed code), and must have results."""
        return [
            t
            for t in self._ot_study.get_trials(deepcopy=False)
            if ANSWERED_FROM_ATTR not in t.user_attrs
            and t.user_attrs.get(PARENT_RUN_ATTR) == self.parent_run_id
        ]

    def _run_configurations(self) -> list[dict[str, Any]]:
        """Configurations this search has run or is running."""
        return [
            t.params
            for t in self._own_trials()
            if t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
        ]

    def _unrun_configuration(self, draws: int = 2000) -> dict[str, Any] | None:
        """A configuration of the space no trial has run, drawn at random (a throwaway
        in-memory study, so the persisted one only holds real proposals); None when
        ``draws`` draws found none (the space is, in effect, exhausted)."""
        run = self._run_configurations()
        scratch = optuna.create_study(
            sampler=optuna.samplers.RandomSampler(seed=len(run)),  # reproducible per search
            directions=self._ot_study.directions,
        )
        for _ in range(draws):
            trial = scratch.ask()
            self._space(trial)  # the define-by-run function samples every key
            if trial.params not in run:
                return dict(trial.params)
        return None

    def _same_configuration(self, ot_trial: optuna.trial.Trial) -> optuna.trial.FrozenTrial | None:
        """The trial of this search with the same configuration as ``ot_trial``, if any: a
        finished one, or one still training."""
        params = ot_trial.params
        same = [
            t
            for t in self._own_trials()
            if t.number != ot_trial.number
            and t.params == params
            and t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
        ]
        return min(same, key=_rank, default=None)

    def _set_aside(self, repeat: optuna.trial.Trial, original: optuna.trial.FrozenTrial) -> None:
        """Answer ``repeat`` from ``original`` now, or when ``original`` ends."""
        repeat.set_user_attr(ANSWERED_FROM_ATTR, original.number)
        logger.info(
            "Optuna trial %d repeats trial %d's configuration: answered from it, not trained",
            repeat.number,
            original.number,
        )
        if original.state.is_finished():
            self._answer(repeat, original)
        else:
            self._waiting.append((repeat, original._trial_id))

    def _answer_waiting(self) -> None:
        """Answer the repeats whose original trial has ended since they were proposed."""
        still = []
        for repeat, original_id in self._waiting:
            storage = repeat.storage
            if storage.get_trial(repeat._trial_id).state.is_finished():
                continue  # closed meanwhile (an interrupted search fails what was running)
            original = storage.get_trial(original_id)
            if original.state.is_finished():
                self._answer(repeat, original)
            else:
                still.append((repeat, original_id))
        self._waiting = still

    def _answer(self, repeat: optuna.trial.Trial, original: optuna.trial.FrozenTrial) -> None:
        """Tell Optuna ``repeat`` ended as ``original`` did: the same state, values,
        intermediate values, metrics and constraints (a fixed seed gives the same run)."""
        if len(self.objectives) == 1:
            for step, value in sorted(original.intermediate_values.items()):
                repeat.report(value, step)
        for key in (METRICS_ATTR, "raypeft.pruned_at_step", ERROR_ATTR):
            if key in original.user_attrs:
                repeat.set_user_attr(key, original.user_attrs[key])
        for key, value in original.system_attrs.items():
            if key.startswith("constraints:"):  # Trial.set_constraint's keys (Optuna 5)
                repeat.set_constraint(key.split(":", 1)[1], value)
        values = original.values if original.state == TrialState.COMPLETE else None
        try:
            self._ot_study.tell(
                repeat,
                values if values is None or len(values) > 1 else values[0],
                state=original.state,
            )
        except Exception as exc:  # the study must never take the search down
            logger.warning("Optuna could not record trial %d: %s", repeat.number, exc)

    def take_up_interrupted(self, trial_id: str) -> None:
        """A trial the search paused on was closed FAIL in the study (so that nothing was left
        RUNNING); when the resumed search runs it again, it goes on in a new RUNNING trial with
        the same parameters, distributions, attributes and intermediate values, which the
        trial's end is told to; it names the paused one (``raypeft.resumed_from_trial``)."""
        ot_trial = self._ot_trials.get(trial_id)
        if ot_trial is None:
            return
        storage = ot_trial.storage
        paused = storage.get_trial(ot_trial._trial_id)
        if paused.state != TrialState.FAIL or INTERRUPTED_ATTR not in paused.user_attrs:
            return
        attrs = {
            k: v for k, v in paused.user_attrs.items() if k not in (INTERRUPTED_ATTR, ERROR_ATTR)
        }
        attrs[RESUMED_FROM_ATTR] = paused.number
        template = optuna.trial.create_trial(
            state=TrialState.RUNNING,
            params=paused.params,
            distributions=paused.distributions,
            user_attrs=attrs,
            system_attrs=paused.system_attrs,
            intermediate_values=paused.intermediate_values,
        )
        study_id = storage.get_study_id_from_name(self._ot_study.study_name)
        new_id = storage.create_new_trial(study_id, template_trial=template)
        self._ot_trials[trial_id] = optuna.trial.Trial(self._ot_study, new_id)

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        self.take_up_interrupted(trial_id)
        if len(self.objectives) > 1 or trial_id in self._completed_trials:
            return  # Optuna keeps no intermediate values for multi-objective studies
        value = result.get(self.objectives[0].result_key)
        if value is None or not math.isfinite(float(value)):
            return
        step = int(result.get("step", result.get("training_iteration", 0)))
        if self._already_told(trial_id):
            return
        self._ot_trials[trial_id].report(float(value), step)

    def _already_told(self, trial_id: str) -> bool:
        """Whether the study already holds the trial's end: a search whose driver died after
        telling Optuna, but before Tune's last snapshot, re-runs the trial's last steps."""
        ot_trial = self._ot_trials[trial_id]
        if ot_trial.storage.get_trial(ot_trial._trial_id).state.is_finished():
            self._completed_trials.add(trial_id)
            return True
        return False

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False):
        if trial_id in self._completed_trials or trial_id not in self._ot_trials:
            return
        self.take_up_interrupted(trial_id)
        if self._already_told(trial_id):
            return
        ot_trial = self._ot_trials[trial_id]
        result = result or {}
        metrics = {
            k: float(v)
            for k, v in result.items()
            if isinstance(v, (int, float))
            and (k.startswith("best_val_") or k in EFFICIENCY_METRICS)
        }
        metrics["step"] = int(result.get("step", 0))
        ot_trial.set_user_attr(METRICS_ATTR, metrics)
        for name, value in self.constraints.named_values(metrics).items():
            ot_trial.set_constraint(name, value)  # what TPE/NSGA-II learn feasibility from
        values = [result.get(o.result_key) for o in self.objectives]
        if not error and len(values) == 1 and values[0] is not None:
            # Tune hands the result that made the scheduler stop a trial (and a trial's last
            # result) to on_trial_complete only: record it as the value at the step reached
            step = metrics["step"]
            if step not in ot_trial.storage.get_trial(ot_trial._trial_id).intermediate_values:
                ot_trial.report(float(values[0]), step)
        failure = result.get(FAILURE_KEY)  # the loss diverged (raypeft.training.loop)
        if failure:
            ot_trial.set_user_attr(ERROR_ATTR, str(failure)[:1000])
        if error or failure or any(v is None or not math.isfinite(float(v)) for v in values):
            state, values = TrialState.FAIL, None
        elif not ran_to_end(result) and self.prune_stopped:
            state, values = TrialState.PRUNED, None  # value: its last intermediate value
            ot_trial.set_user_attr("raypeft.pruned_at_step", metrics["step"])
        else:
            if not ran_to_end(result):  # stopped on another metric: its checkpoint's value
                ot_trial.set_user_attr(STOPPED_EARLY_ATTR, metrics["step"])
            state, values = TrialState.COMPLETE, [float(v) for v in values]
        try:
            self._ot_study.tell(
                ot_trial, values if values is None or len(values) > 1 else values[0], state=state
            )
        except Exception as exc:  # the study must never take the search down
            logger.warning("Optuna could not record trial %s: %s", trial_id, exc)
        self._completed_trials.add(trial_id)
        self._answer_waiting()  # repeats of this configuration proposed while it trained


def record_chosen(storage, study_name: str, parent_run_id: str, tune_trial_id: str) -> None:
    """Name on the study (:data:`CHOSEN_ATTR` + the search's parent run id) the Optuna trial
    of the configuration the search chose: the same one ``study.best_trial`` returns, once
    the search's trials are all told."""
    study = optuna.load_study(study_name=study_name, storage=storage)
    for trial in study.get_trials(deepcopy=False):
        attrs = trial.user_attrs
        if attrs.get(TUNE_TRIAL_ATTR) == tune_trial_id and attrs.get(PARENT_RUN_ATTR) == (
            parent_run_id
        ):
            study.set_user_attr(CHOSEN_ATTR + parent_run_id, trial.number)
            return


def pareto_front(rows: list[dict[str, float]], objectives: list[ResolvedObjective]) -> list[int]:
    """Indices of the rows no other row dominates (at least as good everywhere, better once)."""

    def better_or_equal(a: dict, b: dict) -> bool:
        return all(
            (a[o.result_key] >= b[o.result_key])
            if o.mode == "max"
            else (a[o.result_key] <= b[o.result_key])
            for o in objectives
        )

    def dominates(a: dict, b: dict) -> bool:
        return better_or_equal(a, b) and any(a[o.result_key] != b[o.result_key] for o in objectives)

    return [i for i, row in enumerate(rows) if not any(dominates(other, row) for other in rows)]
