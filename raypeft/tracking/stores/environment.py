"""What the environment says about the stores, and what raypeft says to MLflow through it: the
stores environment variables name, the default Optuna storage, and MLflow's HTTP settings
(how often and how long its client retries)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from raypeft.config.schema import ExperimentConfig
from raypeft.tracking.stores.urls import sqlite_file

# A cluster names its shared Optuna database once, for the head's job drivers alone (cluster/
# node.sh keeps it in the head's secrets file, which raypeft.config.secrets_file loads): the
# default of ``search.storage``.
SEARCH_STORAGE_ENV = "RAYPEFT_SEARCH_STORAGE"


def search_storage(cfg: ExperimentConfig) -> tuple[str, str] | None:
    """The Optuna storage a search names and the key that names it: ``search.storage``, else
    ``$RAYPEFT_SEARCH_STORAGE``; None when neither does (the default beside the MLflow store)."""
    if cfg.search.storage:
        return cfg.search.storage, "search.storage"
    if os.environ.get(SEARCH_STORAGE_ENV):
        return os.environ[SEARCH_STORAGE_ENV], SEARCH_STORAGE_ENV
    return None


def search_storage_url(cfg: ExperimentConfig, tracking_uri: str) -> str:
    """The Optuna storage of a search: the one it names (:func:`search_storage`), else
    ``optuna.db`` beside a local sqlite MLflow store, else in the working directory."""
    if named := search_storage(cfg):
        return named[0]
    store = sqlite_file(tracking_uri)
    path = store.parent / "optuna.db" if store is not None else Path("optuna.db").resolve()
    return f"sqlite:///{path}"


def named_tracking_uri(uri: str | None) -> tuple[str, str] | None:
    """The MLflow tracking URI ``tracking.uri`` (``uri``) or else ``$MLFLOW_TRACKING_URI``
    sets, with the key that set it; None when neither does (MLflow's default store)."""
    if uri:
        return uri, "tracking.uri"
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"], "MLFLOW_TRACKING_URI"
    return None


@contextmanager
def _mlflow_env(settings: dict[str, str]) -> Iterator[None]:
    """MLflow's HTTP settings for the calls inside (MLflow reads them at each request)."""
    saved = {k: os.environ.get(k) for k in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def no_retries(timeout_s: int):
    """MLflow's HTTP client retries for minutes by default; a start-up probe must not."""
    return _mlflow_env(
        {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": str(timeout_s)}
    )


# While a search records: MLflow's HTTP client retries 7 times over about 4 minutes by
# default, and waits 120 s for an answer. A search gives up within seconds on a server that
# refuses connections, and within about two minutes on one that hangs. Values the user set in
# the environment are kept.
FAIL_FAST = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "3",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",  # 1 + 2 + 4 s between the attempts
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
}
