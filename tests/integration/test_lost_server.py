"""A tracking server lost mid-search: a real ``mlflow server`` process is stopped once a trial
has logged a step. The search ends within a bounded time with one ``error:`` line naming the
server and the exact ``--resume`` command, its parent run left RUNNING; once the server is
back (same port, same store), ``--resume`` completes it and every run's metric history holds
each step once.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import optuna
import psutil
import pytest
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState

from tests.helpers import RAYPEFT, children, cli_env, kill_session, run_cli, tiny_experiment

pytestmark = pytest.mark.integration

STEPS, EVERY = 400, 50
LOST_WITHIN_S = 120  # from the server's end to the search's: MLflow's retries, then the probe


class Server:
    """``mlflow server`` (sqlite store, artefacts through the server) in a session of its own,
    so that stopping it (SIGTERM to its process group) touches nothing else."""

    def __init__(self, folder: Path, port: int):
        self.folder, self.port = folder, port
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        env = dict(cli_env(), MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
        args = [str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1"]
        args += ["--port", str(self.port), "--workers", "1"]
        args += ["--backend-store-uri", f"sqlite:///{self.folder / 'mlflow.db'}"]
        args += ["--artifacts-destination", str(self.folder / "artifacts")]
        with (self.folder / "server.log").open("ab") as log:
            self.proc = subprocess.Popen(
                args, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + 180
        while not self.healthy():
            assert self.proc.poll() is None, (self.folder / "server.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "mlflow server: no /health after 180 s"
            time.sleep(0.5)

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=5) as response:
                return response.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        """SIGTERM to its process group, as a service manager would; then SIGKILL what is
        left of its session."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
        kill_session(self.proc)
        self.proc.wait(timeout=30)
        left = [p for p in psutil.process_iter() if _session(p.pid) == self.proc.pid]
        psutil.wait_procs(left, timeout=10)
        self.proc = None


def _session(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except (ProcessLookupError, PermissionError):
        return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def logged_a_step(client: MlflowClient) -> bool:
    """A trial's run holds at least one evaluation, read through the server."""
    try:
        experiment = client.get_experiment_by_name("tiny-dept")
        runs = client.search_runs([experiment.experiment_id]) if experiment else []
        return any(client.get_metric_history(r.info.run_id, "val_accuracy") for r in runs)
    except Exception:  # the server is busy starting the search
        return False


def test_lost_server_ends_the_search_resumably_and_resume_logs_each_step_once(tmp_path):
    server_folder, work = tmp_path / "server", tmp_path / "work"
    server_folder.mkdir()
    work.mkdir()
    server = Server(server_folder, free_port())
    path = tiny_experiment(
        work,
        task={"max_test_examples": 48},
        train={"max_steps": STEPS, "eval_every": EVERY},
        search={"num_samples": 2, "max_concurrent": 1, "scheduler": {"type": "none"}},
    )
    args = ["tune", "--space", str(path), "--quiet", "--tracking-uri", server.url]
    server.start()
    search = None
    try:
        stderr = work / "stderr.log"
        search = subprocess.Popen(
            [RAYPEFT, *args],
            cwd=work,
            env=cli_env(),
            stdout=(work / "stdout.log").open("w"),
            stderr=stderr.open("w"),
            start_new_session=True,
        )
        client = MlflowClient(tracking_uri=server.url)
        deadline = time.monotonic() + 400
        while not logged_a_step(client):
            assert search.poll() is None, stderr.read_text()[-3000:]
            assert time.monotonic() < deadline, "no step logged after 400 s"
            time.sleep(0.5)
        server.stop()
        stopped_at = time.monotonic()
        code = search.wait(timeout=LOST_WITHIN_S + 60)
        took = time.monotonic() - stopped_at
    finally:
        if search is not None:
            kill_session(search)  # the driver's local Ray
        server.stop()

    # one line naming the server and the command that resumes the search; no traceback
    text = stderr.read_text()
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert code == 1 and len(errors) == 1 and "Traceback" not in text, text[-3000:]
    resume = f"raypeft tune --space {path} --tracking-uri {server.url} --resume"
    assert errors[0].startswith(f"error: the tracking server {server.url} stopped answering")
    assert errors[0].endswith(f"after it is back: {resume}"), errors[0]
    assert took < LOST_WITHIN_S, took

    # the server is back on the same port, with the same store: --resume completes the search
    server.start()
    try:
        client = MlflowClient(tracking_uri=server.url)
        experiment = client.get_experiment_by_name("tiny-dept")
        role = "tags.`raypeft.role` = 'experiment'"
        (parent,) = client.search_runs([experiment.experiment_id], role)
        assert parent.info.status == "RUNNING"  # nothing was sent once the server was lost
        resumed = run_cli([*args, "--resume"], cwd=work)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        (parent,) = client.search_runs([experiment.experiment_id], role)
        assert parent.info.status == "FINISHED"
        kids = children(client, experiment.experiment_id, parent.info.run_id)
        assert len(kids) == 2 and all(k.info.status == "FINISHED" for k in kids)
        assert len({k.data.tags["raypeft.trial_id"] for k in kids}) == 2
        for kid in kids:  # every metric of every run: each step once, none missing
            for key in kid.data.metrics:
                steps = [m.step for m in client.get_metric_history(kid.info.run_id, key)]
                assert len(steps) == len(set(steps)), (key, steps)
            steps = [m.step for m in client.get_metric_history(kid.info.run_id, "val_accuracy")]
            assert sorted(steps) == list(range(EVERY, STEPS + 1, EVERY)), steps
    finally:
        server.stop()

    # Optuna: nothing left RUNNING; each trial's result recorded once, as its run's
    study = optuna.load_study(study_name="tiny-dept", storage=f"sqlite:///{work / 'optuna.db'}")
    assert not study.get_trials(states=(TrialState.RUNNING, TrialState.WAITING))
    complete = study.get_trials(states=(TrialState.COMPLETE,))
    assert sorted(t.user_attrs["raypeft.tune_trial_id"] for t in complete) == sorted(
        k.data.tags["raypeft.trial_id"] for k in kids
    )
