"""``raypeft ui``'s user errors: one line on stderr, exit code 2, nothing created or started."""

from __future__ import annotations

import socket

import pytest
from click.testing import CliRunner

from raypeft.cli.main import main
from raypeft.cli.ui import _client_host


@pytest.fixture(autouse=True)
def _no_env_store(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    """A sqlite store holding one experiment, ``other``."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path_factory.mktemp('store') / 'mlflow.db'}"
    MlflowClient(tracking_uri=uri).create_experiment("other")
    return uri


def invoke(*args: str):
    return CliRunner().invoke(main, ["ui", *args])


def one_error_line(result) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    return lines[0]


def test_missing_default_store_fails_and_creates_none(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = one_error_line(invoke("tiny-search"))
    assert "mlflow.db: no MLflow store here" in line
    assert list(tmp_path.iterdir()) == []


def test_unknown_experiment_names_the_ones_there(store):
    line = one_error_line(invoke("nope", "--tracking-uri", store))
    assert "experiment 'nope': not found" in line and "other" in line


def test_port_in_use_is_detected_before_starting(store):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        line = one_error_line(invoke("other", "--tracking-uri", store, "--port", str(port)))
    assert f"127.0.0.1:{port}" in line and "--port" in line


def test_remote_tracking_server_is_refused():
    line = one_error_line(invoke("--tracking-uri", "http://127.0.0.1:5000"))
    assert "already a tracking server" in line


def test_help_explains_the_command():
    result = invoke("--help")
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    for words in ("MLflow", "Ctrl-C", "--port", "--host", "no authentication"):
        assert words in text


def test_browser_address_of_wildcard_hosts():
    assert _client_host("0.0.0.0") == "127.0.0.1"
    assert _client_host("::") == "[::1]"
    assert _client_host("127.0.0.1") == "127.0.0.1"


def test_a_remote_servers_credentials_are_never_printed():
    """As everywhere else (redact_uri): a token in the URI stays out of the output."""
    result = invoke("--tracking-uri", "https://user:s3cret-token@mlflow.example.org")
    line = one_error_line(result)
    assert "s3cret-token" not in result.output
    assert "https://user:***@mlflow.example.org: already a tracking server" in line
