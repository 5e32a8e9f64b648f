"""Can the stores a search records into be used? The MLflow tracking store and Optuna's storage,
each failing with a one-line :class:`ConfigError` that names the key.

- :func:`check_stores` (before anything starts, touches nothing): the tracking URI has a
  scheme MLflow knows, a sqlite file's folder exists, a database URL parses and its driver is
  installed; the same for ``search.storage``.
- :func:`check_tracking_store` (one request): an ``http(s)`` tracking server or a database
  server answers.
- :func:`check_store` (for commands that read a finished search): a database URL's driver is
  installed and its server answers, a local sqlite store exists (reading never creates an
  empty one).
"""

from __future__ import annotations

from urllib.parse import urlparse

from raypeft.config.environment import env_flag
from raypeft.config.redact import redact_uri
from raypeft.config.schema import ExperimentConfig
from raypeft.errors import ConfigError
from raypeft.tracking.stores.environment import named_tracking_uri, no_retries, search_storage
from raypeft.tracking.stores.urls import (
    SQL_SCHEMES,
    database_scheme,
    database_server,
    database_url,
    sqlite_file,
)

# What to install for a database driver SQLAlchemy could not import (by its module's name).
DRIVER_PACKAGES = {
    "psycopg": '"psycopg[binary]"',
    "psycopg2": "psycopg2-binary",
    "pymysql": "pymysql",
    "MySQLdb": "mysqlclient",
}


def check_stores(cfg: ExperimentConfig) -> None:
    """The MLflow tracking URI and the Optuna storage can be opened: a known scheme, and a
    local sqlite file's folder exists (nothing is created here)."""
    if named := named_tracking_uri(cfg.tracking.uri):
        check_tracking_uri(*named)
    if named := search_storage(cfg):
        check_optuna_storage(*named)


def check_optuna_storage(url: str, key: str) -> None:
    """An Optuna storage URL: a database URL whose driver is installed."""
    _check_sqlite_folder(url, key)
    scheme = database_scheme(url)
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
    if scheme in ("", "file") and not env_flag("MLFLOW_ALLOW_FILE_STORE"):
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
    """The database URL parses and its driver is installed (psycopg for postgresql)."""
    from sqlalchemy.engine import make_url  # why: sqlalchemy only when a database URL is given

    try:
        make_url(database_url(url)).get_dialect().import_dbapi()
    except ModuleNotFoundError as exc:
        package = DRIVER_PACKAGES.get(exc.name or "", exc.name)
        raise ConfigError(
            f"{key}: {redact_uri(url)}: its database driver {exc.name!r} is not installed; "
            f"it must be (pip install {package})"
        ) from None
    except Exception as exc:  # ArgumentError (a bad URL), ImportError (a broken driver)
        raise ConfigError(
            f"{key}: {redact_uri(url)}: cannot use this database URL "
            f"({type(exc).__name__}: {redact_uri(str(exc)).splitlines()[0][:200]}); it must "
            "parse, and its driver must be installed"
        ) from None


def _check_sqlite_folder(url: str, key: str) -> None:
    path = sqlite_file(url)
    if path is None:
        return
    folder = path.parent
    if not folder.is_dir():
        raise ConfigError(
            f"{key}: {redact_uri(url)}: the folder {folder} does not exist; the sqlite file's "
            "folder must exist"
        )


def check_database_answers(url: str, key: str, timeout_s: int = 10) -> None:
    """A database server's URL: its driver is installed and the server accepts one
    connection within ``timeout_s`` (MLflow would retry a refused one for most of an hour)."""
    _check_sql_driver(url, key)
    from sqlalchemy import create_engine  # why: sqlalchemy only when a database URL is given

    engine = create_engine(database_url(url), connect_args=_connect_timeout(url, timeout_s))
    try:
        with engine.connect():
            pass
    except Exception as exc:  # refused, unknown host, authentication, missing database
        raise ConfigError(
            f"{key}: {redact_uri(url)}: the database does not answer "
            f"({type(exc).__name__}: {_first_line(exc)}); start it or fix the URL"
        ) from None
    finally:
        engine.dispose()


def _connect_timeout(url: str, timeout_s: int) -> dict[str, int]:
    """The driver's own connection timeout: psycopg, psycopg2 and the MySQL drivers all
    call it ``connect_timeout``; others wait as long as they wait."""
    scheme = database_scheme(url)
    return {"connect_timeout": timeout_s} if scheme in ("postgresql", "mysql") else {}


def _first_line(exc: Exception) -> str:
    """The first line of an error, redacted and cut (SQLAlchemy appends a long background)."""
    text = str(getattr(exc, "orig", None) or exc).strip()
    return redact_uri(text.splitlines()[0])[:200] if text else type(exc).__name__


def check_tracking_store(uri: str, shown_as: str, timeout_s: int = 10) -> None:
    """Fail fast, before any trial, when the tracking store cannot be used.

    An ``http(s)`` server must answer (one request, no retries), and so must a database
    server (one connection); a sqlite file's folder must exist. ``shown_as`` is the URI as the
    error shows it (credentials redacted).
    """
    if database_server(uri):
        check_database_answers(uri, "tracking.uri", timeout_s)
    if uri.startswith(("http://", "https://")):
        from mlflow.tracking import MlflowClient  # why: MLflow only for a server to probe

        with no_retries(timeout_s):
            try:
                MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
            except Exception as exc:  # connection refused, DNS, timeout, HTTP errors
                reason = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
                raise ConfigError(
                    f"tracking.uri {shown_as}: the MLflow tracking server does not answer "
                    f"({type(exc).__name__}{': ' + reason if reason else ''}); start it or "
                    "fix --tracking-uri / tracking.uri"
                ) from None
    elif (path := sqlite_file(uri)) is not None:
        folder = path.parent
        if not folder.is_dir():
            raise ConfigError(f"tracking.uri {shown_as}: folder {folder} does not exist")


def check_store(uri: str, key: str = "--tracking-uri") -> None:
    """A store to read must be usable: a database server's driver is installed and the
    server answers (in seconds, one line if not), a local sqlite store exists (reading must
    never create an empty one). ``key`` is where the URI came from, as errors name it."""
    if database_server(uri):
        check_database_answers(uri, key)
    path = sqlite_file(uri, absolute=False)  # shown as the user wrote it
    if path is not None:
        if not path.is_file():
            raise ConfigError(
                f"{path}: no MLflow store here (run a search first, or give --tracking-uri)"
            )
