"""Find a search's records in MLflow: its experiment, parent run, trial runs, trained model.

``report``, ``predict``, ``export`` and ``ui`` read MLflow only (never Ray's result folders),
so they work on any machine that can reach the tracking store. Every lookup failure is a
:class:`~raypeft.config.schema.ConfigError` with a one-line message naming what was not found.
"""

from __future__ import annotations

from pathlib import Path

from mlflow.entities import Experiment, Run, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from raypeft.errors import ConfigError, DamagedArtefact
from raypeft.tracking.stores import database_url, named_tracking_uri
from raypeft.tracking.tags import (
    BEST_RUN_TAG,
    DIGEST_TAG_PREFIX,
    ERROR_TAG,
    INTERRUPTED_TAG,
    RESUMED_AFTER_TAG,
    ROLE_SEARCH,
    ROLE_TAG,
    ROLE_TRIAL,
)
from raypeft.training.checkpoints import MODEL_FILES
from raypeft.training.digests import DIGESTS_FILE, check_digests, read_digests

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"  # MLflow's own default store
MODEL_ARTIFACTS = "model"  # a trial run's best checkpoint
BEST_MODEL_ARTIFACTS = "best_model"  # the parent run's copy of the best trial's checkpoint


def reopen_run(client: MlflowClient, run: Run) -> None:
    """A paused or ended run RUNNING again (a resumed search, a restarted trial). A run the
    search's pause had tagged interrupted is tagged resumed after that signal instead: the
    pause is history, and the run may now finish."""
    run_id = run.info.run_id
    if run.info.status != "RUNNING":
        client.update_run(run_id, status="RUNNING")
    signal_name = run.data.tags.get(INTERRUPTED_TAG)
    if signal_name is not None:
        client.set_tag(run_id, RESUMED_AFTER_TAG, signal_name)
        client.delete_tag(run_id, INTERRUPTED_TAG)


def tracking_uri(uri: str | None = None) -> str:
    """``uri``, else ``$MLFLOW_TRACKING_URI``, else ``sqlite:///mlflow.db``; a
    ``postgresql://`` URI with its driver named (:func:`~raypeft.tracking.stores.database_url`)."""
    named = named_tracking_uri(uri)
    return database_url(named[0] if named else DEFAULT_TRACKING_URI)


def find_experiment(client: MlflowClient, name_or_id: str) -> Experiment:
    """The experiment called ``name_or_id`` (or with that id)."""
    try:
        found = client.get_experiment_by_name(name_or_id)
        if found is None and name_or_id.isdigit():
            found = client.get_experiment(name_or_id)
    except MlflowException:
        found = None
    if found is None or found.lifecycle_stage == "deleted":
        names = sorted(e.name for e in client.search_experiments() if e.name != "Default")
        hint = f"; experiments here: {', '.join(names)}" if names else ""
        raise ConfigError(f"experiment {name_or_id!r}: not found in the MLflow store{hint}")
    return found


def parent_runs(client: MlflowClient, experiment_id: str) -> list[Run]:
    """The experiment's searches (parent runs), newest first."""
    return client.search_runs(
        [experiment_id],
        filter_string=f"tags.`{ROLE_TAG}` = '{ROLE_SEARCH}'",
        order_by=["attributes.start_time DESC"],
    )


def latest_parent_run(client: MlflowClient, experiment: Experiment) -> Run:
    """The newest finished search of the experiment (else the newest of any status)."""
    runs = parent_runs(client, experiment.experiment_id)
    if not runs:
        raise ConfigError(f"experiment {experiment.name!r}: has no raypeft search runs")
    finished = [r for r in runs if r.info.status == "FINISHED"]
    return (finished or runs)[0]


def trial_runs(client: MlflowClient, experiment_id: str, parent_run_id: str) -> list[Run]:
    """Every trial (nested run) of one search."""
    return client.search_runs(
        [experiment_id],
        filter_string=(
            f"tags.mlflow.parentRunId = '{parent_run_id}' and tags.`{ROLE_TAG}` = '{ROLE_TRIAL}'"
        ),
        max_results=50_000,
    )


def get_run(client: MlflowClient, run_id: str) -> Run:
    try:
        return client.get_run(run_id)
    except MlflowException:
        raise ConfigError(f"run {run_id!r}: not found in the MLflow store") from None


def best_trial_run(client: MlflowClient, experiment_name: str) -> Run:
    """The best trial of the experiment's newest finished search."""
    parent = latest_parent_run(client, find_experiment(client, experiment_name))
    run_id = parent.data.tags.get(BEST_RUN_TAG)
    if not run_id:
        raise ConfigError(
            f"experiment {experiment_name!r}: its newest search ({parent.info.run_id}) "
            "recorded no best trial"
        )
    return get_run(client, run_id)


def log_model(client: MlflowClient, run_id: str, folder: Path, artifact_path: str) -> None:
    """Log a checkpoint's model files (best tensors, config, task) and their digests, not its
    resume state; the digests also as tags of the run (``raypeft.sha256.<file>``), so that
    what is downloaded later is checked against what the run recorded.

    A checkpoint whose digests are missing or wrong is not logged: the run's error tag says
    why (a Tune callback must not raise)."""
    try:
        recorded = read_digests(folder)
        check_digests(folder, MODEL_FILES, recorded)
    except DamagedArtefact as damaged:
        client.set_tag(run_id, ERROR_TAG, f"model not logged: {damaged}")
        return
    client.log_batch(
        run_id, tags=[RunTag(DIGEST_TAG_PREFIX + name, recorded[name]) for name in MODEL_FILES]
    )
    for name in (*MODEL_FILES, DIGESTS_FILE):
        client.log_artifact(run_id, str(Path(folder) / name), artifact_path=artifact_path)


def recorded_digests(run: Run) -> dict[str, str]:
    """The digests of the model files a run logged, as its tags recorded them."""
    tags = run.data.tags
    return {
        key.removeprefix(DIGEST_TAG_PREFIX): value
        for key, value in tags.items()
        if key.startswith(DIGEST_TAG_PREFIX)
    }


def download_model(client: MlflowClient, run: Run, dst: Path) -> Path:
    """The trained artefacts of a trial run (or of a search's best model) as a local folder,
    each file checked against the digest the run recorded (DamagedArtefact naming the run
    and the file when one is missing or damaged)."""
    role = run.data.tags.get(ROLE_TAG)
    path = BEST_MODEL_ARTIFACTS if role == ROLE_SEARCH else MODEL_ARTIFACTS
    try:
        local = client.download_artifacts(run.info.run_id, path, str(dst))
    except (MlflowException, OSError):
        raise ConfigError(
            f"run {run.info.run_id}: has no trained artefacts under {path}/ "
            "(a failed trial, or not a raypeft run)"
        ) from None
    folder = Path(local)
    try:
        recorded = recorded_digests(run)
        recorder = f"run {run.info.run_id}" if recorded else None
        check_digests(folder, MODEL_FILES, recorded or None, recorder)
    except DamagedArtefact as damaged:
        raise damaged.located(f"run {run.info.run_id}: {path}") from None
    return folder
