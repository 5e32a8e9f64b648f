"""``raypeft tune --address`` on a real two-node Ray cluster, tracked by a real MLflow server.

Everything runs as separate processes on this machine, as it would on a cluster: a Ray head
and a second Ray node (``ray start --block``, 1 CPU each, token authentication on), an
``mlflow server`` (sqlite store, artefacts served through it) and the ``raypeft tune``
driver, which needs no CPU of the cluster. Two concurrent in-process trials of 1 CPU each
fill the two 1-CPU nodes, one per node; the test checks that the trials' MLflow runs name
both of the cluster's node ids, and that every run, metric and artefact reached the server's
store and artefact folder, never the driver's working directory.

The pytest process never connects to the cluster (the node ids come from a probe subprocess),
and teardown stops only what the test started: each service runs in its own session and is
stopped by signalling its process group, never with ``ray stop`` (which would stop every Ray
session of the user on the machine).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from mlflow.tracking import MlflowClient
from safetensors.torch import load_file

from tests.helpers import RAYPEFT, children, tiny_experiment

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
START_TIMEOUT_S = 180  # a Ray node or the MLflow server, more on a loaded machine
TUNE_TIMEOUT_S = 600
NUM_TRIALS = 4
# Trials long enough (~10-15 s here) to outlast the gap between the two nodes' trial actors
# becoming ready (both start together, ~10-15 s of imports on 2 busy cores; one is ready up
# to a few seconds later). Tune reuses actors: a pending trial whose actor is still starting
# takes the actor of a trial that just ended instead (TuneController._maybe_reuse_cached_actor
# removes the starting one), so with 12-step trials (~1 s) every trial ran on one node.
MAX_STEPS, EVAL_EVERY = 2400, 800

# Prints the cluster's alive nodes as JSON: {node id: {"ip", "name" (node_a | node_b)}}.
PROBE = """
import json, sys, ray
ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR")
print(json.dumps({
    n["NodeID"]: {
        "ip": n["NodeManagerAddress"],
        "name": next((k for k in n["Resources"] if k.startswith("node_")), ""),
    }
    for n in ray.nodes()
    if n["Alive"]
}))
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_marker(port: int) -> re.Pattern:
    return re.compile(rf":{port}(?!\d)")


def _session_of(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except (ProcessLookupError, PermissionError):
        return None


def survivors(sessions: set[int], markers: list[re.Pattern]) -> list[psutil.Process]:
    """Live processes (this one excepted) in one of ``sessions`` or with a marker (temp
    folder, port) in their command line."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if proc.pid == os.getpid():
            continue
        cmdline = " ".join(proc.info["cmdline"] or [])
        if _session_of(proc.pid) in sessions or any(m.search(cmdline) for m in markers):
            try:
                if proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(proc)
            except psutil.NoSuchProcess:
                pass
    return found


def describe(procs: list[psutil.Process]) -> str:
    return "\n".join(f"{p.pid}: {' '.join(p.info['cmdline'] or [])[:200]}" for p in procs)


class Service:
    """A command started in a session of its own: it and everything it starts are found by
    that session id and stopped through its process group, touching nothing else."""

    def __init__(self, name: str, args: list[str], env: dict, log: Path, markers: list):
        self.name, self.log, self.markers = name, log, markers
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                args,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def tail(self, chars: int = 2000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            pytest.fail(f"{self.name} exited ({self.proc.returncode}):\n{self.tail()}")

    def members(self) -> list[psutil.Process]:
        """The session's processes (Ray's workers have process groups of their own, in the
        same session) and the leader's descendants (in case one made a new session)."""
        found = {p.pid: p for p in survivors({self.proc.pid}, [])}
        try:
            for child in psutil.Process(self.proc.pid).children(recursive=True):
                found.setdefault(child.pid, child)
        except psutil.NoSuchProcess:
            pass
        return list(found.values())

    def stop(self, timeout: float = 60) -> None:
        """SIGTERM to the process group, as a service manager would, and wait; then SIGKILL
        whatever of this service is left, by process id.

        ``ray start --block`` handles SIGTERM (ray/_private/node.py, ``sigterm_handler``):
        it drains its node (``RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S``, 0 here), terminates
        the processes it started (raylet first; SIGTERM, then SIGKILL after a grace period)
        and exits with code 1.
        """
        members = self.members()
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        _, alive = psutil.wait_procs(members, timeout=15)
        left = alive + [p for p in self.members() if p.pid not in {a.pid for a in alive}]
        for proc in left:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(left, timeout=10)


def stop_all(services: list[Service]) -> str:
    """Stop ``services``, last started first; describes the processes of theirs that
    survived (and kills them, so that nothing is left for the next test)."""
    for service in reversed(services):
        service.stop()
    left = survivors({s.proc.pid for s in services}, [m for s in services for m in s.markers])
    text = describe(left)
    for proc in left:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    return text


def wait_until(check, what: str, services: list[Service], timeout: float = START_TIMEOUT_S):
    """``check()`` until it returns something true; fails at once if a service died."""
    deadline = time.monotonic() + timeout
    while True:
        for service in services:
            service.check_alive()
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {s.name}:\n{s.tail()}" for s in services)
            pytest.fail(f"{what}: not ready after {timeout} s\n{logs}")
        time.sleep(0.5)


# ----------------------------------------------------------------------------- MLflow


@dataclass
class TrackingServer:
    service: Service
    url: str
    db: Path  # its sqlite store
    artifacts: Path  # its --artifacts-destination

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=5) as response:
                return response.status == 200
        except OSError:
            return False

    def wait_ready(self) -> None:
        wait_until(self.healthy, "mlflow server /health", [self.service])


@pytest.fixture
def mlflow_server(tmp_path):
    """``mlflow server`` on a free port: a sqlite store, artefacts uploaded through the server.

    Not waited for here: it starts while the Ray nodes do (``wait_ready`` in the test).
    """
    folder = tmp_path / "mlflow-server"
    folder.mkdir()
    port = free_port()
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    env["MLFLOW_DISABLE_TELEMETRY"] = "true"
    env.pop("MLFLOW_TRACKING_URI", None)
    db, artifacts = folder / "mlflow.db", folder / "artifacts"
    service = Service(
        "mlflow server",
        [str(BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port)]
        + ["--workers", "1", "--backend-store-uri", f"sqlite:///{db}"]
        + ["--artifacts-destination", str(artifacts)],
        env,
        folder / "server.log",
        [re.compile(re.escape(str(folder))), port_marker(port)],
    )
    try:
        yield TrackingServer(service, f"http://127.0.0.1:{port}", db, artifacts)
    finally:
        left = stop_all([service])
    assert not left, f"MLflow server processes survived teardown:\n{left}"


# ----------------------------------------------------------------------------- Ray


def ray_env() -> dict:
    """The environment of both nodes, the probe and the driver: one private auth token.

    Ray >= 2.59 turns token authentication on for a head started where ``~/.ray/auth_token``
    exists, but a process given an explicit address (``ray start --address``, ``ray.init
    (address=...)``) never turns it on by itself: it then cannot join (``ConnectionError``).
    Setting the mode and a fresh token explicitly makes every process agree, whatever is (or
    is not) in ``~/.ray``, and writes nothing there.
    """
    env = dict(
        os.environ,
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN=secrets.token_hex(32),
        RAY_USAGE_STATS_ENABLED="0",
        # On SIGTERM, `ray start --block` first drains its node, waiting (30 s by default)
        # for its raylet to exit; a raylet signalled together with the GCS (one process
        # group) outlives it, waiting for it. Nothing here needs draining (no Serve).
        RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0",
        MLFLOW_DISABLE_TELEMETRY="true",
        HF_HUB_OFFLINE="1",  # trials run in the nodes' workers, with the nodes' environment
    )
    for key in ("RAY_ADDRESS", "RAY_AUTH_TOKEN_PATH", "MLFLOW_TRACKING_URI"):
        env.pop(key, None)
    return env


def probe_nodes(address: str, env: dict) -> dict[str, dict]:
    """The cluster's alive nodes, as a separate driver process sees them (never this one)."""
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, address],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@dataclass
class RayCluster:
    address: str
    env: dict  # what a driver of this cluster needs (the token)
    nodes: dict[str, dict]  # alive node id -> {"ip", "name": node_a (head) | node_b}


@pytest.fixture
def ray_cluster():
    """A Ray head and a second Ray node, 1 CPU each: two ``ray start --block`` sessions.

    Each node has its own short temp dir under /tmp (unix-socket paths must stay under 107
    characters), so nothing goes to /tmp/ray, ``ray_current_cluster`` included.
    """
    root = Path(tempfile.mkdtemp(prefix="rpmn-", dir="/tmp"))
    env = ray_env()
    port = free_port()
    address = f"127.0.0.1:{port}"
    common = ["--num-cpus", "1", "--num-gpus", "0", "--block", "--disable-usage-stats"]
    common += ["--object-store-memory", str(100 * 1024**2)]
    markers = [re.compile(re.escape(f"{root}/")), port_marker(port)]
    services: list[Service] = []
    try:
        # Ray's fixed default ports (dashboard 8265, agent 52365, client server 10001) would
        # clash between the two nodes, and with any other Ray on this machine
        services.append(
            Service(
                "ray head",
                [str(BIN / "ray"), "start", "--head", "--port", str(port), *common]
                + ["--temp-dir", str(root / "h"), "--resources", json.dumps({"node_a": 1})]
                + ["--include-dashboard", "false", "--dashboard-port", str(free_port())]
                + ["--dashboard-agent-listen-port", str(free_port())]
                + ["--ray-client-server-port", str(free_port())],
                env,
                root / "head.log",
                markers,
            )
        )
        # `ray start` writes ray_current_cluster into its temp dir once its node runs
        wait_until(lambda: (root / "h" / "ray_current_cluster").is_file(), "ray head", services)
        services.append(
            Service(
                "ray node",
                [str(BIN / "ray"), "start", "--address", address, *common]
                + ["--temp-dir", str(root / "w"), "--resources", json.dumps({"node_b": 1})]
                + ["--dashboard-agent-listen-port", str(free_port())],
                env,
                root / "node.log",
                markers,
            )
        )
        wait_until(lambda: (root / "w" / "ray_current_cluster").is_file(), "ray node", services)

        def both_nodes() -> dict | None:
            found = probe_nodes(address, env)
            return found if len(found) == 2 else None

        nodes = wait_until(both_nodes, "two alive Ray nodes", services)
        assert sorted(n["name"] for n in nodes.values()) == ["node_a", "node_b"]
        yield RayCluster(address, env, nodes)
    finally:
        left = stop_all(services)
        shutil.rmtree(root, ignore_errors=True)
    assert not left, f"Ray processes survived teardown:\n{left}"


def run_driver(args: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    """``raypeft`` as ``tests.helpers.run_cli`` runs it, but with the cluster's auth token:
    ``run_cli`` sets ``RAY_AUTH_MODE=disabled``, and such a driver cannot join a cluster
    with token authentication."""
    return subprocess.run(
        [RAYPEFT, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=TUNE_TIMEOUT_S
    )


# ----------------------------------------------------------------------------- test


def test_trials_run_on_both_nodes_and_log_through_the_server(mlflow_server, ray_cluster, tmp_path):
    mlflow_server.wait_ready()
    work = tmp_path / "driver"
    work.mkdir()
    path = tiny_experiment(
        work,
        task={"max_test_examples": 48},
        train={"max_steps": MAX_STEPS, "eval_every": EVAL_EVERY, "num_threads": 1},
        search={"num_samples": NUM_TRIALS, "max_concurrent": 2, "scheduler": {"type": "none"}},
        resources={"cpus_per_worker": 1, "trial_runner": "in_process"},
    )
    args = ["tune", "--space", str(path), "--quiet"]
    args += ["--address", ray_cluster.address, "--tracking-uri", mlflow_server.url]
    proc = run_driver(args, work, ray_cluster.env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "Best trial" in proc.stdout and f"store {mlflow_server.url}" in proc.stdout

    # the search and its trials are in the server's store, read back through the server
    client = MlflowClient(tracking_uri=mlflow_server.url)
    experiment = client.get_experiment_by_name("tiny-dept")
    (parent,) = client.search_runs([experiment.experiment_id], "tags.`raypeft.role` = 'experiment'")
    assert parent.info.status == "FINISHED"
    kids = children(client, experiment.experiment_id, parent.info.run_id)
    assert len(kids) == NUM_TRIALS
    assert parent.data.tags["raypeft.best_run_id"] in {k.info.run_id for k in kids}
    with sqlite3.connect(f"file:{mlflow_server.db}?mode=ro", uri=True) as db:
        stored = dict(db.execute("SELECT run_uuid, status FROM runs").fetchall())
    assert stored == {r.info.run_id: "FINISHED" for r in [parent, *kids]}
    for kid in kids:  # no scheduler: every trial ran all its steps, each evaluation logged
        history = client.get_metric_history(kid.info.run_id, "val_accuracy")
        assert [h.step for h in history] == list(range(EVAL_EVERY, MAX_STEPS + 1, EVAL_EVERY))

    # the trials ran on both nodes of the cluster: two concurrent 1-CPU trials, 1 CPU a node
    placement = {}  # node id -> worker pids
    timeline = []
    for kid in sorted(kids, key=lambda k: k.info.start_time):
        tags = kid.data.tags
        node = tags["raypeft.worker_node_id"]
        assert node in ray_cluster.nodes, (node, ray_cluster.nodes)
        assert tags["raypeft.worker_node_ip"] == ray_cluster.nodes[node]["ip"]
        placement.setdefault(node, set()).add(int(tags["raypeft.worker_pid"]))
        name, pid = ray_cluster.nodes[node]["name"], tags["raypeft.worker_pid"]
        timeline.append(f"{name} pid {pid}: {kid.info.start_time} -> {kid.info.end_time} ms")
    assert set(placement) == set(ray_cluster.nodes), "\n".join(timeline)
    assert not set.intersection(*placement.values())  # one process per node, at least

    # the trained tensors were uploaded to the server: files under --artifacts-destination
    for run in [parent, *kids]:
        assert run.info.artifact_uri.startswith("mlflow-artifacts:/"), run.info.artifact_uri
    for kid in kids:
        folder = mlflow_server.artifacts / kid.info.artifact_uri[len("mlflow-artifacts:/") :]
        assert "method.prompt" in load_file(str(folder / "model" / "trainable.safetensors"))

    # the driver's working directory got no MLflow store: only the experiment file, Ray's
    # results (run.storage_path) and the Optuna study, which raypeft keeps in the working
    # directory when the MLflow store is not a local sqlite file (searcher.default_storage)
    assert sorted(os.listdir(work)) == ["experiment.yaml", "optuna.db", "ray_results"]
    assert parent.data.tags["raypeft.optuna_storage"] == f"sqlite:///{work / 'optuna.db'}"

    # this process never joined the cluster
    ray = sys.modules.get("ray")
    assert ray is None or not ray.is_initialized()

    # a trial the cluster can never place is refused after connecting, before any run:
    # each node has 1 CPU, so a 2-CPU worker fits nowhere (this machine alone would take it)
    args = ["tune", "--space", str(path), "--quiet", "--set", "resources.cpus_per_worker=2"]
    args += ["--address", ray_cluster.address, "--tracking-uri", mlflow_server.url]
    proc = run_driver(args, work, ray_cluster.env)
    assert proc.returncode == 2, proc.stderr[-3000:]
    # (besides the note that DePT's models have no peft export, printed before any check)
    errors = [
        line for line in proc.stderr.splitlines() if line.strip() and not line.startswith("note: ")
    ]
    assert len(errors) == 1 and "resources.cpus_per_worker" in errors[0], proc.stderr[-3000:]
    assert f"the cluster at {ray_cluster.address}" in errors[0]
    assert len(client.search_runs([experiment.experiment_id])) == 1 + NUM_TRIALS  # no new run
