"""MLflow tracking: one nested child run per trial, under the search's parent run
(:mod:`raypeft.tracking.parent_run`).

All writes happen on the Tune driver (a Tune callback), so there is a single writer per
store: sqlite files stay consistent, and trials need no MLflow credentials.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID, MLFLOW_RUN_NOTE
from ray.tune import Callback
from ray.tune.experiment import Trial

from raypeft.config.dotted import flatten
from raypeft.config.redact import redact_uri
from raypeft.config.schema import EFFICIENCY_METRICS, REPEAT_OF, ExperimentConfig, trial_config
from raypeft.methods import BackboneDims
from raypeft.tracking.parent_run import log_params, param_text
from raypeft.tracking.runs import MODEL_ARTIFACTS, log_model, reopen_run
from raypeft.tracking.tags import (
    CONFIGURATION_TAG,
    ERROR_TAG,
    INTERRUPTED_TAG,
    METHOD_TAG,
    REPEAT_OF_TAG,
    RESTARTS_TAG,
    ROLE_REPEAT,
    ROLE_TAG,
    ROLE_TRIAL,
    STOPPED_EARLY_TAG,
    TRIAL_ID_TAG,
    result_tag,
)
from raypeft.tracking.trial_checkpoints import checkpoint_dir
from raypeft.training.checkpoints import intact_checkpoint
from raypeft.training.phases import PhaseTimer, timed_phase
from raypeft.training.result_keys import (
    FAILURE_KEY,
    PACK_ID_KEY,
    PACK_PADDING_KEY,
    PACK_SIZE_KEY,
    PRECISION_KEY,
    PRECISION_PARAM,
    RESTARTED_KEY,
    RESUMED_KEY,
    TRIAL_STEPS_KEY,
    WORKER_KEYS,
    ran_to_end,
)


def numeric_metrics(result: dict[str, Any]) -> dict[str, float]:
    """The training metrics of a Tune result (Tune's own bookkeeping keys left out)."""
    keep = ("val_", "best_val_", "train_", "test_")
    packed = (PACK_SIZE_KEY, PACK_PADDING_KEY)  # a packed trial's pack, at each evaluation
    return {
        k: float(v)
        for k, v in result.items()
        if (k.startswith(keep) or k in EFFICIENCY_METRICS or k in packed)
        and isinstance(v, (int, float))
        and math.isfinite(v)
    }


def new_step(result: dict[str, Any], logged: dict[str, int], trial_id: str) -> int | None:
    """The step of a trial's result, recorded in ``logged`` (trial id -> last step); None when
    the run already holds it (a resumed trial re-runs the steps after its checkpoint)."""
    step = int(result.get("step", result.get("training_iteration", 0)))
    if step <= logged.get(trial_id, -1):
        return None
    logged[trial_id] = step
    return step


class MLflowTrialCallback(Callback):
    """Mirror every Tune trial into a nested MLflow run of the experiment's parent run."""

    def __init__(
        self,
        client: MlflowClient,
        experiment_id: str,
        parent_run_id: str,
        base: ExperimentConfig,
        dims: BackboneDims,
        storage: str | None = None,
    ):
        self.client = client
        self.storage = storage  # run.storage_path as resolved: where Ray Train checkpoints
        self.experiment_id = experiment_id
        self.parent_run_id = parent_run_id
        self.base = base
        self.dims = dims  # to log each trial's resolved method (e.g. DePT's derived rank)
        self.run_ids: dict[str, str] = {}
        self.train_checkpoints: dict[str, str] = {}  # trial id -> latest Ray Train checkpoint
        self.tune_checkpoints: dict[str, Any] = {}  # trial id -> its latest Tune checkpoint
        self._worker_tags: dict[str, dict[str, str]] = {}  # trial id -> node/pid last tagged
        self._logged_steps: dict[str, int] = {}  # trial id -> last step logged (resumed runs)
        # trial id -> the last step its run held when this (resumed) search adopted it: what
        # the other callbacks logging per step skip too (Tune's snapshot may be older)
        self.adopted_steps: dict[str, int] = {}
        self._precision_logged: set[str] = set()  # trial ids whose resolved precision is logged
        self._repeats: set[str] = set()  # trial ids of the repeats' runs (search.repeat_best)
        self.phase_s: dict[str, PhaseTimer] = {}  # trial id -> this callback's seconds on it

    def best_checkpoint_dir(self, trial_id: str) -> Path | None:
        """Local folder of the trial's best checkpoint (the latest one it reported), or, where
        that one is damaged or incomplete (a node lost while Tune deleted it), the newest
        intact one beside it: each holds the best model up to its step."""
        folder = checkpoint_dir(
            self.tune_checkpoints.get(trial_id),
            self.train_checkpoints.get(trial_id),
            getattr(self, "storage", None),  # a callback pickled before it had one: local
        )
        if folder is None:
            return None
        usable, _ = intact_checkpoint(folder)
        return usable or folder  # none intact: the reader says what is wrong, in one line

    # Tune saves this with the experiment: a resumed search knows its trials' runs
    def get_state(self) -> dict:
        return {
            "run_ids": self.run_ids,
            "train_checkpoints": self.train_checkpoints,
            "logged_steps": self._logged_steps,
        }

    def set_state(self, state: dict) -> None:
        self.run_ids.update(state.get("run_ids", {}))
        self.train_checkpoints.update(state.get("train_checkpoints", {}))
        for trial_id, step in state.get("logged_steps", {}).items():
            # MLflow (adopt_existing_runs) may already know a later step than Tune's snapshot
            self._logged_steps[trial_id] = max(step, self._logged_steps.get(trial_id, -1))

    def adopt_existing_runs(self) -> None:
        """Resuming a search: map its trials to the child runs MLflow already holds, and note
        the last step each logged, so no run is duplicated and no step logged twice."""
        runs = self.client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.`{MLFLOW_PARENT_RUN_ID}` = '{self.parent_run_id}'",
            max_results=10_000,
        )
        for run in runs:
            trial_id = run.data.tags.get(TRIAL_ID_TAG)
            if not trial_id:
                continue
            self.run_ids[trial_id] = run.info.run_id
            if run.data.tags.get(ROLE_TAG) == ROLE_REPEAT:
                self._repeats.add(trial_id)
            if PRECISION_PARAM in run.data.params:  # params cannot change once logged
                self._precision_logged.add(trial_id)
            history = self.client.get_metric_history(run.info.run_id, "train_loss")
            self._logged_steps[trial_id] = max((m.step for m in history), default=-1)
            self.adopted_steps[trial_id] = self._logged_steps[trial_id]

    def collect_results(
        self, results, repeats: bool = False, reasons: dict[str, str] | None = None
    ) -> None:
        """After the search: every trial's latest checkpoint from Tune's results (a resumed
        search never sees the trials that had finished before it), and no run left RUNNING.

        A run still RUNNING belongs to a trial Tune ended without a callback reaching MLflow,
        or to one started after Tune's last snapshot of an interrupted search (Tune re-ran
        that one as a new trial): it is closed as FAILED or KILLED, with the reason
        (``reasons``: trial id -> why, where the caller knows better than "interrupted").
        ``repeats``: ``results`` are the repeats' experiment; only the repeats' runs are closed
        (and, without it, only the search's trials': a resumed search's interrupted repeats
        continue after the search's experiment is collected).
        """
        ended: dict[str, bool] = {}  # trial id -> failed
        for result in results:
            metrics = result.metrics or {}
            trial_id = metrics.get("trial_id")
            if not trial_id:
                continue
            if result.checkpoint is not None:
                self.tune_checkpoints.setdefault(trial_id, result.checkpoint)
            if metrics.get("checkpoint_path"):
                self.train_checkpoints.setdefault(trial_id, metrics["checkpoint_path"])
            ended[trial_id] = result.error is not None or FAILURE_KEY in metrics
        for trial_id, run_id in self.run_ids.items():
            if (trial_id in self._repeats) != repeats:
                continue  # the other experiment's run
            if self.client.get_run(run_id).info.status != "RUNNING":
                continue
            if trial_id in ended:
                status = "FAILED" if ended[trial_id] else "FINISHED"
                folder = self.best_checkpoint_dir(trial_id)
                if folder is not None and not self.client.list_artifacts(run_id, MODEL_ARTIFACTS):
                    log_model(self.client, run_id, folder, MODEL_ARTIFACTS)
            else:
                status = "KILLED"
                why = (reasons or {}).get(trial_id)
                why = why or "interrupted with the search before Ray Tune recorded it"
                self.client.set_tag(run_id, ERROR_TAG, why)
            self.client.set_terminated(run_id, status)

    def pause_runs(self, signal_name: str) -> tuple[int, list[str]]:
        """A paused search: runs still RUNNING are its interrupted trials, closed KILLED and
        tagged with the signal (``--resume`` opens them again); the others had ended.
        Returns ``(trials ended, interrupted trial ids)``."""
        ended, interrupted = 0, []
        for trial_id, run_id in self.run_ids.items():
            if self.client.get_run(run_id).info.status != "RUNNING":
                ended += 1
                continue
            self.client.set_tag(run_id, INTERRUPTED_TAG, signal_name)
            self.client.set_terminated(run_id, "KILLED")
            interrupted.append(trial_id)
        return ended, interrupted

    def on_trial_recover(self, iteration: int, trials: list[Trial], trial: Trial, **info):
        run_id = self.run_ids.get(trial.trial_id)
        if run_id is not None:  # Ray restarts it from its latest checkpoint
            restarts = trial.run_metadata.num_failures
            self.client.set_tag(run_id, RESTARTS_TAG, str(restarts))

    @timed_phase("mlflow_start")
    def on_trial_start(self, iteration: int, trials: list[Trial], trial: Trial, **info):
        if trial.trial_id in self.run_ids:  # restarted, or resumed with the search
            reopen_run(self.client, self.client.get_run(self.run_ids[trial.trial_id]))
            return
        cfg = trial_config(self.base, trial.config)
        cfg = cfg.model_copy(update={"method": cfg.method.resolve(self.dims)})
        repeat_of = trial.config.get(REPEAT_OF)
        tags = {
            MLFLOW_PARENT_RUN_ID: self.parent_run_id,
            TRIAL_ID_TAG: trial.trial_id,
            ROLE_TAG: ROLE_REPEAT if repeat_of else ROLE_TRIAL,
            METHOD_TAG: cfg.method.name,
            CONFIGURATION_TAG: self.base.configuration_of(trial.config),
        }
        if repeat_of:  # a top configuration trained again with another seed
            tags[REPEAT_OF_TAG] = repeat_of
            self._repeats.add(trial.trial_id)
        run = self.client.create_run(
            self.experiment_id,
            run_name=f"{cfg.method.name}-{trial.trial_id}"
            + (f"-seed{cfg.train.seed}" if repeat_of else ""),
            tags=tags,
        )
        self.run_ids[trial.trial_id] = run.info.run_id
        params = flatten(
            cfg.model_dump(mode="json", exclude={"space", "tracking", "run", "methods"})
        )
        params.update(trial.config)  # the sampled keys and derived.*
        log_params(self.client, run.info.run_id, params)

    @timed_phase("mlflow_result")
    def on_trial_result(
        self, iteration: int, trials: list[Trial], trial: Trial, result: dict, **info
    ):
        if result.get("checkpoint_path"):
            self.train_checkpoints[trial.trial_id] = result["checkpoint_path"]
        run_id = self.run_ids.get(trial.trial_id)
        if run_id is None:
            return
        # one write per result: where the trial trains and its precision (when new) go with
        # the evaluation's metrics (a write per kind cost each trial two more transactions)
        tags = self._new_worker_tags(trial.trial_id, result)
        params = self._precision_param(trial.trial_id, result)
        metrics = []
        if FAILURE_KEY in result:  # the loss diverged: the reason, for the MLflow UI
            tags.append(RunTag(ERROR_TAG, str(result[FAILURE_KEY])[:5000]))
        else:
            step = new_step(result, self._logged_steps, trial.trial_id)
            timestamp = int(result.get("timestamp", 0) * 1000)
            if step is not None:  # None: a resumed trial re-running a step its run holds
                metrics = [
                    Metric(k, v, timestamp, step) for k, v in numeric_metrics(result).items()
                ]
        if tags or params or metrics:
            self.client.log_batch(run_id, metrics=metrics, params=params, tags=tags)

    def _new_worker_tags(self, trial_id: str, result: dict) -> list[RunTag]:
        """Tags of where the trial trains (node id, IP, pid; a packed trial's pack id): at its
        first result, and again when a restart moved it."""
        keys = (*WORKER_KEYS, RESUMED_KEY, RESTARTED_KEY, PACK_ID_KEY)
        where = {k: str(result[k]) for k in keys if k in result}
        if not where or self._worker_tags.get(trial_id) == where:
            return []
        self._worker_tags[trial_id] = where
        return [RunTag(result_tag(k), v) for k, v in where.items()]

    def _precision_param(self, trial_id: str, result: dict) -> list[Param]:
        """The precision the trial resolved ``train.precision`` to, as a param, once."""
        if PRECISION_KEY not in result or trial_id in self._precision_logged:
            return []
        self._precision_logged.add(trial_id)
        return [Param(PRECISION_PARAM, param_text(result[PRECISION_KEY]))]

    @timed_phase("mlflow_end")
    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial, **info):
        run_id = self.run_ids.get(trial.trial_id)
        if run_id is None:
            return
        if trial.checkpoint is not None:
            self.tune_checkpoints[trial.trial_id] = trial.checkpoint
        folder = self.best_checkpoint_dir(trial.trial_id)
        # a diverged trial keeps what it had learnt before, too. A run's model is logged
        # once: a trial that ended after Tune's last snapshot of a lost driver (or head) is
        # run again on --resume from the checkpoint that snapshot named, and the model its
        # first end logged stays as it was (artefacts are never rewritten)
        logged = folder is not None and self.client.list_artifacts(run_id, MODEL_ARTIFACTS)
        if folder is not None and not logged:
            log_model(self.client, run_id, folder, MODEL_ARTIFACTS)
        if FAILURE_KEY in trial.last_result:
            self.client.set_terminated(run_id, "FAILED")
            return
        self._mark_ending(run_id, trial.last_result)
        self.client.set_terminated(run_id, "FINISHED")

    def _mark_ending(self, run_id: str, result: dict) -> None:
        """Whether the trial ran to its end, where the MLflow UI shows it: the tag, the run's
        description and, for a trial stopped early, its name (``dept-1a2b3c4d (stopped early
        at step 400)``): the UI's status is the same green FINISHED either way."""
        stopped_early = not ran_to_end(result)
        step, steps = result.get("step"), result.get(TRIAL_STEPS_KEY)
        tags = [
            RunTag(STOPPED_EARLY_TAG, str(stopped_early).lower()),
            RunTag(MLFLOW_RUN_NOTE, ending_note(stopped_early, step, steps)),
        ]
        self.client.log_batch(run_id, tags=tags)
        if stopped_early and isinstance(step, (int, float)):
            name = self.client.get_run(run_id).info.run_name or ""
            self.client.update_run(run_id, name=stopped_run_name(name, int(step)))

    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial, **info):
        run_id = self.run_ids.get(trial.trial_id)
        if run_id is None:
            return
        error = str(getattr(trial, "error_file", "") or "")
        self.client.set_tag(run_id, ERROR_TAG, redact_uri(_error_summary(trial) or error))
        self.client.set_terminated(run_id, "FAILED")


def stopped_run_name(name: str, step: int) -> str:
    """A stopped-early trial's run name: its name with where it stopped (once)."""
    mark = f" (stopped early at step {step})"
    return name if name.endswith(mark) else name + mark


def ending_note(stopped_early: bool, step: Any, steps: Any) -> str:
    """A finished trial's run description (markdown): how far it trained."""
    of = f" of {steps:g}" if isinstance(steps, (int, float)) else ""
    known = isinstance(step, (int, float))
    if not stopped_early:
        return f"Ran to its end: {step:g}{of} training steps." if known else "Ran to its end."
    at = f" at step {step:g}{of}" if known else ""
    return (
        f"**Stopped early** by the scheduler{at}: its scores are low-fidelity values, from "
        "fewer training steps than a trial that ran to its end."
    )


def _error_summary(trial: Trial) -> str:
    """Last line of the trial's error (e.g. NonFiniteLossError: ...), for the MLflow UI."""
    path = getattr(trial, "error_file", None)
    try:
        text = Path(path).read_text() if path else ""
    except OSError:
        return ""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:5000] if lines else ""
