"""The stores a search records into: created once when searches start together, and a
tracking server lost mid-search turned into one TrackingLost (integration: test_crowded.py,
test_lost_server.py)."""

from __future__ import annotations

import multiprocessing
import pickle
import socket
import time

import pytest
from mlflow.tracking import MlflowClient

from raypeft.tracking.stores import (
    TrackingClient,
    TrackingLost,
    sqlite_file,
    store_lock,
    tracking_client,
)


def test_sqlite_file_is_the_absolute_path_of_a_local_sqlite_url(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert sqlite_file("sqlite:///mlflow.db") == tmp_path / "mlflow.db"
    assert sqlite_file(f"sqlite:///{tmp_path}/x.db?timeout=5") == tmp_path / "x.db"
    for other in ("sqlite:///:memory:", "http://127.0.0.1:5000", "postgresql://u@h/db", ""):
        assert sqlite_file(other) is None


def _hold(url: str, held, released) -> None:
    with store_lock(url):
        held.set()
        time.sleep(1.0)
    released.set()


def test_store_lock_serialises_processes_and_leaves_nothing_beside_the_store(tmp_path):
    url = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ctx = multiprocessing.get_context("fork")  # a second process, started quickly
    held, released = ctx.Event(), ctx.Event()
    other = ctx.Process(target=_hold, args=(url, held, released))
    other.start()
    try:
        assert held.wait(60)
        with store_lock(url):  # waits for the other process
            assert released.is_set()
    finally:
        other.join(30)
    assert list(tmp_path.iterdir()) == []


def _dead_url() -> str:
    with socket.socket() as sock:  # a loopback port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://user:secret@127.0.0.1:{port}"


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
