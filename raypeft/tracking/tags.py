"""The names of the MLflow tags raypeft writes on its runs, and of the roles a run plays.

A search is a parent run tagged ``raypeft.role = experiment``; its trials (and repeats) are
nested runs. Everything that writes or reads these tags (tracking, search, reporting,
serving, the CLI) names them from here.
"""

from __future__ import annotations

PREFIX = "raypeft."  # every raypeft tag starts with it

# ----------------------------------------------------------------------------- every run
ROLE_TAG = "raypeft.role"  # what the run is: one of the ROLE_* values below
METHOD_TAG = "raypeft.method"  # the method's registered name (parent: the experiment's)

ROLE_SEARCH = "experiment"  # the parent run of one search
ROLE_TRIAL = "trial"  # one configuration the search tried
ROLE_REPEAT = "repeat"  # a re-training of a top trial with another seed
ROLE_SIMULATION = "simulation"  # raypeft simulate: one search file replayed against a table

# ----------------------------------------------------------------------------- parent run
SPACE_FILE_TAG = "raypeft.space_file"  # the experiment file the search was started from
METRIC_TAG = "raypeft.metric"  # the metric trials are ranked by
MODE_TAG = "raypeft.mode"  # "max" or "min": the metric's direction
OBJECTIVES_TAG = "raypeft.objectives"  # JSON list of {metric, mode}: a multi-objective search
OPTUNA_STORAGE_TAG = "raypeft.optuna_storage"  # the Optuna study's storage URL (redacted)
OPTUNA_STUDY_TAG = "raypeft.optuna_study"  # the Optuna study's name
# search.repeat_best: the Optuna study of the repeated configurations' seed means, whose best
# trial is the chosen configuration (raypeft.search.seed_means)
OPTUNA_SEED_MEANS_TAG = "raypeft.optuna_seed_means_study"
TUNE_PATH_TAG = "raypeft.tune_path"  # Ray Tune's experiment folder: what --resume restores
CONFIG_HASH_TAG = "raypeft.config_hash"  # hash of the resolved experiment --resume must match
BEST_TRIAL_TAG = "raypeft.best_trial_id"  # the best trial's id (first among equal scores)
BEST_RUN_TAG = "raypeft.best_run_id"  # the best trial's MLflow run id
# a search paused by Ctrl-C or SIGTERM (parent run and its interrupted trials, both KILLED):
# the signal's name; `raypeft tune ... --resume` continues them
INTERRUPTED_TAG = "raypeft.interrupted"
# a run `--resume` took up again: the signal that had paused it (INTERRUPTED_TAG is removed,
# so that a run which then finished is not shown as interrupted)
RESUMED_AFTER_TAG = "raypeft.resumed_after"

# ----------------------------------------------------------------------------- trial runs
TRIAL_ID_TAG = "raypeft.trial_id"  # Ray Tune's trial id
REPEAT_OF_TAG = "raypeft.repeat_of"  # a repeat: the trial id it re-trains
# what the trial trains apart from its seed (ExperimentConfig.configuration_of): the trials of
# one configuration under search.seeds share it (MLflow's "group by" in the runs table)
CONFIGURATION_TAG = "raypeft.configuration"
# the SHA-256 of each model file a run logged (raypeft.sha256.trainable.safetensors), checked
# when the model is downloaded (raypeft.training.digests)
DIGEST_TAG_PREFIX = "raypeft.sha256."
ERROR_TAG = "raypeft.error"  # why the trial failed (one line, credentials redacted)
STOPPED_EARLY_TAG = "raypeft.stopped_early"  # "true" when the scheduler stopped the trial
RESTARTS_TAG = "raypeft.restarts"  # how often Ray restarted the trial after a failure
PARETO_FRONT_TAG = "raypeft.pareto_front"  # "true" on trials of a multi-objective front
# a trial trained in a pack (resources.trials_per_worker > 1): the pack's id (result_tag of
# raypeft.training.result_keys.PACK_ID_KEY); its size and padding waste are metrics
PACK_ID_TAG = "raypeft.pack_id"

# ----------------------------------------------------------------------------- models
PYFUNC_NAME = "pyfunc"  # a trial's logged model (runs:/<trial run id>/pyfunc)
PYFUNC_ARTIFACT = "raypeft_model"  # the raypeft model folder inside it (artifacts/<this>)
PYFUNC_ERROR_TAG = "raypeft.pyfunc_error"  # a trial run whose model could not be logged
MODEL_VERSIONS_TAG = "mlflow.modelVersions"  # a logged model's versions, as MLflow records them
MODEL_ID_TAG = "raypeft.best_model_id"  # the parent run's pointer to the chosen pyfunc model
REGISTERED_TAG = "raypeft.registered_model"  # NAME/VERSION the search registered
PUBLISH_ERROR_TAG = "raypeft.publish_error"  # why the chosen model was not published

# Tags of every registered model version raypeft creates
SEARCH_TAG = "raypeft.search_run_id"  # the search's parent run
EXPERIMENT_TAG = "raypeft.experiment"
VALUE_TAG = "raypeft.metric_value"  # the chosen trial's best validation value of the metric
TEST_VALUE_TAG = "raypeft.test_metric_value"
PARAMS_TAG = "raypeft.trainable_params"
TASK_TAG = "raypeft.task"
BACKBONE_TAG = "raypeft.backbone"
TRIAL_TAG = TRIAL_ID_TAG  # the trial the version was trained by
RUN_TAG = "raypeft.run_id"  # that trial's MLflow run


def result_tag(key: str) -> str:
    """The tag a trial result's key is copied to (where the trial trains: worker node id,
    IP and pid, and the step a resumed trial restarted from), e.g. ``raypeft.worker_pid``."""
    return f"{PREFIX}{key}"
