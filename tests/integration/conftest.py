"""Fixtures shared by the integration tests: one small finished search, run once per session,
and one Ray per pytest process for the searches that do not need a Ray of their own."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import yaml
from filelock import FileLock
from mlflow.tracking import MlflowClient

from tests.helpers import SHARED_RAY, TINY_SEARCH_BASE, cli_env, run_cli
from tests.servers import free_port


@pytest.fixture(scope="session")
def _process_ray():
    """A Ray head of this pytest process (``ray start --block``, this machine's CPUs, on
    loopback, in a session of its own): started on first use, stopped at the end through its
    process group and session, touching no other Ray on the machine.

    Starting a local Ray costs each search ~5.5 s of CPU (docs/measured.md); the searches
    whose tests check records, methods or the search language, not how Ray starts or stops,
    join this one instead (``shared_ray``). Its workers take its environment (the tests' CLI
    environment), not the driver's: a test that hands its trials variables of its own starts
    its own Ray.
    """
    root = Path(tempfile.mkdtemp(prefix="rpt-", dir="/tmp"))  # unix sockets: short paths
    port = free_port("127.0.0.1")
    env = {**cli_env(), "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}
    env.pop("RAY_ADDRESS", None)
    bin_ = Path(sys.executable).parent
    args = [str(bin_ / "ray"), "start", "--head", "--block", "--disable-usage-stats"]
    args += ["--node-ip-address", "127.0.0.1", "--port", str(port)]
    args += ["--num-cpus", str(os.cpu_count()), "--num-gpus", "0", "--temp-dir", str(root)]
    args += ["--include-dashboard", "false", "--dashboard-port", str(free_port("127.0.0.1"))]
    args += ["--dashboard-agent-listen-port", str(free_port("127.0.0.1"))]
    args += ["--ray-client-server-port", str(free_port("127.0.0.1"))]
    with (root / "ray.log").open("wb") as log:
        proc = subprocess.Popen(
            args, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while not (root / "ray_current_cluster").is_file():  # written once its node runs
            assert proc.poll() is None, (root / "ray.log").read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "this process's Ray did not start"
            time.sleep(0.3)
        yield f"127.0.0.1:{port}"
    finally:
        _stop_session(proc)
        shutil.rmtree(root, ignore_errors=True)


def _stop_session(proc: subprocess.Popen) -> None:
    """SIGTERM to `ray start --block`'s process group, then SIGKILL to whatever of its
    session is left (Ray's workers have process groups of their own, in that session)."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        proc.kill()
        proc.wait()
    left = []
    for member in psutil.process_iter(["pid"]):
        try:
            if os.getsid(member.pid) == proc.pid:
                left.append(member)
        except (ProcessLookupError, PermissionError):
            pass
    for member in left:
        with contextlib.suppress(psutil.NoSuchProcess):  # it may end by itself meanwhile
            member.kill()
    psutil.wait_procs(left, timeout=15)


@pytest.fixture
def shared_ray(_process_ray, monkeypatch):
    """The test's ``raypeft tune`` command lines (tests.helpers.run_cli) join this pytest
    process's Ray with --address, as a cluster's driver does."""
    monkeypatch.setenv(SHARED_RAY, _process_ray)
    return _process_ray


@dataclass
class FinishedSearch:
    """A finished ``raypeft tune`` run in its own working directory."""

    cwd: Path  # holds mlflow.db (the default store) and ray_results/
    experiment: str
    tracking_uri: str
    stdout: str

    def client(self) -> MlflowClient:
        return MlflowClient(tracking_uri=self.tracking_uri)

    def parent_run(self):
        """The search's MLflow parent run."""
        client = self.client()
        exp = client.get_experiment_by_name(self.experiment)
        (parent,) = client.search_runs([exp.experiment_id], "tags.`raypeft.role` = 'experiment'")
        return parent


@pytest.fixture(scope="session")
def finished_search(tmp_path_factory, _process_ray) -> FinishedSearch:
    """A DePT search on tiny BERT: the α1 × α2 joint grid (2 × 2), m sampled, ASHA on.

    Shared by the report, predict, export and ui tests, which read it back from MLflow only.
    Do not write into its store from a test: copy it first. Under pytest-xdist each worker is
    a session of its own: the first worker that needs the search runs it, in the folder all
    workers of the run share, and the others wait for it and read it.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if worker else base  # pytest-N/, above each worker's popen-gwK/
    with FileLock(str(shared / "finished-search.lock")):
        cwd = shared / "finished-search"
        done = cwd / "stdout.txt"
        if not done.exists():
            _run_finished_search(cwd, _process_ray)
    return FinishedSearch(
        cwd=cwd,
        experiment="tiny-search",
        tracking_uri=f"sqlite:///{cwd / 'mlflow.db'}",
        stdout=done.read_text(),
    )


def _run_finished_search(cwd: Path, ray_address: str) -> None:
    """Run the shared search in ``cwd``, on the Ray at ``ray_address``; its output goes to
    ``cwd/stdout.txt`` once it succeeded (the mark that it is done)."""
    cwd.mkdir(exist_ok=True)
    cfg = {
        "name": "tiny-search",
        **TINY_SEARCH_BASE,
        "space": {
            "method.lr_prompt": {"grid": [0.3, 0.5]},
            "method.lr_lowrank": {"grid": [1.0e-3, 1.0e-2]},
            "method.prompt_length": {"choice": [2, 4, 6]},
        },
        "search": {"num_samples": 5, "scheduler": {"type": "asha", "grace_period": 1}},
        "run": {"storage_path": str(cwd / "ray_results")},
    }
    path = cwd / "experiment.yaml"
    path.write_text(yaml.safe_dump(cfg))
    args = ["tune", "--space", str(path), "--quiet", "--address", ray_address]
    proc = run_cli(args, cwd=cwd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (cwd / "stdout.txt").write_text(proc.stdout)
