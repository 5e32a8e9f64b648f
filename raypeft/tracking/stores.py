"""Can the stores a search records into be used? The MLflow tracking store and Optuna's storage.

Three checks, each failing with a one-line :class:`ConfigError` that names the key:

- :func:`check_stores` (before anything starts, touches nothing): the tracking URI has a
  scheme MLflow knows, a sqlite file's folder exists, a database URL parses and its driver is
  installed; the same for ``search.storage``.
- :func:`check_tracking_store` (one request): an ``http(s)`` tracking server answers.
- :func:`check_store` (for commands that read a finished search): a local sqlite store
  exists, so that reading never creates an empty one.

MLflow is imported inside the functions that use it: ``raypeft validate`` and the CLI's
start-up stay fast.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse

from raypeft.config.redact import redact_uri
from raypeft.config.schema import ExperimentConfig
from raypeft.errors import ConfigError

# Database schemes SQLAlchemy (MLflow's and Optuna's database stores) can open.
SQL_SCHEMES = {"sqlite", "postgresql", "mysql", "mssql", "oracle"}


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def check_stores(cfg: ExperimentConfig) -> None:
    """The MLflow tracking URI and the Optuna storage can be opened: a known scheme, and a
    local sqlite file's folder exists (nothing is created here)."""
    uri = cfg.tracking.uri or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        check_tracking_uri(uri, "tracking.uri" if cfg.tracking.uri else "MLFLOW_TRACKING_URI")
    if cfg.search.storage:
        check_optuna_storage(cfg.search.storage, "search.storage")


def check_optuna_storage(url: str, key: str) -> None:
    """An Optuna storage URL: a database URL whose driver is installed."""
    _check_sqlite_folder(url, key)
    scheme = url.split(":", 1)[0].split("+", 1)[0].lower()
    if "://" not in url or scheme not in SQL_SCHEMES:
        raise ConfigError(
            f"{key}: {redact_uri(url)!r} must be a database URL "
            f"({', '.join(sorted(SQL_SCHEMES))}), e.g. sqlite:///optuna.db"
        )
    _check_sql_driver(url, key)


def check_tracking_uri(uri: str, key: str) -> None:
    """An MLflow tracking URI: a scheme MLflow knows, not the file store MLflow 3 refuses,
    and for a database its driver and (sqlite) its folder."""
    scheme = urlparse(uri).scheme.lower()
    if len(scheme) == 1:  # a Windows drive letter: a local path
        scheme = ""
    if scheme not in _known_tracking_schemes() and scheme.split("+", 1)[0] not in SQL_SCHEMES:
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
    if scheme.split("+", 1)[0] in SQL_SCHEMES:
        _check_sql_driver(uri, key)
    _check_sqlite_folder(uri, key)


def _known_tracking_schemes() -> set[str]:
    known = {"", "file", "http", "https", "databricks", "databricks-uc", "uc", *SQL_SCHEMES}
    try:  # MLflow's registry, plugins included (a private API: the set above is the fallback)
        from mlflow.tracking._tracking_service.utils import _tracking_store_registry

        known |= set(getattr(_tracking_store_registry, "_registry", {}))
    except Exception:
        pass
    return known


def _check_sql_driver(url: str, key: str) -> None:
    """The database URL parses and its driver is installed (e.g. psycopg2 for postgresql)."""
    from sqlalchemy.engine import make_url  # why: sqlalchemy only when a database URL is given

    try:
        make_url(url).get_dialect().import_dbapi()
    except Exception as exc:  # ArgumentError (a bad URL), ModuleNotFoundError (no driver)
        raise ConfigError(
            f"{key}: {redact_uri(url)}: cannot use this database URL "
            f"({type(exc).__name__}: {redact_uri(str(exc)).splitlines()[0][:200]}); it must "
            "parse, and its driver must be installed"
        ) from None


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
        from mlflow.tracking import MlflowClient  # why: MLflow only for a server to probe

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


def check_store(uri: str) -> None:
    """A local sqlite store must exist: reading must never create an empty one."""
    if uri.startswith("sqlite:///"):
        path = Path(uri[len("sqlite:///") :])
        if not path.is_file():
            raise ConfigError(
                f"{path}: no MLflow store here (run a search first, or give --tracking-uri)"
            )
