"""Searches started together in one folder share its sqlite files (``mlflow.db``,
``optuna.db``): the first to open one creates its tables while the others wait on a lock
(:func:`store_lock`), instead of all running the same schema migrations at once."""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from raypeft.errors import ConfigError
from raypeft.tracking.stores.urls import sqlite_file

LOCK_TIMEOUT_S = 300  # how long a search waits for another one creating the same store


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
