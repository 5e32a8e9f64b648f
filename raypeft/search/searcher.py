# Over 500 lines on purpose: one class, Tune's Searcher hooks sharing one study's bookkeeping.
"""Ray Tune's searcher over the persisted Optuna study, on both libraries' public APIs.

:class:`StudySearcher` is a ``ray.tune.search.Searcher`` that asks Optuna's study for each
trial's configuration (the define-by-run space of :mod:`raypeft.search.space`) and tells it
how the trial ended: every evaluation as an intermediate value keyed by training step, the
end as COMPLETE, PRUNED or FAIL (:meth:`StudySearcher.on_trial_complete` says which), with the
trial's metrics and constraint values as attributes (what constraint-aware samplers and
optuna-dashboard read). Trials are addressed by their Optuna number; the storage's own id for
one comes from the storage's public getter (:func:`raypeft.search.study.storage_id`).

In a discrete space a configuration the search already ran is not trained again: the
proposal is answered from that trial (:meth:`StudySearcher.suggest`).
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState
from ray.tune.search import Searcher

from raypeft.config.schema import EFFICIENCY_METRICS, ExperimentConfig
from raypeft.config.space import configuration_key
from raypeft.search.objectives import Constraints, ResolvedObjective
from raypeft.search.study import (
    ANSWERED_FROM_ATTR,
    CONFIGURATION_ATTR,
    DRIVER_ATTR,
    ERROR_ATTR,
    INTERRUPTED_ATTR,
    METRICS_ATTR,
    PARENT_RUN_ATTR,
    RERUN_OF_ATTR,
    RESUMED_FROM_ATTR,
    STOPPED_EARLY_ATTR,
    TUNE_TRIAL_ATTR,
    UNSNAPSHOTTED,
    directions,
    storage_id,
    this_driver,
)
from raypeft.training.phases import PhaseTimer, timed_phase
from raypeft.training.result_keys import FAILURE_KEY, ran_to_end

logger = logging.getLogger(__name__)

PRUNED_AT_ATTR = "raypeft.pruned_at_step"  # where the scheduler stopped a PRUNED trial


def discrete_space(cfg: ExperimentConfig) -> bool:
    """Whether a configuration alone decides its trial's result: every searched key takes
    listed values (grid or choice) and every trial trains with the same seed. Then a
    configuration run once need not be trained again."""
    categorical = all(p.listed() is not None for p in cfg.space.values())
    return categorical and (cfg.search.trial_seed == "fixed" or "train.seed" in cfg.space)


# the trial a repeated configuration is answered from: a finished one first (a full run, then
# the furthest pruned), else one of this search still training (answered when it ends)
_ORIGINAL_RANK = {TrialState.COMPLETE: 0, TrialState.PRUNED: 1, TrialState.RUNNING: 2}


def _rank(trial: optuna.trial.FrozenTrial) -> tuple:
    step = trial.user_attrs.get(METRICS_ATTR, {}).get("step", 0)
    return _ORIGINAL_RANK[trial.state], -step, trial.number


def _reason(exc: BaseException) -> str:
    """An exception in one short line, with its cause's (a storage's error wraps the
    database's: "StorageInternalError: ... (OperationalError: no such table ...)")."""

    def line(e: BaseException) -> str:
        text = str(e).strip()
        return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__

    cause = exc.__cause__ or exc.__context__
    return (line(exc) + (f" ({line(cause)})" if cause is not None else ""))[:400]


class StudySearcher(Searcher):
    """Optuna's study behind Ray Tune, with the scheduler's stops told as Optuna means them.

    A trial whose last result is not from its own last step (and no error) was stopped by the
    scheduler. Stopped on the objective itself (``prune_stopped``,
    :func:`raypeft.search.objectives.stops_on_objective`), Optuna records it as PRUNED at that
    step (its intermediate values keyed by training step), so TPE treats it as a pruned trial
    rather than a finished one with a low-fidelity score, and ``study.best_trial`` (COMPLETE
    trials only) leaves it out, as raypeft's choice does when any trial ran to its end.
    Stopped on another metric, its checkpoint's objective value is a real result: COMPLETE
    with that value (and :data:`STOPPED_EARLY_ATTR`), so the samplers, ``study.best_trial``
    and optuna-dashboard see it as raypeft does.
    """

    # A sampler that converged keeps proposing its best configuration; answering it again
    # and again would only grow the study, so after this many repeats in a row it explores.
    MAX_REPEATS = 3

    def __init__(
        self,
        space,
        storage: optuna.storages.BaseStorage,
        study_name: str,
        sampler: optuna.samplers.BaseSampler,
        objectives: list[ResolvedObjective],
        constraints: Constraints,
        parent_run_id: str,
        points_to_evaluate: list[dict[str, Any]] | None = None,
        answer_repeats: bool = False,
        prune_stopped: bool = True,
    ):
        multi = len(objectives) > 1
        super().__init__(
            metric=[o.result_key for o in objectives] if multi else objectives[0].result_key,
            mode=[o.mode for o in objectives] if multi else objectives[0].mode,
        )
        self.space = space  # define-by-run: samples a trial's keys, returns derived ones
        self.storage = storage
        self.study = optuna.create_study(
            storage=storage,
            sampler=sampler,
            # Tune's scheduler stops trials; Optuna's pruner would only be asked by
            # trial.should_prune, which nothing calls: none, as Ray's OptunaSearch
            pruner=optuna.pruners.NopPruner(),
            study_name=study_name,
            directions=directions([o.mode for o in objectives]),
            load_if_exists=True,
        )
        self.study_id = storage.get_study_id_from_name(study_name)  # asked once, not per trial
        self.objectives = objectives
        self.constraints = constraints
        self.parent_run_id = parent_run_id
        self.answer_repeats = answer_repeats  # the space is discrete (discrete_space)
        self.prune_stopped = prune_stopped  # stops_on_objective: a stopped trial is PRUNED
        self.trials: dict[str, int] = {}  # Tune trial id -> Optuna trial number
        self.handles: dict[int, optuna.trial.Trial] = {}  # trials asked for, by number
        self.told: set[str] = set()  # Tune trials whose end the study holds
        self.reported: dict[int, set[int]] = {}  # trial number -> steps the study holds
        # Tune trials whose stored state this process has read: a paused trial is taken up and
        # a told end found at a trial's first event here; after that, only this process
        # changes the trial (not read again per result: the queries grew with the results)
        self.looked_up: set[str] = set()
        self.ids: dict[int, int] = {}  # trial number -> the storage's trial id (never changes)
        self.waiting: list[tuple[int, int]] = []  # (repeat, original) numbers
        self.driver: str | None = None
        # trial number -> why the study could not record its end (what study.tell raised)
        self.untold: dict[int, str] = {}
        self.phase_s: dict[str, PhaseTimer] = {}  # Tune trial id -> Optuna's seconds on it
        for point in points_to_evaluate or []:
            self.study.enqueue_trial(point)
        self._note_driver()

    # ------------------------------------------------------------------ Ray Tune hooks

    @timed_phase("optuna_ask")
    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        """The next configuration to train. With ``answer_repeats``, a proposal of a
        configuration this search already holds is answered from it (not a trial: Tune's
        ``num_samples`` counts trained configurations) and the sampler asked again; after
        :attr:`MAX_REPEATS` repeats in a row, a configuration not yet run is drawn at random,
        and when none is left the search ends."""
        self._note_driver()
        self._answer_waiting()
        if trial_id in self.trials:  # asked again for the same trial (Tune retries)
            return self._config(self._trial(self.trials[trial_id]))
        for _ in range(self.MAX_REPEATS):
            trial = self._ask()
            config = self._config(trial)
            original = self._same_configuration(trial) if self.answer_repeats else None
            if original is None:
                return self._claim(trial_id, trial, config)
            self._set_aside(trial, original)
        unrun = self._unrun_configuration()
        if unrun is None:
            logger.info("Every configuration of the space has run: the search ends")
            return Searcher.FINISHED
        self.study.enqueue_trial(unrun)  # what the next ask returns
        trial = self._ask()
        return self._claim(trial_id, trial, self._config(trial))

    @timed_phase("optuna_report")
    def on_trial_result(self, trial_id: str, result: dict) -> None:
        """An evaluation: the primary objective's value at its training step (Optuna keeps no
        intermediate values for several objectives)."""
        self.take_up_interrupted(trial_id)
        if len(self.objectives) > 1 or trial_id not in self.trials or self._told(trial_id):
            return
        value = result.get(self.objectives[0].result_key)
        if value is None or not math.isfinite(float(value)):
            return
        step = int(result.get("step", result.get("training_iteration", 0)))
        self._report(self.trials[trial_id], float(value), step)

    @timed_phase("optuna_tell")
    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False):
        """The trial's end: FAIL (an error, a diverged loss, no objective value), PRUNED
        (stopped on the objective before its own last step), else COMPLETE."""
        if trial_id not in self.trials:
            return
        self.take_up_interrupted(trial_id)
        if self._told(trial_id):
            return
        number, result = self.trials[trial_id], result or {}
        trial = self._trial(number)
        metrics = self._record_metrics(trial, result)
        values = [result.get(o.result_key) for o in self.objectives]
        if not error and len(values) == 1 and values[0] is not None:
            # Tune hands the result that made the scheduler stop a trial (and a trial's last
            # result) to on_trial_complete only: record it as the value at the step reached
            self._report(number, float(values[0]), metrics["step"])
        failure = result.get(FAILURE_KEY)  # the loss diverged (raypeft.training.loop)
        if failure:
            trial.set_user_attr(ERROR_ATTR, str(failure)[:1000])
        if error or failure or any(v is None or not math.isfinite(float(v)) for v in values):
            state, values = TrialState.FAIL, None
        elif not ran_to_end(result) and self.prune_stopped:
            state, values = TrialState.PRUNED, None  # value: its last intermediate value
            trial.set_user_attr(PRUNED_AT_ATTR, metrics["step"])
        else:
            if not ran_to_end(result):  # stopped on another metric: its checkpoint's value
                trial.set_user_attr(STOPPED_EARLY_ATTR, metrics["step"])
            state, values = TrialState.COMPLETE, [float(v) for v in values]
        self._tell(number, state, values)
        self.told.add(trial_id)
        self._answer_waiting()  # repeats of this configuration proposed while it trained

    def save(self, checkpoint_path: str) -> None:
        """Tune's snapshot of the searcher, as JSON: which Optuna trial each Tune trial is,
        which ends the study holds, which repeats wait for their original. Everything else
        is in the study itself (Tune pickles the searcher as it was built, with the study's
        name and storage, into its experiment state)."""
        state = {
            "trials": self.trials,
            "told": sorted(self.told),
            "waiting": self.waiting,
            "driver": self.driver,
        }
        Path(checkpoint_path).write_text(json.dumps(state))

    def restore(self, checkpoint_path: str) -> None:
        """The state :meth:`save` wrote. The sampler, as Tune unpickles it, holds the random
        state of the search's start: reseeded, it does not propose the first trials' points
        again."""
        state = json.loads(Path(checkpoint_path).read_text())
        self.trials = {k: int(v) for k, v in state["trials"].items()}
        self.told = set(state["told"])
        self.waiting = [(int(r), int(o)) for r, o in state["waiting"]]
        self.driver = state["driver"]
        self.handles, self.reported, self.looked_up, self.ids = {}, {}, set(), {}
        self.study.sampler.reseed_rng()
        self.requeue_unsnapshotted()

    def requeue_unsnapshotted(self) -> list[int]:
        """After :meth:`restore`: this search's trials the study holds RUNNING, handed to a
        Tune trial, that the restored state does not know were started after Tune's last
        snapshot (the driver died before Tune saved it again). No Tune trial will end them or
        train their configurations, so each is closed FAIL with the reason
        (:data:`UNSNAPSHOTTED`) and its configuration enqueued again, naming it
        (:data:`RERUN_OF_ATTR`): Tune asks for the trials its snapshot lacks, and an ask takes
        it. (Answered repeats and trials never handed to Tune trained nothing: the search's
        end closes them, :func:`~raypeft.search.study.fail_orphans`.) Returns the closed
        trials' numbers."""
        known = set(self.trials.values())
        stale = [
            t
            for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            if t.user_attrs.get(PARENT_RUN_ATTR) == self.parent_run_id
            and TUNE_TRIAL_ATTR in t.user_attrs
            and ANSWERED_FROM_ATTR not in t.user_attrs
            and t.number not in known
        ]
        for trial in stale:
            trial_id = self._storage_id(trial.number)
            self.storage.set_trial_user_attr(trial_id, ERROR_ATTR, UNSNAPSHOTTED)
            self.storage.set_trial_state_values(trial_id, TrialState.FAIL)
            attrs = {PARENT_RUN_ATTR: self.parent_run_id, RERUN_OF_ATTR: trial.number}
            self.study.enqueue_trial(dict(trial.params), user_attrs=attrs)
            logger.info(
                "Optuna trial %d (Tune trial %s) started after Ray Tune's last snapshot: "
                "closed, its configuration queued again",
                trial.number,
                trial.user_attrs[TUNE_TRIAL_ATTR],
            )
        return [t.number for t in stale]

    # ------------------------------------------------------------------ a paused trial

    def take_up_interrupted(self, trial_id: str) -> None:
        """A trial the search paused on was closed FAIL in the study (so that nothing was left
        RUNNING); when the resumed search runs it again, it goes on in a new RUNNING trial with
        the same parameters, distributions, attributes and intermediate values, which the
        trial's end is told to; it names the paused one (``raypeft.resumed_from_trial``).
        The storage is read once per trial and process (:meth:`_look_up`)."""
        number = self.trials.get(trial_id)
        if number is None or trial_id in self.looked_up:
            return
        self._look_up(trial_id)

    def _look_up(self, trial_id: str) -> None:
        """Read the trial's stored state once in this process: a trial paused by an earlier
        driver goes on in a new one; an end an earlier driver told is remembered."""
        self.looked_up.add(trial_id)
        number = self.trials[trial_id]
        paused = self._frozen(number)
        if paused.state.is_finished() and INTERRUPTED_ATTR not in paused.user_attrs:
            self.told.add(trial_id)
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
        new_id = self.storage.create_new_trial(self.study_id, template_trial=template)
        number = self.storage.get_trial_number_from_id(new_id)
        self.trials[trial_id], self.ids[number] = number, new_id

    # ------------------------------------------------------------------ repeats

    def _own_trials(self) -> list[optuna.trial.FrozenTrial]:
        """The study's trials of this search (its ``--resume`` included), answered repeats
        aside. A later search of the same study trains its configurations again: it is run
        to check them again (another seed policy, changed code), and must have results."""
        return [
            t
            for t in self.study.get_trials(deepcopy=False)
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
            directions=self.study.directions,
        )
        for _ in range(draws):
            trial = scratch.ask()
            self.space(trial)  # the define-by-run function samples every key
            if trial.params not in run:
                return dict(trial.params)
        return None

    def _same_configuration(self, trial: optuna.trial.Trial) -> optuna.trial.FrozenTrial | None:
        """The trial of this search with the same configuration as ``trial``, if any: a
        finished one, or one still training."""
        same = [
            t
            for t in self._own_trials()
            if t.number != trial.number
            and t.params == trial.params
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
            self._answer(repeat.number, original)
        else:
            self.waiting.append((repeat.number, original.number))

    def _answer_waiting(self) -> None:
        """Answer the repeats whose original trial has ended since they were proposed."""
        still = []
        for repeat, original_number in self.waiting:
            if self._frozen(repeat).state.is_finished():
                continue  # closed meanwhile (an interrupted search fails what was running)
            original = self._frozen(original_number)
            if original.state.is_finished():
                self._answer(repeat, original)
            else:
                still.append((repeat, original_number))
        self.waiting = still

    def _answer(self, repeat: int, original: optuna.trial.FrozenTrial) -> None:
        """Tell Optuna trial ``repeat`` ended as ``original`` did: the same state, values,
        intermediate values, metrics and constraints (a fixed seed gives the same run)."""
        trial = self._trial(repeat)
        if len(self.objectives) == 1:
            for step, value in sorted(original.intermediate_values.items()):
                trial.report(value, step)
        for key in (METRICS_ATTR, PRUNED_AT_ATTR, STOPPED_EARLY_ATTR, ERROR_ATTR):
            if key in original.user_attrs:
                trial.set_user_attr(key, original.user_attrs[key])
        for key, value in original.system_attrs.items():
            if key.startswith("constraints:"):  # Trial.set_constraint's keys (Optuna 5)
                trial.set_constraint(key.split(":", 1)[1], value)
        values = original.values if original.state == TrialState.COMPLETE else None
        self._tell(repeat, original.state, values)

    # ------------------------------------------------------------------ the study

    def _claim(self, trial_id: str, trial: optuna.trial.Trial, config: dict) -> dict:
        """``trial`` is Tune trial ``trial_id``'s: noted both ways, its config returned."""
        trial.set_user_attr(TUNE_TRIAL_ATTR, trial_id)
        trial.set_user_attr(CONFIGURATION_ATTR, configuration_key(trial.params))
        self.trials[trial_id] = trial.number
        return config

    def _config(self, trial: optuna.trial.Trial) -> dict[str, Any]:
        """A trial's Tune config: the keys the space samples, plus the derived ones it
        returns (DePT's rank, the trainable count)."""
        derived = self.space(trial) or {}
        return {**trial.params, **derived}

    def _ask(self) -> optuna.trial.Trial:
        """A new trial from the sampler (or the queue: grid points, unrun configurations)."""
        trial = self.study.ask()
        self.handles[trial.number] = trial
        self.reported[trial.number] = set()  # a new trial holds no values: nothing to read
        trial.set_user_attr(PARENT_RUN_ATTR, self.parent_run_id)  # for the dashboard, MLflow
        return trial

    def _trial(self, number: int) -> optuna.trial.Trial:
        """Trial ``number`` as an object that reports and sets attributes: the one asked for,
        or (a trial taken up after a pause) one made from its storage id once."""
        if number not in self.handles:
            self.handles[number] = optuna.trial.Trial(self.study, self._storage_id(number))
        return self.handles[number]

    def _storage_id(self, number: int) -> int:
        """Trial ``number``'s id in the storage, asked once."""
        if number not in self.ids:
            self.ids[number] = storage_id(self.storage, self.study_id, number)
        return self.ids[number]

    def _report(self, number: int, value: float, step: int) -> None:
        """Trial ``number``'s value at ``step``, unless the study holds one for that step: a
        restarted trial (a killed worker, ``--resume``) runs again the steps after the
        checkpoint it continues from, or all of them when it started over, and Optuna keeps
        the first value of a step (it warns at each repeat). The steps held are read from
        the storage once per trial and process, then kept here."""
        steps = self.reported.get(number)
        if steps is None:
            steps = self.reported[number] = set(self._frozen(number).intermediate_values)
        if step in steps:
            return
        self._trial(number).report(value, step)
        steps.add(step)

    def _frozen(self, number: int) -> optuna.trial.FrozenTrial:
        """Trial ``number`` as the storage holds it now."""
        return self.storage.get_trial(self._storage_id(number))

    def _told(self, trial_id: str) -> bool:
        """Whether the study already holds the trial's end: a search whose driver died after
        telling Optuna, but before Tune's last snapshot, re-runs the trial's last steps. Read
        from the storage at the trial's first event in this process (:meth:`_look_up`); this
        process's own tells are added as it makes them."""
        if trial_id not in self.looked_up:
            self._look_up(trial_id)
        return trial_id in self.told

    def _tell(self, number: int, state: TrialState, values: list[float] | None) -> None:
        """Tell the study how trial ``number`` ended. A tell that fails (a storage that
        refuses the write, a trial another process finished meanwhile, a sampler's
        ``after_trial`` raising) does not fail the Tune trial: it trained, and its result,
        MLflow run and checkpoint are right; only the study's record of it is wrong (left
        RUNNING, or another's end). Failing it would throw away a result for a bookkeeping
        error, and going on silently would let the study drift from Tune unseen. So the
        reason is kept (:attr:`untold`, :meth:`untold_trials`) and the search's summary names
        each such trial (:func:`raypeft.search.study.unrecorded_ends` finds the same ones
        from the study after a ``--resume``, whose searcher Tune restores out of reach)."""
        try:
            self.study.tell(
                number, values if values is None or len(values) > 1 else values[0], state=state
            )
        except Exception as exc:  # noqa: BLE001 - whatever it was, the summary names it
            self.untold[number] = _reason(exc)
            logger.warning("Optuna could not record how trial %d ended: %s", number, exc)

    def untold_trials(self) -> dict[int, tuple[str | None, str]]:
        """The trials whose end the study could not record, by Optuna number: ``(Tune trial
        id, or None for a repeat answered without training; why the tell failed)``."""
        tune_ids = {number: trial_id for trial_id, number in self.trials.items()}
        return {n: (tune_ids.get(n), why) for n, why in sorted(self.untold.items())}

    def _record_metrics(self, trial: optuna.trial.Trial, result: dict) -> dict[str, float]:
        """The trial's final metrics (best validation values, efficiency, its step) as a user
        attribute, and its constraint values (what TPE and NSGA-II learn feasibility from)."""
        metrics = {
            k: float(v)
            for k, v in result.items()
            if isinstance(v, (int, float))
            and (k.startswith("best_val_") or k in EFFICIENCY_METRICS)
        }
        metrics["step"] = int(result.get("step", 0))
        trial.set_user_attr(METRICS_ATTR, metrics)
        for name, value in self.constraints.named_values(metrics).items():
            trial.set_constraint(name, value)
        return metrics

    def _note_driver(self) -> None:
        """Name this process in the study as the one running this search (once per process:
        a resumed search is another process), before it asks for trials."""
        driver = this_driver()
        if self.driver != driver:
            self.study.set_user_attr(DRIVER_ATTR + self.parent_run_id, driver)
            self.driver = driver
