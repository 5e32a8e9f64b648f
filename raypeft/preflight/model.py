"""Checks before anything starts: the model can be loaded, the stores can be opened, and a
tracking server answers. Each failure is a one-line :class:`ConfigError` naming the key.

The static checks (:func:`check_model_name`, :func:`check_stores`) touch nothing; the
tracking probe (:func:`check_tracking_store`) makes one request, without MLflow's retries.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

from mlflow.tracking import MlflowClient

from raypeft.config.redact import redact_uri
from raypeft.config.schema import ExperimentConfig, ModelConfig
from raypeft.errors import ConfigError

_ALIASES_HINT = "minilm, tiny-bert, tiny-t5, tiny-gpt2, tiny-llama"


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def check_model_name(model: ModelConfig) -> None:
    """``model.name`` is an alias, a local model folder, or a Hugging Face id that can be
    loaded: with ``HF_HUB_OFFLINE`` set it must be in the local cache. Raises ConfigError
    before ``from_pretrained`` would try (and, offline or without a network, wait on) the Hub."""
    from raypeft.modeling.backbones import TINY_CONFIGS

    name = model.name
    if name in TINY_CONFIGS or name == "minilm":
        return
    must = (
        "it must be a local model folder (with config.json), a Hugging Face model id "
        f"(name or org/name) or an alias ({_ALIASES_HINT})"
    )
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise ConfigError(f"model.name: {name}: no config.json in this folder; {must}")
        return
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        if name.startswith(("/", "./", "../", "~", ".\\")):
            raise HFValidationError("a path")
        validate_repo_id(name)
    except HFValidationError:
        raise ConfigError(f"model.name: {name}: no such folder; {must}") from None
    if _env_true("HF_HUB_OFFLINE") or _env_true("TRANSFORMERS_OFFLINE"):
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(name, "config.json", revision=model.revision)
        if not isinstance(cached, str):
            raise ConfigError(
                f"model.name: {name!r} is neither a local folder nor in the Hugging Face cache, "
                f"and HF_HUB_OFFLINE is set; {must} (download it first, or go online)"
            )


def check_stores(cfg: ExperimentConfig) -> None:
    """The MLflow tracking URI and the Optuna storage can be opened: a known scheme, and a
    local sqlite file's folder exists (nothing is created here)."""
    uri = cfg.tracking.uri or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        _check_tracking_uri(uri, "tracking.uri" if cfg.tracking.uri else "MLFLOW_TRACKING_URI")
    if cfg.search.storage:
        _check_sqlite_folder(cfg.search.storage, "search.storage")
        scheme = cfg.search.storage.split(":", 1)[0].split("+", 1)[0].lower()
        if "://" not in cfg.search.storage or scheme not in _SQL_SCHEMES:
            raise ConfigError(
                f"search.storage: {redact_uri(cfg.search.storage)!r} must be a database URL "
                f"({', '.join(sorted(_SQL_SCHEMES))}), e.g. sqlite:///optuna.db"
            )
        _check_sql_driver(cfg.search.storage, "search.storage")


def _check_sql_driver(url: str, key: str) -> None:
    """The database URL parses and its driver is installed (e.g. psycopg2 for postgresql)."""
    from sqlalchemy.engine import make_url

    try:
        make_url(url).get_dialect().import_dbapi()
    except Exception as exc:  # ArgumentError (a bad URL), ModuleNotFoundError (no driver)
        raise ConfigError(
            f"{key}: {redact_uri(url)}: cannot use this database URL "
            f"({type(exc).__name__}: {redact_uri(str(exc)).splitlines()[0][:200]}); it must "
            "parse, and its driver must be installed"
        ) from None


_SQL_SCHEMES = {"sqlite", "postgresql", "mysql", "mssql", "oracle"}


def _check_tracking_uri(uri: str, key: str) -> None:
    from urllib.parse import urlparse

    scheme = urlparse(uri).scheme.lower()
    if len(scheme) == 1:  # a Windows drive letter: a local path
        scheme = ""
    known = {"", "file", "http", "https", "databricks", "databricks-uc", "uc", *_SQL_SCHEMES}
    try:  # MLflow's registry, plugins included
        from mlflow.tracking._tracking_service.utils import _tracking_store_registry

        known |= set(getattr(_tracking_store_registry, "_registry", {}))
    except Exception:  # a private API: the list above is the fallback
        pass
    if scheme not in known and scheme.split("+", 1)[0] not in _SQL_SCHEMES:
        raise ConfigError(
            f"{key}: {redact_uri(uri)!r} has the unknown scheme {scheme!r}; it must be an MLflow "
            "tracking URI (sqlite:///mlflow.db, a folder, file://..., http(s)://..., postgresql://...)"
        )
    if scheme in ("", "file") and not _env_true("MLFLOW_ALLOW_FILE_STORE"):
        raise ConfigError(
            f"{key}: {redact_uri(uri)!r} is MLflow's file store, which MLflow 3 refuses unless "
            "MLFLOW_ALLOW_FILE_STORE=true; it must be a database or server URI "
            "(e.g. sqlite:///mlflow.db)"
        )
    if scheme.split("+", 1)[0] in _SQL_SCHEMES:
        _check_sql_driver(uri, key)
    _check_sqlite_folder(uri, key)


def _check_sqlite_folder(url: str, key: str) -> None:
    if not url.startswith("sqlite:///"):
        return
    db = url[len("sqlite:///") :].split("?", 1)[0]
    if not db or db == ":memory:":
        return
    folder = Path(db).expanduser().parent
    if not folder.is_dir():
        raise ConfigError(
            f"{key}: {redact_uri(url)}: the folder {folder} does not exist; the sqlite file's "
            "folder must exist"
        )


@contextmanager
def _no_retries(timeout_s: int):
    """MLflow's HTTP client retries for minutes by default; a start-up probe must not."""
    names = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": str(timeout_s)}
    saved = {k: os.environ.get(k) for k in names}
    os.environ.update(names)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def check_tracking_store(uri: str, shown_as: str, timeout_s: int = 10) -> None:
    """Fail fast, before any trial, when the tracking store cannot be used.

    An ``http(s)`` server must answer (one request, no retries); a sqlite file's folder must
    exist. ``shown_as`` is the URI as the error shows it (credentials redacted).
    """
    if uri.startswith(("http://", "https://")):
        with _no_retries(timeout_s):
            try:
                MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
            except Exception as exc:  # connection refused, DNS, timeout, HTTP errors
                reason = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
                raise ConfigError(
                    f"tracking.uri {shown_as}: the MLflow tracking server does not answer "
                    f"({type(exc).__name__}{': ' + reason if reason else ''}); start it or "
                    "fix --tracking-uri / tracking.uri"
                ) from None
    elif uri.startswith("sqlite:///"):
        folder = Path(uri[len("sqlite:///") :]).parent
        if not folder.is_dir():
            raise ConfigError(f"tracking.uri {shown_as}: folder {folder} does not exist")
