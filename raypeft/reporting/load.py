"""Reading a search back from MLflow into plain data.

A search is a parent run (``raypeft.role = experiment``) and its nested trial runs (see
:mod:`raypeft.tracking.callback`). :func:`load_search` turns them into a :class:`Search` holding one
:class:`TrialRecord` per trial (tags, params as MLflow's strings, latest metric values and the
score the search ranked trials by), plus what the search optimised: metric, mode, searched
space and, for a multi-objective search, its objectives. A trial's metric history is read only
when asked for (:meth:`Search.history`, used by the learning curves).
"""

from __future__ import annotations

import ast
import json
import math
from dataclasses import dataclass, field
from typing import Any

from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from raypeft.config.space import SPACE_KINDS
from raypeft.errors import ConfigError
from raypeft.tracking.runs import (
    find_experiment,
    get_run,
    latest_parent_run,
    tracking_uri,
    trial_runs,
)
from raypeft.tracking.stores import check_store
from raypeft.tracking.tags import (
    BEST_TRIAL_TAG,
    ERROR_TAG,
    METHOD_TAG,
    METRIC_TAG,
    MODE_TAG,
    OBJECTIVES_TAG,
    ROLE_SEARCH,
    ROLE_TAG,
    STOPPED_EARLY_TAG,
    TRIAL_ID_TAG,
)


@dataclass
class TrialRecord:
    """One trial run: its tags, params (MLflow's strings) and latest metric values."""

    run_id: str
    trial_id: str
    method: str
    status: str
    stopped_early: bool | None
    params: dict[str, str]
    metrics: dict[str, float]
    error: str = ""
    value: float | None = None  # best_val_<metric>: what the search ranked trials by

    def num(self, key: str) -> float | None:
        """The param ``key`` as a number (None when absent or not numeric)."""
        return _number(self.params.get(key))

    @property
    def label(self) -> str:
        return f"{self.trial_id} ({self.method})"


@dataclass
class Search:
    """A search (parent run) of an experiment, with its trials and what it optimised."""

    client: MlflowClient
    experiment: str
    parent: Run
    metric: str | None
    mode: str  # "max" or "min"
    space: dict[str, dict | None]  # searched key -> {kind: args}, None when unreadable
    trials: list[TrialRecord]
    objectives: list[tuple[str, str]] = field(default_factory=list)
    objectives_problem: str = ""  # why a present raypeft.objectives tag was unusable
    best_trial_id: str = ""  # the parent's raypeft.best_trial_id: first among equal scores

    @property
    def parent_id(self) -> str:
        return self.parent.info.run_id

    @property
    def value_key(self) -> str:
        return f"best_val_{self.metric}" if self.metric else "best_val"

    def ranked(self, trials: list[TrialRecord] | None = None) -> list[TrialRecord]:
        """Trials with a score, best first; among equal scores the search's own best trial,
        then by trial id (stable output)."""
        scored = [t for t in (self.trials if trials is None else trials) if t.value is not None]
        sign = -1 if self.mode == "max" else 1
        return sorted(
            scored, key=lambda t: (sign * t.value, t.trial_id != self.best_trial_id, t.trial_id)
        )

    def history(self, trial: TrialRecord, key: str) -> tuple[list[int], list[float]]:
        """Steps and values of the metric ``key`` logged by ``trial``, by step (empty lists
        when it never logged it): one MLflow request, made when asked."""
        found = sorted(self.client.get_metric_history(trial.run_id, key), key=lambda m: m.step)
        return [m.step for m in found], [m.value for m in found]


def load_search(uri: str | None, experiment: str, run_id: str | None = None) -> Search:
    """Read a search from MLflow: ``run_id``'s, else the experiment's newest finished one."""
    uri = tracking_uri(uri)
    check_store(uri)  # reading must never create an empty store
    client = MlflowClient(tracking_uri=uri)
    found = find_experiment(client, experiment)
    if run_id:
        parent = get_run(client, run_id)
        if (
            parent.info.experiment_id != found.experiment_id
            or parent.data.tags.get(ROLE_TAG) != ROLE_SEARCH
        ):
            raise ConfigError(
                f"run {run_id!r}: not a search (parent run) of experiment {found.name!r}"
            )
    else:
        parent = latest_parent_run(client, found)
    trials = [_trial(run) for run in trial_runs(client, found.experiment_id, parent.info.run_id)]
    metric, mode = _metric_and_mode(parent, trials)
    for t in trials:
        value = t.metrics.get(f"best_val_{metric}")
        t.value = value if value is not None and math.isfinite(value) else None
    space = {
        key[len("space.") :]: _space_entry(text)
        for key, text in sorted(parent.data.params.items())
        if key.startswith("space.") and not key.startswith("space.derived.")
    }
    tags = parent.data.tags
    objectives, problem = _objectives(tags.get(OBJECTIVES_TAG))
    best = tags.get(BEST_TRIAL_TAG, "")
    return Search(
        client, found.name, parent, metric, mode, space, trials, objectives, problem, best
    )


def _trial(run: Run) -> TrialRecord:
    tags = run.data.tags
    stopped = tags.get(STOPPED_EARLY_TAG)
    return TrialRecord(
        run_id=run.info.run_id,
        trial_id=tags.get(TRIAL_ID_TAG, run.info.run_id[:8]),
        method=tags.get(METHOD_TAG) or run.data.params.get("method.name", "?"),
        status=run.info.status,
        stopped_early=None if stopped is None else stopped.lower() == "true",
        params=dict(run.data.params),
        metrics=dict(run.data.metrics),
        error=tags.get(ERROR_TAG, ""),
    )


def _metric_and_mode(parent: Run, trials: list[TrialRecord]) -> tuple[str | None, str]:
    """The searched metric: the parent's tag, else its experiment file, else the trials'."""
    tags, params = parent.data.tags, parent.data.params
    metric = tags.get(METRIC_TAG) or _given(params.get("search.metric"))
    if not metric:  # older runs: whatever best_val_* the trials logged, loss last
        found = sorted({k[9:] for t in trials for k in t.metrics if k.startswith("best_val_")})
        metric = next(iter([m for m in found if m != "loss"] + found), None)
    default = "min" if metric and metric.endswith("loss") else "max"
    mode = tags.get(MODE_TAG) or _given(params.get("search.mode")) or default
    return metric, mode


def _given(text: str | None) -> str | None:
    return None if text in (None, "", "None", "null") else text


def _parse(text: str | None) -> Any:
    """A param written as JSON or as a Python repr (older runs), else None."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None


def _space_entry(text: str) -> dict | None:
    """``{'grid': [0.3, 0.5]}`` -> that dict; None unless it has exactly one known kind."""
    entry = _parse(text)
    if isinstance(entry, dict) and len(set(entry) & SPACE_KINDS) == 1:
        return entry
    return None


def _objectives(text: str | None) -> tuple[list[tuple[str, str]], str]:
    """``raypeft.objectives``: ``[{"metric": m, "mode": "max"}, ...]`` (or a list of names)."""
    if not text:
        return [], ""
    items = _parse(text)
    out = []
    for item in items if isinstance(items, list) else [None]:
        if isinstance(item, str):
            item = {"metric": item}
        if not isinstance(item, dict) or not isinstance(item.get("metric"), str):
            return [], f"the parent's raypeft.objectives tag is unreadable: {text[:80]}"
        default = "min" if item["metric"].endswith("loss") else "max"
        out.append((item["metric"], str(item.get("mode") or default)))
    return out, ""


def _number(text: Any) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None
