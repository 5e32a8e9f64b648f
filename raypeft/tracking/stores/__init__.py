"""The stores a search records into, the MLflow tracking store and Optuna's storage: can they
be used, and how a search holds them.

- ``urls``: what a store's URL says (a database server, a local sqlite file, PostgreSQL's
  driver: :func:`database_url`).
- ``checks``: can the stores be used? Before anything starts (:func:`check_stores`), one
  request to a server (:func:`check_tracking_store`), a store to read
  (:func:`check_store`); each fails with a one-line :class:`ConfigError` naming the key.
- ``environment``: the stores environment variables name, the default Optuna storage
  (:func:`search_storage_url`), MLflow's HTTP settings.
- ``locks``: :func:`store_lock`, so searches started together create a sqlite store once.
- ``lost_server``: :func:`tracking_client`, the MLflow client a search records through; a
  store that stops answering becomes one :class:`TrackingLost`, which ends the search
  resumably.

Everything is imported from here (``from raypeft.tracking.stores import check_store``). MLflow
is imported inside the functions that use it: ``raypeft validate`` and the CLI's start-up stay
fast.
"""

from raypeft.tracking.stores.checks import (
    check_database_answers,
    check_optuna_storage,
    check_store,
    check_stores,
    check_tracking_store,
    check_tracking_uri,
)
from raypeft.tracking.stores.environment import (
    FAIL_FAST,
    SEARCH_STORAGE_ENV,
    named_tracking_uri,
    search_storage,
    search_storage_url,
)
from raypeft.tracking.stores.locks import LOCK_TIMEOUT_S, lock_folder, store_lock
from raypeft.tracking.stores.lost_server import TrackingClient, TrackingLost, tracking_client
from raypeft.tracking.stores.urls import (
    SQL_SCHEMES,
    database_server,
    database_url,
    sqlite_file,
)

__all__ = [
    "FAIL_FAST",
    "LOCK_TIMEOUT_S",
    "SEARCH_STORAGE_ENV",
    "SQL_SCHEMES",
    "TrackingClient",
    "TrackingLost",
    "check_database_answers",
    "check_optuna_storage",
    "check_store",
    "check_stores",
    "check_tracking_store",
    "check_tracking_uri",
    "database_server",
    "database_url",
    "lock_folder",
    "named_tracking_uri",
    "search_storage",
    "search_storage_url",
    "sqlite_file",
    "store_lock",
    "tracking_client",
]
