"""The head's secrets file: database URIs a cluster keeps away from its workers.

On a cluster, ``cluster/node.sh`` moves the database lines of ``~/.raypeft/cluster.env``
(MLflow's backend store, the Optuna study) into ``~/.raypeft/head.env`` on the head and gives
Ray's processes there only that file's path, ``$RAYPEFT_SECRETS_FILE``. ``raypeft`` reads it
when it starts, so the job driver (``raypeft tune``, submitted with ``ray job submit``) has
them and no other Ray process does: the trials it starts get their environment from their
node's Ray, not from the driver.
"""

from __future__ import annotations

import os
import stat
from collections.abc import MutableMapping
from pathlib import Path

from dotenv import dotenv_values

from raypeft.errors import ConfigError

SECRETS_FILE_ENV = "RAYPEFT_SECRETS_FILE"


def load_secrets_file(environ: MutableMapping[str, str] = os.environ) -> list[str]:
    """Take ``$RAYPEFT_SECRETS_FILE``'s ``KEY=VALUE`` lines as defaults of ``environ`` (what
    the environment already sets wins); returns the keys it set. A file that is missing,
    not the user's own or readable by others is a :class:`ConfigError` naming it."""
    name = environ.get(SECRETS_FILE_ENV)
    if not name:
        return []
    path = Path(name).expanduser()
    check_private_file(path, SECRETS_FILE_ENV)
    added = []
    for key, value in dotenv_values(path).items():
        if value is not None and key not in environ:
            environ[key] = value
            added.append(key)
    return added


def check_private_file(path: Path, key: str) -> None:
    """``path`` is a regular file of this user's that no one else may read or write."""
    try:
        info = path.lstat()
    except OSError as exc:
        raise ConfigError(f"{key}: {path} cannot be read ({exc.strerror})") from None
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"{key}: {path} must be a regular file (not a link or a folder)")
    if info.st_uid != os.getuid():
        raise ConfigError(f"{key}: {path} must belong to this user (uid {os.getuid()})")
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        raise ConfigError(
            f"{key}: {path} is mode {mode:04o}, open to others, and holds passwords: "
            f"run chmod 600 {path}"
        )
