"""Can the stores a search records into be used? The MLflow tracking store and Optuna's storage.

Three checks, each failing with a one-line :class:`ConfigError` that names the key:

- :func:`check_stores` (before anything starts, touches nothing): the tracking URI has a
  scheme MLflow knows, a sqlite file's folder exists, a database URL parses and its driver is
  installed; the same for ``search.storage``.
- :func:`check_tracking_store` (one request): an ``http(s)`` tracking server or a database
  server answers.
- :func:`check_store` (for commands that read a finished search): a database URL's driver is
  installed and its server answers, a local sqlite store exists (reading never creates an
  empty one).

:func:`database_url` gives ``postgresql://`` its driver: raypeft reads it as
``postgresql+psycopg://`` (psycopg 3, a dependency of raypeft), whatever SQLAlchemy's default.

And two things a search needs while it records:

- :func:`store_lock`: searches started together in one folder share its sqlite files
  (``mlflow.db``, ``optuna.db``); the first to open one creates its tables while the others
  wait, instead of all running the same schema migrations at once.
- :func:`tracking_client`: the MLflow client a search records through. Its calls give up on
  a silent server within seconds, not MLflow's minutes of retries, and a store that stopped
  answering mid-search becomes one :class:`TrackingLost`, which ends the search resumably.

MLflow is imported inside the functions that use it: ``raypeft validate`` and the CLI's
start-up stay fast.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from raypeft.config.environment import env_flag
from raypeft.config.redact import redact_uri
from raypeft.config.schema import ExperimentConfig
from raypeft.errors import ConfigError

# Database schemes SQLAlchemy (MLflow's and Optuna's database stores) can open.
SQL_SCHEMES = {"sqlite", "postgresql", "mysql", "mssql", "oracle"}

# What to install for a database driver SQLAlchemy could not import (by its module's name).
DRIVER_PACKAGES = {
    "psycopg": '"psycopg[binary]"',
    "psycopg2": "psycopg2-binary",
    "pymysql": "pymysql",
    "MySQLdb": "mysqlclient",
}


def database_url(url: str) -> str:
    """``url`` with PostgreSQL's driver named: ``postgresql://`` is read as
    ``postgresql+psycopg://``. raypeft installs psycopg 3 (SQLAlchemy 2.1's default driver
    too), while SQLAlchemy 2.0 would look for psycopg2; ``postgresql+psycopg2://`` still
    picks psycopg2 where it is installed. Any other URL is returned as it is."""
    scheme, sep, rest = url.partition("://")
    if sep and scheme.lower() == "postgresql":
        return f"postgresql+psycopg://{rest}"
    return url


def database_server(url: str) -> bool:
    """A URL of a database server (PostgreSQL, MySQL, ...), not a local sqlite file."""
    scheme = url.split(":", 1)[0].split("+", 1)[0].lower()
    return "://" in url and scheme in SQL_SCHEMES - {"sqlite"}


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


def named_tracking_uri(uri: str | None) -> tuple[str, str] | None:
    """The MLflow tracking URI ``tracking.uri`` (``uri``) or else ``$MLFLOW_TRACKING_URI``
    sets, with the key that set it; None when neither does (MLflow's default store)."""
    if uri:
        return uri, "tracking.uri"
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"], "MLFLOW_TRACKING_URI"
    return None


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


def _no_retries(timeout_s: int):
    """MLflow's HTTP client retries for minutes by default; a start-up probe must not."""
    return _mlflow_env(
        {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": str(timeout_s)}
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
    scheme = url.split(":", 1)[0].split("+", 1)[0].lower()
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


# ----------------------------------------------------------------------------- creating stores

LOCK_TIMEOUT_S = 300  # how long a search waits for another one creating the same store


def sqlite_file(url: str, absolute: bool = True) -> Path | None:
    """The path of a local sqlite database URL's file (absolute, or as the URL writes it);
    None for anything else."""
    scheme, sep, rest = url.partition(":///")
    if not sep or scheme.split("+", 1)[0].lower() != "sqlite":
        return None
    db = rest.split("?", 1)[0]
    if not db or db == ":memory:":
        return None
    return Path(db).expanduser().resolve() if absolute else Path(db)


@contextmanager
def store_lock(url: str, key: str = "tracking.uri") -> Iterator[None]:
    """Hold an inter-process lock on a local sqlite store while it is opened (created).

    SQLAlchemy stores (MLflow's, Optuna's) create their tables and stamp their schema version
    when they first open an empty file; two processes doing it at once collide ("Online
    migration expected to match one row", ``UNIQUE constraint failed: alembic_version``).
    The lock file lives in a private folder of the user's in the temp folder
    (:func:`lock_folder`), named after the database's absolute path, so the search's own
    folder holds nothing but its stores.
    Processes on other machines sharing the file (a network folder) are not covered: sqlite
    is not safe there anyway; use a database server or an MLflow tracking server.
    Anything but a local sqlite file needs no lock.
    """
    path = sqlite_file(url)
    if path is None:
        yield
        return
    from filelock import FileLock, Timeout  # why: only searches open stores

    name = hashlib.sha256(str(path).encode()).hexdigest()[:20]
    lock = FileLock(str(lock_folder() / f"{name}.lock"), timeout=LOCK_TIMEOUT_S)
    try:
        lock.acquire()
    except Timeout:
        raise ConfigError(
            f"{key} {path}: another process has been creating this store for "
            f"{LOCK_TIMEOUT_S} s (lock {lock.lock_file}); try again once it is done"
        ) from None
    try:
        yield
    finally:
        lock.release()


def lock_folder() -> Path:
    """``raypeft-UID-locks`` in the temp folder: created private (0700), and on every use
    refused in one line unless it is a real folder, ours, that no one else may enter. The temp
    folder is everyone's: another local user could create the name first (then hold or swap
    our locks), or make it a symbolic link to a folder of theirs."""
    if not hasattr(os, "getuid"):  # Windows: the temp folder is the user's own
        folder = Path(tempfile.gettempdir()) / f"raypeft-{os.environ.get('USERNAME', 'user')}-locks"
        folder.mkdir(exist_ok=True)
        return folder
    uid = os.getuid()
    folder = Path(tempfile.gettempdir()) / f"raypeft-{uid}-locks"
    try:
        folder.mkdir(mode=0o700)
    except FileExistsError:
        pass  # made by an earlier search (or by someone else: checked below)
    problem = _not_private(os.lstat(folder), uid, folder)
    if problem:
        raise ConfigError(f"lock folder {folder} {problem}")
    return folder


def _not_private(info: os.stat_result, uid: int, folder: Path) -> str | None:
    """What makes the lock folder unsafe, and the fix (None: it is a private folder of ours)."""
    elsewhere = "set TMPDIR to a folder of your own"
    if stat.S_ISLNK(info.st_mode):
        return f"is a symbolic link, not a folder: remove it (rm {folder}) or {elsewhere}"
    if not stat.S_ISDIR(info.st_mode):
        return f"is not a folder: remove it (rm {folder}) or {elsewhere}"
    if info.st_uid != uid:
        return f"belongs to uid {info.st_uid}, not to you (uid {uid}): {elsewhere}"
    if info.st_mode & 0o077:
        mode = oct(stat.S_IMODE(info.st_mode))[2:]
        return f"has mode {mode}: other users may use it; make it private (chmod 700 {folder})"
    return None


# ----------------------------------------------------------------------------- a lost server

# While a search records: MLflow's HTTP client retries 7 times over about 4 minutes by
# default, and waits 120 s for an answer. A search gives up within seconds on a server that
# refuses connections, and within about two minutes on one that hangs. Values the user set in
# the environment are kept.
FAIL_FAST = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "3",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",  # 1 + 2 + 4 s between the attempts
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
}


class TrackingLost(RuntimeError):
    """The tracking store stopped answering during a search.

    The search stops where it is: its parent run and running trials' runs stay RUNNING in the
    store (as after a SIGKILL of the driver), its Optuna trials RUNNING, Ray Tune's
    experiment state is kept, so ``raypeft tune ... --resume`` continues it once the store
    answers again. ``uri`` is redacted; ``reason`` is one short line.
    """

    def __init__(self, uri: str, reason: str):
        self.uri = uri
        self.reason = reason
        super().__init__(f"the tracking server {uri} stopped answering ({reason})")

    def __reduce__(self):
        return (TrackingLost, (self.uri, self.reason))

    def line(self, resume_command: str) -> str:
        """The one line the CLI prints, given the command that resumes the search."""
        return f"{self}; after it is back: {resume_command}"


def _short_reason(exc: BaseException) -> str:
    """What went wrong, in a few words: the socket error of MLflow's long message if it has
    one (``Connection refused``, ``timed out``), else its first line, cut."""
    text = str(exc)
    found = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", text)
    if found:
        return found.group(1).strip()
    if "timed out" in text.lower() or "timeout" in type(exc).__name__.lower():
        return "timed out"
    status = re.search(r"response code (\d{3})|status code (\d{3})", text)
    if status:
        return f"HTTP {status.group(1) or status.group(2)}"
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return redact_uri(first)[:160]


class TrackingClient:
    """An ``MlflowClient`` for a search: every call fails fast (:data:`FAIL_FAST`, set for the
    search's process when the client is made), and a call
    that fails while the store does not answer a probe either raises :class:`TrackingLost`;
    from then on every call raises it at once, so nothing more is attempted on the store
    (the parent run stays RUNNING: ``--resume`` takes it up). Errors of a store that does
    answer (a bad request, a missing run) are raised as they are.

    Picklable (Ray Tune saves the tracker with its experiment).
    """

    def __init__(self, client, uri: str):
        # MLflow reads its HTTP settings from the environment at every request: the search's
        # process fails fast from here on (where the user set none), not per call
        for key, value in FAIL_FAST.items():
            os.environ.setdefault(key, value)
        self._client = client
        self._uri = uri
        self._lost: TrackingLost | None = None

    @property
    def lost(self) -> TrackingLost | None:
        return self._lost

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # pickling looks up dunders before __dict__ is set
            raise AttributeError(name)
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        @functools.wraps(attr)
        def call(*args, **kwargs):
            if self._lost is not None:
                raise TrackingLost(self._lost.uri, self._lost.reason)
            try:
                return attr(*args, **kwargs)
            except Exception as exc:
                lost = self._probe()
                if lost is None:
                    raise
                self._lost = lost
                raise TrackingLost(lost.uri, lost.reason) from exc

        return call

    def _probe(self) -> TrackingLost | None:
        """After a failed call: does the store still answer (one request, no retries)?"""
        from mlflow.tracking import MlflowClient  # why: MLflow is imported where it is used

        with _no_retries(5):
            try:
                MlflowClient(tracking_uri=self._uri).search_experiments(max_results=1)
            except Exception as probe_exc:
                return TrackingLost(redact_uri(self._uri), _short_reason(probe_exc))
        return None


def tracking_client(uri: str) -> TrackingClient:
    """The MLflow client a search records through (see :class:`TrackingClient`). A local
    sqlite store is created here, once, under :func:`store_lock`: MLflow creates a store's
    tables when a client first opens it, and caches the store for the process."""
    from mlflow.tracking import MlflowClient  # why: MLflow is imported where it is used

    with store_lock(uri):
        client = MlflowClient(tracking_uri=uri)
    return TrackingClient(client, uri)
