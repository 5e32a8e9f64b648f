"""The head's secrets file ($RAYPEFT_SECRETS_FILE, written by cluster/node.sh): its lines are
the defaults of the process that reads it, and a file others could read is refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from raypeft.config.secrets_file import SECRETS_FILE_ENV, load_secrets_file
from raypeft.errors import ConfigError
from tests.helpers import run_cli

URI = "postgresql+psycopg://optuna:pw@db:5432/optuna"


def secrets(tmp_path: Path, mode: int = 0o600) -> Path:
    path = tmp_path / "head.env"
    path.write_text(f"RAYPEFT_SEARCH_STORAGE={URI}\nexport MLFLOW_BACKEND_STORE_URI='x y'\n")
    path.chmod(mode)
    return path


def test_its_lines_are_defaults_the_environment_overrides(tmp_path):
    environ = {SECRETS_FILE_ENV: str(secrets(tmp_path)), "MLFLOW_BACKEND_STORE_URI": "mine"}
    assert load_secrets_file(environ) == ["RAYPEFT_SEARCH_STORAGE"]
    assert environ["RAYPEFT_SEARCH_STORAGE"] == URI
    assert environ["MLFLOW_BACKEND_STORE_URI"] == "mine"
    assert load_secrets_file({}) == []  # no file named: nothing read


@pytest.mark.parametrize(
    "make, rule",
    [
        (lambda p: secrets(p, 0o644), "is mode 0644, open to others"),
        (lambda p: p / "absent.env", "cannot be read"),
        (lambda p: (p / "link.env").symlink_to(secrets(p)) or p / "link.env", "regular file"),
    ],
)
def test_a_file_others_could_read_or_swap_is_refused(tmp_path, make, rule):
    path = make(tmp_path)
    with pytest.raises(ConfigError, match=rule) as error:
        load_secrets_file({SECRETS_FILE_ENV: str(path)})
    assert SECRETS_FILE_ENV in str(error.value) and str(path) in str(error.value)


def test_a_file_of_another_user_is_refused(tmp_path):
    path = secrets(tmp_path)
    if os.getuid() != 0:
        pytest.skip("changing a file's owner needs root")
    os.chown(path, 65534, 65534)
    with pytest.raises(ConfigError, match="must belong to this user"):
        load_secrets_file({SECRETS_FILE_ENV: str(path)})


@pytest.mark.slow
def test_the_cli_refuses_it_in_one_line_before_any_command(tmp_path):
    path = secrets(tmp_path, 0o640)
    proc = run_cli(["schema"], cwd=tmp_path, env={SECRETS_FILE_ENV: str(path)})
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: ") and f"chmod 600 {path}" in line, line
    assert list(tmp_path.iterdir()) == [path]  # nothing created
