"""A finished search over a discrete space, read back as a table of learning curves.

Per configuration and seed: the validation loss and the task metric at every evaluation, and
the trial's wall time at each (what paces a replay). Everything is read from the search's
records, nothing from a second format: the Optuna study gives each trial's typed parameters
and its end, the MLflow trial runs give the metric histories and the seed, the search's
parent run gives the experiment file it ran. :meth:`CurveTable.save` writes the compact form
(JSON, a few tens of kB) that ``raypeft simulate`` replays against.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState

from raypeft.config.loading import validate_experiment
from raypeft.config.redact import REDACTED
from raypeft.config.schema import ExperimentConfig
from raypeft.config.space import SEED_KEY, configuration_key
from raypeft.data.tasks import resolve_task_spec
from raypeft.errors import ConfigError
from raypeft.methods import BackboneDims
from raypeft.search.study import (
    PARENT_RUN_ATTR,
    STOPPED_EARLY_ATTR,
    TUNE_TRIAL_ATTR,
    open_storage,
)
from raypeft.tracking.runs import find_experiment, get_run, latest_parent_run, trial_runs
from raypeft.tracking.stores import check_store, search_storage_url
from raypeft.tracking.tags import OPTUNA_STUDY_TAG, TRIAL_ID_TAG
from raypeft.training.evaluation import TargetMetric
from raypeft.training.result_keys import PRECISION_PARAM

TABLE_FORMAT = "raypeft.curves/1"
WALL_METRIC = "wall_time_s"  # the trial's seconds since it started, logged at each evaluation


@dataclass(frozen=True)
class Curve:
    """One trial that ran to its end: a configuration at one seed, value by evaluation."""

    params: dict[str, Any]  # the searched values, train.seed left out
    seed: int
    steps: list[int]
    values: dict[str, list[float]]  # "val_loss", "val_<metric>" -> one value per step
    wall_s: list[float]  # seconds since the trial started, at each step

    @property
    def configuration(self) -> str:
        return configuration_key(self.params)


@dataclass
class CurveTable:
    """Learning curves of one search, with what is needed to replay searches against them."""

    experiment: dict[str, Any]  # the experiment file the search ran (JSON form)
    metric: str  # the metric that kept each trial's checkpoint (val_<metric> in its values)
    mode: str  # its direction: "max" or "min"
    dims: dict[str, Any]  # the backbone's shapes (DePT's rank is derived from them)
    curves: list[Curve]
    source: dict[str, Any] = field(default_factory=dict)  # where and when it was read

    @property
    def config(self) -> ExperimentConfig:
        return ExperimentConfig.model_validate(self.experiment)

    @property
    def backbone(self) -> BackboneDims:
        return BackboneDims(**self.dims)

    def space(self) -> dict[str, list[Any]]:
        """Each searched key (train.seed aside) and the values the curves hold, sorted."""
        keys = sorted({k for c in self.curves for k in c.params})
        return {k: sorted({c.params[k] for c in self.curves if k in c.params}) for k in keys}

    def concurrency(self) -> int:
        """How many trials the recording ran at once (at most): a replay's default."""
        return int(self.source.get("concurrency", 1))

    def seeds(self) -> list[int]:
        return sorted({c.seed for c in self.curves})

    def by_configuration(self) -> dict[str, list[Curve]]:
        """The curves of each configuration (one per seed), in the table's order."""
        groups: dict[str, list[Curve]] = {}
        for curve in self.curves:
            groups.setdefault(curve.configuration, []).append(curve)
        return groups

    def curve(self, configuration: str, seed: int) -> Curve:
        """The curve of ``configuration`` at ``seed``."""
        for candidate in self.curves:
            if candidate.seed == seed and candidate.configuration == configuration:
                return candidate
        raise KeyError(f"{configuration} at seed {seed}")

    def save(self, path: Path) -> None:
        data = {
            "format": TABLE_FORMAT,
            "source": self.source,
            "metric": self.metric,
            "mode": self.mode,
            "dims": self.dims,
            "experiment": self.experiment,
            "curves": [dataclasses.asdict(c) for c in self.curves],
        }
        Path(path).write_text(json.dumps(data, separators=(",", ":")) + "\n")

    @classmethod
    def load(cls, path: Path) -> CurveTable:
        """A table :meth:`save` wrote; a damaged or foreign file is a one-line error."""
        try:
            data = json.loads(Path(path).read_text())
            if data.get("format") != TABLE_FORMAT:
                raise ValueError(f"format is {data.get('format')!r}, not {TABLE_FORMAT!r}")
            curves = [Curve(**c) for c in data["curves"]]
            return cls(
                data["experiment"],
                data["metric"],
                data["mode"],
                data["dims"],
                curves,
                data.get("source", {}),
            )
        except FileNotFoundError:
            raise ConfigError(f"{path}: no such table file") from None
        except (ValueError, KeyError, TypeError) as err:
            raise ConfigError(f"{path}: not a learning-curve table ({err})") from None


def read_table(
    tracking_uri: str, experiment: str, run_id: str | None = None, storage: str | None = None
) -> CurveTable:
    """The learning curves of a finished search (``run_id``, else the experiment's newest):
    every trial that ran to its end, with its seed and its values at each evaluation.
    ``storage``: the search's Optuna storage, where the logged ``search.storage`` will not do
    (its password is never logged)."""
    check_store(tracking_uri)  # reading must never create an empty store
    client = MlflowClient(tracking_uri)
    found = find_experiment(client, experiment)
    parent = get_run(client, run_id) if run_id else latest_parent_run(client, found)
    cfg = search_config(client, parent.info.run_id)
    _require_discrete(cfg)
    finished = full_length_trials(cfg, tracking_uri, parent, storage)
    runs = {
        r.data.tags.get(TRIAL_ID_TAG): r
        for r in trial_runs(client, found.experiment_id, parent.info.run_id)
    }
    target = TargetMetric.of(cfg, resolve_task_spec(cfg.task).primary_metric)
    curves = [
        _curve(client, runs[tune_id], params, target.name)
        for tune_id, params in finished.items()
        if tune_id in runs
    ]
    if not curves:
        raise ConfigError(
            f"experiment {experiment!r}: search {parent.info.run_id} has no trial that ran "
            "to its end"
        )
    return CurveTable(
        experiment=cfg.model_dump(mode="json"),
        metric=target.name,
        mode=target.mode,
        dims=dataclasses.asdict(_dims(cfg)),
        curves=curves,
        source={
            "experiment": experiment,
            "search_run_id": parent.info.run_id,
            "read_on": datetime.date.today().isoformat(),
            "trials_left_out": len(finished) - len(curves),
            "concurrency": most_at_once(list(runs.values())),
            "precision": resolved_precision(runs[t] for t in finished if t in runs),
        },
    )


def resolved_precision(runs) -> str | None:
    """What the trials' ``train.precision`` resolved to on their devices (``auto`` depends on
    the machine: a real run meant to repeat the recording sets it), comma-separated if they
    differed; None for records older than the param."""
    found = sorted(
        {r.data.params[PRECISION_PARAM] for r in runs if PRECISION_PARAM in r.data.params}
    )
    return ",".join(found) or None


def search_config(client: MlflowClient, parent_run_id: str) -> ExperimentConfig:
    """The experiment file the search ran, as its parent run logged it."""
    with tempfile.TemporaryDirectory() as folder:
        try:
            path = client.download_artifacts(parent_run_id, "experiment.yaml", folder)
        except Exception:  # noqa: BLE001 - MLflow raises several kinds for a missing file
            raise ConfigError(
                f"run {parent_run_id}: has no experiment.yaml artifact (not a raypeft search)"
            ) from None
        import yaml  # why: only the table reader parses the logged file

        return validate_experiment(yaml.safe_load(Path(path).read_text()), path)


def full_length_trials(
    cfg: ExperimentConfig, tracking_uri: str, parent, storage: str | None = None
) -> dict[str, dict[str, Any]]:
    """Tune trial id -> typed parameters, for the study's trials of this search that ran to
    their end (COMPLETE, not stopped early). The study is in ``storage``, else in the
    search's logged ``search.storage`` (else where :func:`search_storage_url` puts it)."""
    storage_url = storage or search_storage_url(cfg, tracking_uri)
    if storage is None and REDACTED in storage_url:
        raise ConfigError(
            f"search.storage: the search logged its Optuna storage without its password "
            f"({storage_url}); give the URL with --storage"
        )
    study_name = parent.data.tags.get(OPTUNA_STUDY_TAG) or cfg.search.study_name or cfg.name
    study = optuna.load_study(study_name=study_name, storage=open_storage(storage_url))
    return {
        t.user_attrs[TUNE_TRIAL_ATTR]: t.params
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if t.user_attrs.get(PARENT_RUN_ATTR) == parent.info.run_id
        and STOPPED_EARLY_ATTR not in t.user_attrs
        and TUNE_TRIAL_ATTR in t.user_attrs
    }


def _dims(cfg: ExperimentConfig) -> BackboneDims:
    from raypeft.modeling.backbones import backbone_dims, load_config  # why: transformers

    config = load_config(cfg.model, 2, "classification")
    return backbone_dims(config, cfg.model.max_length, cfg.model.name)


def most_at_once(runs) -> int:
    """The most trial runs that were open at the same moment (from their start and end)."""
    edges = sorted(
        [(r.info.start_time, 1) for r in runs]
        + [(r.info.end_time, -1) for r in runs if r.info.end_time]
    )
    most = now = 0
    for _, change in edges:
        now += change
        most = max(most, now)
    return max(most, 1)


def _require_discrete(cfg: ExperimentConfig) -> None:
    for key, entry in cfg.space.items():
        if entry.listed() is None:
            raise ConfigError(
                f"space.{key}: a range; a learning-curve table needs a search over listed "
                "values (grid or choice) only"
            )


def _curve(client: MlflowClient, run, params: dict[str, Any], metric: str) -> Curve:
    """One trial's curve from its MLflow run's metric histories (one point per step)."""
    histories = {
        name: _by_step(client.get_metric_history(run.info.run_id, name))
        for name in dict.fromkeys(["val_loss", f"val_{metric}", WALL_METRIC])
    }
    steps = sorted(set.intersection(*(set(h) for h in histories.values())))
    seed = int(params.get(SEED_KEY, run.data.params.get(SEED_KEY, 0)))
    return Curve(
        params={k: v for k, v in params.items() if k != SEED_KEY},
        seed=seed,
        steps=steps,
        values={
            name: [h[s] for s in steps] for name, h in histories.items() if name != WALL_METRIC
        },
        wall_s=continuous_clock([histories[WALL_METRIC][s] for s in steps]),
    )


def continuous_clock(walls: list[float]) -> list[float]:
    """A trial's seconds at each evaluation over every process that ran it. Until 2026-11-26 a
    resumed trial's ``wall_time_s`` started again at 0 in its new process (9 of the 144 SUBJ
    DePT trials, recorded over several sessions): a drop marks such a restart, and the new
    process's seconds are added to where the trial stood. Trials that never restarted, and
    those recorded since (their clock goes on from the checkpoint's), are left as they are."""
    out: list[float] = []
    offset = 0.0
    for wall in walls:
        if out and wall + offset < out[-1]:
            offset = out[-1]
        out.append(wall + offset)
    return out


def _by_step(history) -> dict[int, float]:
    """A metric history as step -> value (a resumed trial's repeated step: the last)."""
    ordered = sorted(history, key=lambda m: (m.step, m.timestamp))
    return {m.step: m.value for m in ordered}
