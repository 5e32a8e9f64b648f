"""The MLflow Model Registry: a search's chosen model as a new version of a registered model,
the ``champion`` alias moved to it only when it beats the champion on the same metric, and
``models:/NAME@alias`` read back for ``raypeft predict`` and ``raypeft export``.

Everything goes through an :class:`MlflowClient` bound to the search's store (no global
tracking URI). A version points at the trial's logged ``python_function`` model (its
``model_id`` and artefact location): registering copies nothing.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from mlflow.entities.model_registry import ModelVersion
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from raypeft.data.metrics import format_metric
from raypeft.errors import ConfigError, DamagedArtefact
from raypeft.tracking import runs
from raypeft.tracking.tags import (
    BACKBONE_TAG,
    EXPERIMENT_TAG,
    METHOD_TAG,
    METRIC_TAG,
    MODE_TAG,
    MODEL_ID_TAG,
    MODEL_VERSIONS_TAG,
    PARAMS_TAG,
    PYFUNC_ARTIFACT,
    ROLE_SEARCH,
    ROLE_TAG,
    RUN_TAG,
    SEARCH_TAG,
    TASK_TAG,
    TEST_VALUE_TAG,
    TRIAL_TAG,
    VALUE_TAG,
)
from raypeft.training.checkpoints import MODEL_FILES
from raypeft.training.digests import check_digests

ALIAS_POLICIES = ("if_better", "always", "never")


@dataclass(frozen=True)
class Candidate:
    """A search's chosen model, as the registry records it."""

    model_id: str  # the logged python_function model
    run_id: str  # its trial run
    trial_id: str
    search_run_id: str  # the search's parent run
    experiment: str
    metric: str
    mode: str
    value: float  # best validation value of the metric
    method: str
    trainable_params: int | None
    task: str
    backbone: str
    test_value: float | None = None

    def tags(self) -> dict[str, str]:
        tags = {
            SEARCH_TAG: self.search_run_id,
            EXPERIMENT_TAG: self.experiment,
            METRIC_TAG: self.metric,
            MODE_TAG: self.mode,
            VALUE_TAG: repr(float(self.value)),
            METHOD_TAG: self.method,
            TASK_TAG: self.task,
            BACKBONE_TAG: self.backbone,
            TRIAL_TAG: self.trial_id,
            RUN_TAG: self.run_id,
        }
        if self.trainable_params is not None:
            tags[PARAMS_TAG] = str(int(self.trainable_params))
        if self.test_value is not None:
            tags[TEST_VALUE_TAG] = repr(float(self.test_value))
        return tags

    def description(self) -> str:
        test = (
            f", test {self.metric} {format_metric(self.test_value)}"
            if self.test_value is not None
            else ""
        )
        return (
            f"raypeft search {self.search_run_id} ({self.experiment}): trial {self.trial_id}, "
            f"{self.method} on {self.backbone} for {self.task}; validation {self.metric} "
            f"{format_metric(self.value)}{test}"
        )


@dataclass
class Registration:
    """What registering did: the new version, and whether the alias moved to it (and why)."""

    name: str
    version: str
    alias: str | None
    alias_moved: bool
    reason: str
    previous: str | None = None  # the version the alias pointed at before
    tags: dict[str, str] = field(default_factory=dict)

    @property
    def uri(self) -> str:
        return f"models:/{self.name}/{self.version}"

    def line(self) -> str:
        """One line for the search summary."""
        where = f"Registered model {self.name!r} version {self.version} ({self.uri})"
        if self.alias is None:
            return where
        if self.alias_moved:
            return f"{where}; alias {self.alias!r} -> version {self.version} ({self.reason})"
        return f"{where}; alias {self.alias!r} stays on version {self.previous} ({self.reason})"

    def names_line(self) -> str | None:
        """What ``predict --experiment`` and ``--model models:/NAME@ALIAS`` each name now."""
        if self.alias is None:
            return None
        alias_uri = f"models:/{self.name}@{self.alias}"
        if self.alias_moved:
            return (
                f"  {alias_uri} and `--experiment` (the newest search's best trial) now name "
                "the same model"
            )
        return (
            f"  {alias_uri} still names version {self.previous} (an earlier search's model); "
            f"`--experiment` names this search's best trial (version {self.version})"
        )


@dataclass
class Published:
    """The chosen model as MLflow knows it after the search: its logged pyfunc model, the
    registry version, or why publishing stopped."""

    model_id: str | None = None
    registration: Registration | None = None
    error: str | None = None

    def lines(self) -> list[str]:
        """Lines for the search summary."""
        out = []
        if self.model_id:
            out.append(f"Model: models:/{self.model_id} (python_function; mlflow models serve)")
        if self.registration is not None:
            out.append(self.registration.line())
            names = self.registration.names_line()
            if names:
                out.append(names)
        if self.error:
            out.append(f"  warning: {self.error}")
        return out


def beats(candidate: Candidate, champion: ModelVersion) -> tuple[bool, str]:
    """Whether ``candidate`` beats the champion version on the same metric, and why (not)."""
    tags = champion.tags or {}
    metric, mode, value = tags.get(METRIC_TAG), tags.get(MODE_TAG), tags.get(VALUE_TAG)
    if metric is None or value is None:
        return False, f"version {champion.version} records no raypeft metric: not comparable"
    if (metric, mode) != (candidate.metric, candidate.mode):
        return False, (
            f"version {champion.version} was chosen on validation {metric} ({mode}), this "
            f"search on {candidate.metric} ({candidate.mode}): not comparable"
        )
    old = float(value)
    new = float(candidate.value)
    better = new > old if candidate.mode == "max" else new < old
    if not math.isfinite(old):
        better = math.isfinite(new)
    verb = "beats" if better else "does not beat"
    return better, (
        f"validation {metric} {format_metric(new)} {verb} {format_metric(old)} "
        f"of version {champion.version}"
    )


def register(
    client: MlflowClient,
    name: str,
    candidate: Candidate,
    *,
    alias: str | None = "champion",
    policy: str = "if_better",
) -> Registration:
    """A new version of ``name`` for the candidate's logged model (the registered model is
    created when missing); the alias moved per ``policy`` (``if_better``, ``always``,
    ``never``)."""
    if policy not in ALIAS_POLICIES:
        raise ValueError(f"policy must be one of {ALIAS_POLICIES}, got {policy!r}")
    try:
        client.create_registered_model(
            name, description="Prompt-based PEFT models chosen by raypeft searches"
        )
    except MlflowException as exc:
        if exc.error_code not in ("RESOURCE_ALREADY_EXISTS", "ALREADY_EXISTS"):
            raise
    tags = candidate.tags()
    # the logged model's own location, not models:/<model_id>: MLflow 3.17's sqlite registry
    # resolves that URI through the process's global tracking URI, not this client's store
    location = client.get_logged_model(candidate.model_id).artifact_location
    version = client.create_model_version(
        name,
        source=location,
        run_id=candidate.run_id,
        tags=tags,
        description=candidate.description(),
        model_id=candidate.model_id,
    )
    _record_version_on_model(client, candidate.model_id, name, version.version)
    result = Registration(name, str(version.version), alias, False, "", tags=tags)
    if alias is None:
        return result
    champion = _version_by_alias(client, name, alias)
    result.previous = str(champion.version) if champion is not None else None
    if policy == "never":
        move, why = False, "tracking.champion_policy: never"
    elif champion is None:
        move, why = True, "the first champion"
    elif policy == "always":
        move, why = True, "tracking.champion_policy: always"
    else:
        move, why = beats(candidate, champion)
    result.alias_moved, result.reason = move, why
    if move:
        client.set_registered_model_alias(name, alias, version.version)
    return result


def _version_by_alias(client: MlflowClient, name: str, alias: str) -> ModelVersion | None:
    try:
        return client.get_model_version_by_alias(name, alias)
    except MlflowException:
        return None


def _record_version_on_model(client: MlflowClient, model_id: str, name: str, version) -> None:
    """The logged model lists its registered versions (as ``mlflow.register_model`` does)."""
    model = client.get_logged_model(model_id)
    versions = json.loads(model.tags.get(MODEL_VERSIONS_TAG) or "[]")
    versions.append({"name": name, "version": str(version)})
    client.set_logged_model_tags(model_id, {MODEL_VERSIONS_TAG: json.dumps(versions)})


# ----------------------------------------------------------------------------- reading back


def parse_model_uri(uri: str) -> tuple[str, str | None, str | None]:
    """``models:/NAME@alias`` -> (NAME, None, alias); ``models:/NAME/3`` -> (NAME, "3", None);
    ``models:/m-<id>`` -> (model id, None, None)."""
    if not uri.startswith("models:/") or len(uri) <= len("models:/"):
        raise ConfigError(
            f"--model {uri}: expected models:/NAME@ALIAS, models:/NAME/VERSION or "
            "models:/<logged model id>"
        )
    rest = uri[len("models:/") :].strip("/")
    if "@" in rest:
        name, alias = rest.rsplit("@", 1)
        return name, None, alias
    if "/" in rest:
        name, version = rest.rsplit("/", 1)
        return name, version, None
    return rest, None, None


def resolve_model_uri(client: MlflowClient, uri: str) -> tuple[str, str]:
    """Where a ``models:/`` URI's artefacts are stored, and the run the model was logged from
    (ConfigError, one line, when the registry has no such model). Resolved through ``client``:
    MLflow's own ``models:/`` download resolves through the process's global tracking URI."""
    name, version, alias = parse_model_uri(uri)
    try:
        if version is None and alias is None:
            model = client.get_logged_model(name)
            return model.artifact_location, model.source_run_id or ""
        found = (
            client.get_model_version_by_alias(name, alias)
            if alias is not None
            else client.get_model_version(name, version)
        )
        location = client.get_model_version_download_uri(name, str(found.version))
    except MlflowException as exc:
        first = (str(exc).strip().splitlines() or ["not found"])[0]
        raise ConfigError(f"--model {uri}: not in the model registry ({first[:200]})") from None
    return location, found.run_id or ""


def source_run_id(client: MlflowClient, uri: str) -> str:
    """The trial run a ``models:/`` URI's model was logged from."""
    return resolve_model_uri(client, uri)[1]


def download_registered(store: str, uri: str, dst: Path) -> tuple[Path, str]:
    """The raypeft model folder inside a registered (or logged) pyfunc model of the store,
    and the run it was logged from."""
    import mlflow.artifacts

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    client = MlflowClient(tracking_uri=store, registry_uri=store)
    location, run_id = resolve_model_uri(client, uri)
    try:
        local = mlflow.artifacts.download_artifacts(
            artifact_uri=f"{location.rstrip('/')}/artifacts/{PYFUNC_ARTIFACT}",
            dst_path=str(dst),
            tracking_uri=store,
        )
    except (MlflowException, OSError) as exc:
        first = (str(exc).strip().splitlines() or ["cannot download"])[0]
        raise ConfigError(f"--model {uri}: not a raypeft model ({first[:200]})") from None
    folder = Path(local)
    if not (folder / "config.yaml").is_file():
        raise ConfigError(f"--model {uri}: not a raypeft model (no artifacts/{PYFUNC_ARTIFACT}/)")
    recorded = _source_run_digests(client, uri, run_id)
    try:
        check_digests(folder, MODEL_FILES, recorded or None, f"run {run_id}" if recorded else None)
    except DamagedArtefact as damaged:
        where = f"model {uri} (logged from run {run_id}): artifacts/{PYFUNC_ARTIFACT}"
        raise damaged.located(where) from None
    return folder, run_id


def _source_run_digests(client: MlflowClient, uri: str, run_id: str) -> dict[str, str]:
    """The digests the model's source run recorded when its trial trained (its
    ``raypeft.sha256.*`` tags): what the model's files are checked against, since a folder
    swapped whole brings a ``digests.json`` that matches it. Empty for a run that recorded
    none (a raypeft from before the tags): the folder's own ``digests.json`` is all there is."""
    if not run_id:
        return {}
    try:
        run = client.get_run(run_id)
    except MlflowException:
        raise ConfigError(
            f"model {uri}: logged from run {run_id}, which is not in the store (its files "
            "cannot be checked against what it trained)"
        ) from None
    return runs.recorded_digests(run)


def logged_model_uri(client: MlflowClient, run_id: str | None, experiment: str | None) -> str:
    """The ``models:/<id>`` URI of the python_function model logged for a trial run, for a
    search run (the model it chose) or for an experiment's newest search (its chosen model)."""
    if experiment is not None:
        search = runs.latest_parent_run(client, runs.find_experiment(client, experiment))
        return _chosen_model_uri(search, f"experiment {experiment!r}: its newest search")
    run = runs.get_run(client, run_id)
    if run.data.tags.get(ROLE_TAG) == ROLE_SEARCH:
        return _chosen_model_uri(run, f"run {run_id}")
    found = client.search_logged_models(
        experiment_ids=[run.info.experiment_id], filter_string=f"source_run_id = '{run_id}'"
    )
    if not found:
        raise ConfigError(
            f"run {run_id}: no python_function model was logged from it (search.log_models: "
            "best logs the chosen trial's only); use --experiment, or log_models: all"
        )
    return f"models:/{found[0].model_id}"


def _chosen_model_uri(search_run, what: str) -> str:
    model_id = search_run.data.tags.get(MODEL_ID_TAG)
    if not model_id:
        raise ConfigError(f"{what} ({search_run.info.run_id}) logged no python_function model")
    return f"models:/{model_id}"
