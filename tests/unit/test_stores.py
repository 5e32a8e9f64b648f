"""The stores a search records into: created once when searches start together, and a
tracking server lost mid-search turned into one TrackingLost (integration: test_crowded.py,
test_lost_server.py)."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import socket
import stat
import subprocess
import sys
import tempfile
import time

import pytest
from click.testing import CliRunner
from mlflow.tracking import MlflowClient

from raypeft.cli.main import main
from raypeft.errors import ConfigError
from raypeft.tracking.parent_run import artefacts_on_one_disk, open_experiment
from raypeft.tracking.stores import (
    TrackingClient,
    TrackingLost,
    check_store,
    check_tracking_uri,
    database_server,
    database_url,
    lock_folder,
    sqlite_file,
    store_lock,
    tracking_client,
)
from tests.helpers import RAYPEFT, cli_env


def test_sqlite_file_is_the_absolute_path_of_a_local_sqlite_url(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert sqlite_file("sqlite:///mlflow.db") == tmp_path / "mlflow.db"
    assert sqlite_file(f"sqlite:///{tmp_path}/x.db?timeout=5") == tmp_path / "x.db"
    for other in ("sqlite:///:memory:", "http://127.0.0.1:5000", "postgresql://u@h/db", ""):
        assert sqlite_file(other) is None


def _hold(url: str, held, done) -> None:
    with store_lock(url):
        held.set()
        time.sleep(1.0)
        done.set()  # still inside: set once the lock is released, it could come too late


def test_store_lock_serialises_processes_and_leaves_nothing_beside_the_store(tmp_path):
    url = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ctx = multiprocessing.get_context("fork")  # a second process, started quickly
    held, done = ctx.Event(), ctx.Event()
    other = ctx.Process(target=_hold, args=(url, held, done))
    other.start()
    try:
        assert held.wait(60)
        with store_lock(url):  # waits for the other process to leave the lock
            assert done.is_set()
    finally:
        other.join(30)
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def temp_folder(tmp_path, monkeypatch):
    """A temp folder of the test's own (where the lock folder goes), and the lock folder's
    path in it."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path / f"raypeft-{os.getuid()}-locks"


def test_the_lock_folder_is_made_private_and_kept_so(temp_folder, tmp_path):
    with store_lock(f"sqlite:///{tmp_path / 'mlflow.db'}"):
        pass
    info = os.lstat(temp_folder)
    assert stat.S_ISDIR(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o700
    assert info.st_uid == os.getuid()
    assert lock_folder() == temp_folder  # reused as it is


def _refused(tmp_path) -> str:
    with pytest.raises(ConfigError) as err:
        with store_lock(f"sqlite:///{tmp_path / 'mlflow.db'}"):
            pass
    assert "\n" not in str(err.value)
    return str(err.value)


def test_a_lock_folder_others_may_use_is_refused_in_one_line(temp_folder, tmp_path):
    temp_folder.mkdir()
    temp_folder.chmod(0o755)
    assert _refused(tmp_path) == (
        f"lock folder {temp_folder} has mode 755: other users may use it; make it private "
        f"(chmod 700 {temp_folder})"
    )


def test_a_lock_folder_that_is_a_symbolic_link_is_refused(temp_folder, tmp_path):
    (tmp_path / "theirs").mkdir(mode=0o700)
    temp_folder.symlink_to(tmp_path / "theirs")
    assert _refused(tmp_path) == (
        f"lock folder {temp_folder} is a symbolic link, not a folder: remove it "
        f"(rm {temp_folder}) or set TMPDIR to a folder of your own"
    )
    assert list((tmp_path / "theirs").iterdir()) == []  # no lock file made through it


def test_a_lock_folder_of_another_user_is_refused(temp_folder, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("making a folder another user's needs root")
    temp_folder.mkdir(mode=0o700)
    os.chown(temp_folder, 65534, 65534)  # nobody
    assert _refused(tmp_path) == (
        f"lock folder {temp_folder} belongs to uid 65534, not to you (uid {os.getuid()}): "
        "set TMPDIR to a folder of your own"
    )


def _dead_url() -> str:
    with socket.socket() as sock:  # a loopback port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://user:secret@127.0.0.1:{port}"


@pytest.mark.slow
def test_a_lost_server_is_one_tracking_lost_within_seconds_and_stays_lost():
    url = _dead_url()
    client = TrackingClient(MlflowClient(tracking_uri=url), url)
    start = time.monotonic()
    with pytest.raises(TrackingLost) as info:
        client.set_tag("0" * 32, "k", "v")
    assert time.monotonic() - start < 30  # 3 retries 1 + 2 + 4 s apart, not MLflow's minutes
    lost = info.value
    assert "secret" not in str(lost) and lost.uri == url.replace("secret", "***")
    assert lost.reason == "Connection refused"
    assert "\n" not in lost.line("raypeft tune --space x.yaml --resume")
    start = time.monotonic()
    with pytest.raises(TrackingLost):  # nothing more is attempted on the store
        client.get_run("0" * 32)
    assert time.monotonic() - start < 1
    assert isinstance(pickle.loads(pickle.dumps(client)), TrackingClient)  # Tune saves it


def test_errors_of_a_store_that_answers_are_raised_as_they_are(tmp_path):
    client = tracking_client(f"sqlite:///{tmp_path / 'mlflow.db'}")
    with pytest.raises(Exception) as info:
        client.get_run("0" * 32)
    assert not isinstance(info.value, TrackingLost)
    assert client.lost is None
    assert client.get_experiment_by_name("Default") is not None


# ----------------------------------------------------------------------------- database URLs


def test_plain_postgresql_means_psycopg_and_other_urls_are_kept():
    assert database_url("postgresql://u:p@h:5432/db") == "postgresql+psycopg://u:p@h:5432/db"
    for kept in (
        "postgresql+psycopg2://u@h/db",
        "postgresql+psycopg://u@h/db",
        "sqlite:///mlflow.db",
        "mysql://u@h/db",
        "http://127.0.0.1:5000",
    ):
        assert database_url(kept) == kept
    assert database_server("postgresql://h/db") and database_server("mysql+pymysql://h/db")
    assert not database_server("sqlite:///x.db") and not database_server("http://h:5000")


def test_a_missing_driver_is_one_line_naming_the_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "psycopg", None)  # `import psycopg` now fails
    url = "postgresql://me:s3cr3t@127.0.0.1:1/mlflow"
    for check in (lambda: check_store(url), lambda: check_tracking_uri(url, "tracking.uri")):
        with pytest.raises(ConfigError) as err:
            check()
        message = str(err.value)
        assert (
            "'psycopg' is not installed" in message and 'pip install "psycopg[binary]"' in message
        )
        assert "s3cr3t" not in message and "\n" not in message


def test_a_database_that_does_not_answer_fails_in_seconds_not_mlflows_hour():
    start = time.monotonic()
    with pytest.raises(ConfigError, match=r"^--tracking-uri: .*me:\*\*\*@.*does not answer"):
        check_store("postgresql://me:s3cr3t@127.0.0.1:1/mlflow")
    assert time.monotonic() - start < 10


@pytest.mark.parametrize(
    "command",
    [
        ["report", "x"],
        ["table", "x", "--out", "t.json"],
        ["predict", "--model", "models:/x@champion"],
        ["export", "--experiment", "x", "--format", "peft", "--out", "out"],
        ["serve", "--experiment", "x"],
    ],
    ids=lambda c: c[0],
)
def test_every_reading_command_refuses_a_missing_driver_in_one_line(tmp_path, monkeypatch, command):
    """Each command that reads a store answers as `tune` does when the database's driver is
    missing (hidden from the import system here): one line naming it, exit code 2."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "psycopg", None)
    url = "postgresql://me:s3cr3t@127.0.0.1:1/mlflow"
    result = CliRunner().invoke(main, [*command, "--tracking-uri", url], input="a text\n")
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines() == [MISSING_DRIVER_LINE]
    assert list(tmp_path.iterdir()) == []  # nothing created


MISSING_DRIVER_LINE = (
    "error: --tracking-uri: postgresql+psycopg://me:***@127.0.0.1:1/mlflow: its database "
    "driver 'psycopg' is not installed; it must be (pip install \"psycopg[binary]\")"
)


@pytest.mark.slow
def test_ui_without_the_driver_is_one_line_not_a_traceback(tmp_path):
    """The reported bug: `raypeft ui --tracking-uri postgresql://...` without psycopg printed a
    71-line traceback. The real CLI, with psycopg hidden by an import hook on its PYTHONPATH."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HIDE_PSYCOPG)
    env = dict(cli_env(), PYTHONPATH=os.pathsep.join([str(hook), *sys.path]))
    url = "postgresql://me:s3cr3t@127.0.0.1:1/mlflow"
    proc = subprocess.run(
        [RAYPEFT, "ui", "--tracking-uri", url],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.splitlines() == [MISSING_DRIVER_LINE]


HIDE_PSYCOPG = """
import sys


class HidePsycopg:
    def find_spec(self, name, path=None, target=None):
        if name == "psycopg" or name.startswith("psycopg."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, HidePsycopg())
"""


@pytest.mark.slow
def test_an_experiment_keeps_its_artifact_location_and_a_different_one_is_refused(tmp_path):
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    wanted = str(tmp_path / "artefacts")
    experiment_id = open_experiment(client, "e", wanted)
    assert client.get_experiment(experiment_id).artifact_location == wanted
    assert open_experiment(client, "e", f"file://{wanted}/") == experiment_id  # the same place
    assert open_experiment(client, "e") == experiment_id  # none asked: whatever it has
    with pytest.raises(ConfigError, match="tracking.artifact_location: experiment 'e' already"):
        open_experiment(client, "e", "s3://bucket/mlflow")


def test_artefacts_on_one_disk_only_for_a_database_server_with_local_artefacts():
    assert artefacts_on_one_disk("postgresql+psycopg://h/db", "/home/me/mlruns")
    assert artefacts_on_one_disk("mysql://h/db", "file:///home/me/mlruns")
    assert not artefacts_on_one_disk("postgresql://h/db", "s3://bucket/mlflow")
    assert not artefacts_on_one_disk("sqlite:///mlflow.db", "/home/me/mlruns")
    assert not artefacts_on_one_disk("http://head:5000", "mlflow-artifacts:/1")


# ----------------------------------------------------------------------------- a cluster's
# stores named in every node's environment (cluster/node.sh sources ~/.raypeft/cluster.env)


def _experiment(**sections):
    from raypeft.config.loading import validate_experiment

    raw = {"name": "env", "model": {"name": "tiny-bert"}, "method": {"name": "pt"}}
    return validate_experiment({**raw, **sections}, "env.yaml")


def test_the_clusters_environment_names_the_default_stores(monkeypatch, tmp_path):
    from raypeft.search.trial_runners import storage_path
    from raypeft.tracking.stores import search_storage, search_storage_url

    monkeypatch.setenv("RAYPEFT_SEARCH_STORAGE", "postgresql+psycopg://u@db:5432/optuna")
    monkeypatch.setenv("RAYPEFT_STORAGE_PATH", "s3://team/ray_results")
    cfg = _experiment()
    beside = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert search_storage_url(cfg, beside).endswith("@db:5432/optuna")
    assert search_storage(cfg) == (os.environ["RAYPEFT_SEARCH_STORAGE"], "RAYPEFT_SEARCH_STORAGE")
    assert storage_path(cfg) == "s3://team/ray_results"
    # what the file says wins over the environment
    mine = _experiment(search={"storage": "sqlite:///x.db"}, run={"storage_path": "s3://me/r"})
    assert search_storage(mine) == ("sqlite:///x.db", "search.storage")
    assert storage_path(mine) == "s3://me/r"


def test_a_bad_environment_storage_is_named_in_the_error(monkeypatch):
    from raypeft.tracking.stores import check_stores

    monkeypatch.setenv("RAYPEFT_SEARCH_STORAGE", "redis://nowhere")
    with pytest.raises(ConfigError, match=r"^RAYPEFT_SEARCH_STORAGE: .*must be a database URL"):
        check_stores(_experiment())
