"""What a trial run holds in MLflow beside its params, metrics and artefacts: the task's
dataset inputs, the system metrics its worker sampled, and (``tracking.log_models: all``) a
``python_function`` model of its best checkpoint.

:class:`TrialRecordsCallback` runs after :class:`~raypeft.tracking.callback.MLflowTrialCallback`
in Tune's callback list and reads the run ids it created; like it, it writes only from the
Tune driver.
"""

from __future__ import annotations

import logging

from mlflow.entities import DatasetInput, Metric
from ray.tune import Callback
from ray.tune.experiment import Trial

from raypeft.tracking.callback import MLflowTrialCallback, new_step
from raypeft.tracking.datasets import log_dataset_inputs
from raypeft.tracking.models import log_pyfunc_model
from raypeft.tracking.system_metrics import system_metrics
from raypeft.tracking.tags import PYFUNC_ERROR_TAG
from raypeft.training.phases import PhaseTimer, timed_phase
from raypeft.training.result_keys import FAILURE_KEY

log = logging.getLogger(__name__)


class TrialRecordsCallback(Callback):
    """Dataset inputs, system metrics and (optionally) pyfunc models of trial runs."""

    def __init__(
        self,
        tracker: MLflowTrialCallback,
        inputs: list[DatasetInput],
        log_models: str = "best",
    ):
        self.tracker = tracker
        self.inputs = inputs
        self.log_models = log_models
        self._with_inputs: set[str] = set()  # run ids whose dataset inputs are logged
        self._system_steps: dict[str, int] = {}  # trial id -> last step of system metrics
        self.models: dict[str, str] = {}  # trial id -> logged pyfunc model id
        self.phase_s: dict[str, PhaseTimer] = {}  # trial id -> this callback's seconds on it

    def _run_id(self, trial: Trial) -> str | None:
        return self.tracker.run_ids.get(trial.trial_id)

    @timed_phase("mlflow_inputs")
    def on_trial_start(self, iteration: int, trials: list[Trial], trial: Trial, **info):
        run_id = self._run_id(trial)
        if run_id is None or run_id in self._with_inputs:
            return
        self._with_inputs.add(run_id)
        run = self.tracker.client.get_run(run_id)
        if not (run.inputs and run.inputs.dataset_inputs):  # a resumed run has them already
            log_dataset_inputs(self.tracker.client, run_id, self.inputs)

    @timed_phase("mlflow_system")
    def on_trial_result(
        self, iteration: int, trials: list[Trial], trial: Trial, result: dict, **info
    ):
        run_id = self._run_id(trial)
        values = system_metrics(result)
        if run_id is None or not values:
            return
        # a resumed trial may re-run steps its run holds (from a checkpoint older than them)
        self._system_steps.setdefault(
            trial.trial_id, self.tracker.adopted_steps.get(trial.trial_id, -1)
        )
        step = new_step(result, self._system_steps, trial.trial_id)
        if step is None:
            return  # a resumed trial re-running a step its run already holds
        timestamp = int(result.get("timestamp", 0) * 1000)
        metrics = [Metric(k, v, timestamp, step) for k, v in values.items()]
        self.tracker.client.log_batch(run_id, metrics=metrics)

    @timed_phase("mlflow_model")
    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial, **info):
        if self.log_models != "all":
            return
        run_id = self._run_id(trial)
        folder = self.tracker.best_checkpoint_dir(trial.trial_id)
        if run_id is None or folder is None or FAILURE_KEY in (trial.last_result or {}):
            return
        self.models[trial.trial_id] = log_trial_model(
            self.tracker.client, run_id, folder, int(trial.last_result.get("best_step", 0))
        )


def log_trial_model(client, run_id: str, folder, step: int) -> str | None:
    """Log a trial's best checkpoint as a pyfunc model; a failure is tagged on the run (and
    logged), never raised: the search goes on."""
    try:
        return log_pyfunc_model(client, run_id, folder, step=step).model_id
    except Exception as exc:  # a model that cannot be saved or loaded: say so on the run
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:500]
        client.set_tag(run_id, PYFUNC_ERROR_TAG, reason)
        log.warning("run %s: not logged as a pyfunc model: %s", run_id, reason)
        return None
