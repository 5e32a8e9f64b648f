"""`ray up cluster/local.yaml` for real: a head and two workers, each a host of its own, with
the production stores (PostgreSQL, an S3 API).

The machines: three hosts on this machine (tests/cluster_hosts.py): 127.0.0.2 the head,
127.0.0.3 and 127.0.0.4 the workers, each with its own OpenSSH server, its own uid and home
under the one login name the launcher uses, its own /tmp and /dev/shm, and its own PID
namespace, so that the `ray stop` that cluster/node.sh runs on one host cannot see another's
processes. Everything stays on 127.0.0.0/8. The "laptop" is this test: it runs `ray up -y`
with a home of its own (its Ray token, ~/.raypeft/cluster.env) and a copy of the repository
as its checkout.

The stores (tests/servers.py): a PostgreSQL server (the team's RDS) holds MLflow's backend
store and the Optuna study, moto's S3 API server (the team's bucket) holds `run.storage_path`
and MLflow's artefacts, both on 127.0.0.1. The cluster learns of them the documented way:
~/.raypeft/cluster.env, shipped by the launcher's file mounts and read by cluster/node.sh.

The cluster file is cluster/local.yaml with these addresses, user and key, the CPU torch
build, and CPU counts that make the workers the only place trials fit (head 0, workers 1
each); every node command is the shipped one. The hosts' pip installs from a folder of
wheels made once from this venv's packages (the shared wheel cache, no download). `ray up`
installs the head in full; the workers' hosts come with the venv baked in, as a team's
machine image holds it (node.sh's setup run on w1 before `ray up`, hard-linked to w2 and,
later, to the new head), and their setup finds it up to date. Teardown ends each host (its
namespace's init ends every process in it) and the servers, by process id.

What each assertion catches is said beside it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import boto3
import optuna
import psutil
import pytest
import yaml
from filelock import FileLock
from mlflow.tracking import MlflowClient

from tests import system
from tests.cluster_hosts import (
    LOGIN,
    SSH_OPTIONS,
    Host,
    end_hosts,
    ssh_config,
    ssh_port,
    start_host,
    system_sshd,
    why_hosts_cannot_run,
)
from tests.helpers import TINY_SEARCH_BASE, assert_each_step_once, children, run_cli
from tests.servers import postgres_server, s3_server

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
ADDRESSES = {"head": "127.0.0.2", "w1": "127.0.0.3", "w2": "127.0.0.4"}
SPARE = "127.0.0.5"  # a host that is not in the cluster file: the token checks join it by hand
PEERS = [*ADDRESSES.values(), SPARE]  # every host's ssh client knows every host's port
UIDS = {"head": 20002, "w1": 20003, "w2": 20004, "spare": 20005}
PORTS = {  # off Ray's and MLflow's defaults (another Ray may use them on this machine)
    "RAYPEFT_GCS_PORT": 26379,
    "RAYPEFT_DASHBOARD_PORT": 28265,
    "RAYPEFT_CLIENT_PORT": 30001,
    "RAYPEFT_MLFLOW_PORT": 25000,
    # the head's Prometheus exporters bind fixed ports (Ray's defaults 44227, 44217) on every
    # address: a local Ray of another test holding them leaves the exporters off, silently
    "DASHBOARD_METRIC_PORT": 24227,
    "AUTOSCALER_METRIC_PORT": 24217,
}
AGENT_PORTS = {"head": 22365, "w1": 22366, "w2": 22367}  # one per host: they share loopback
GCS = f"{ADDRESSES['head']}:{PORTS['RAYPEFT_GCS_PORT']}"
DASHBOARD = f"http://127.0.0.1:{PORTS['RAYPEFT_DASHBOARD_PORT']}"
WHEELS = Path("/var/tmp/raypeft-node-wheels")
BUCKET = "raypeft-team"
INSIDE = Path("/home") / LOGIN  # every host's home, as the host sees it
EXPERIMENT = "cluster-tiny"
# Trials long enough that both run at once (a short trial ends before the other worker's
# actor is ready, and Tune hands the pending trial the free actor on the same node).
PLACED = {"max_steps": 600, "eval_every": 200}
# No backbone dropout: with it, one worker draws masks for the whole batch and two workers
# each draw theirs for half of it; without, one worker and two DDP workers train the same
# model up to summation order.
DDP_TRAIN = {"max_steps": 40, "eval_every": 10, "batch_size": 8, "head_lr": 0.01}
DDP_TRAIN["backbone_dropout"] = 0
DDP_METRICS = ("train_loss", "val_loss", "val_accuracy", "val_macro_f1")
LOST = {"max_steps": 3000, "eval_every": 100}  # a trial that outlives a killed node
UP_TO_DATE = "node.sh setup: ~/venv is up to date"
# cluster.env's lines node.sh keeps on the head (its HEAD_ONLY): the databases, the artefacts
HEAD_ONLY_KEYS = ("MLFLOW_BACKEND_STORE_URI=", "RAYPEFT_SEARCH_STORAGE=")
HEAD_ONLY_KEYS += ("MLFLOW_ARTIFACTS_DESTINATION=",)  # what node.sh's setup says of a baked venv


def run(args, timeout=600, check=True, **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, timeout=timeout, **kwargs
    )
    if check:
        assert proc.returncode == 0, f"{args[:4]}: {proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def node_wheels() -> Path:
    """Every package of this venv as a wheel, for the hosts' offline pip: made once per set."""
    freeze = run([BIN / "pip", "freeze", "--exclude-editable"]).stdout
    folder = WHEELS / hashlib.sha256(freeze.encode()).hexdigest()[:12]
    WHEELS.mkdir(mode=0o755, exist_ok=True)
    with FileLock(str(WHEELS / "build.lock")):
        if not (folder / "complete").exists():
            folder.mkdir(mode=0o755, exist_ok=True)
            (folder / "requirements.txt").write_text(freeze)
            run(
                [BIN / "pip", "download", "--quiet", "--no-deps", "-d", folder]
                + ["-r", folder / "requirements.txt", "setuptools", "wheel"],
                timeout=1200,
            )
            for path in folder.iterdir():
                path.chmod(0o644)
            (folder / "complete").touch()
    return folder


@dataclass
class Stores:
    """The team's stores: PostgreSQL (MLflow's and Optuna's databases) and an S3 bucket."""

    mlflow_db: str
    optuna_db: str
    s3_env: dict
    password: str  # the PostgreSQL password in both URIs: only the head's writers hold it

    def s3(self):
        return boto3.client("s3", **_boto_args(self.s3_env))

    def objects(self, prefix: str) -> dict[str, str]:
        """Key -> ETag (the MD5 of a single-part upload) of every object under ``prefix``."""
        found, pages = {}, self.s3().get_paginator("list_objects_v2")
        for page in pages.paginate(Bucket=BUCKET, Prefix=prefix):
            found.update({o["Key"]: o["ETag"] for o in page.get("Contents", [])})
        return found

    def mlflow(self) -> MlflowClient:
        """MLflow's store read directly in PostgreSQL (not through the head's server)."""
        return MlflowClient(tracking_uri=self.mlflow_db)


def _boto_args(env: dict) -> dict:
    return {
        "endpoint_url": env["AWS_ENDPOINT_URL"],
        "aws_access_key_id": env["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
        "region_name": env["AWS_DEFAULT_REGION"],
    }


@dataclass
class Cluster:
    work: Path
    checkout: Path  # the laptop's repository (a copy: the test ships a change from it)
    config: Path  # the generated cluster file
    env: dict  # the laptop's environment: its home, the token, the launcher's temp dir
    key: Path
    hosts: dict[str, Host]
    stores: Stores
    wheels: Path
    timings: dict = field(default_factory=dict)
    baked_setups: int = 0  # setups that found the image's venv up to date, at `ray up`

    def ray(self, *args, timeout=900, check=True) -> subprocess.CompletedProcess:
        started = time.monotonic()
        proc = run(
            [BIN / "ray", *args], timeout=timeout, cwd=self.checkout, env=self.env, check=check
        )
        self.timings.setdefault(" ".join(args[:1]), []).append(round(time.monotonic() - started))
        return proc

    def up(self) -> str:
        """`ray up`; what it printed (the head's setup among it)."""
        proc = self.ray("up", "-y", "--no-config-cache", self.config)
        return proc.stdout + proc.stderr

    def setups_up_to_date(self) -> int:
        """How many nodes the head's autoscaler set up found the venv up to date."""
        logs = (self.hosts["head"].root / "tmp" / "ray").glob("session_2*/logs/monitor.out")
        text = "".join(log.read_text(errors="replace") for log in logs)
        return text.count(UP_TO_DATE)

    def down(self) -> None:
        self.ray("down", "-y", self.config)

    def wait_for_jobs(self, timeout: float = 600) -> None:
        """Until no submitted job runs: a search's driver writes its last records (the
        registry, the report) after its parent run is marked FINISHED."""
        deadline = time.monotonic() + timeout
        while True:
            out = self.ray("job", "list", "--address", DASHBOARD, "--log-style", "record").stdout
            if not re.search(r"status=<?JobStatus\.(RUNNING|PENDING)|'(RUNNING|PENDING)'", out):
                return
            assert time.monotonic() < deadline, out[-3000:]
            time.sleep(2)

    def alive_nodes(self) -> dict[str, str]:
        """Node id -> address of every ALIVE node, from Ray's state API on the head."""
        out = self.ray("list", "nodes", "--address", DASHBOARD, "--format", "json").stdout
        nodes = json.loads(out[out.index("[") :])
        return {n["node_id"]: n["node_ip"] for n in nodes if n["state"] == "ALIVE"}

    def wait_for_nodes(self, count: int, timeout: float = 600) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while len(nodes := self.alive_nodes()) != count:
            assert time.monotonic() < deadline, f"{len(nodes)} of {count} nodes: {nodes}"
            time.sleep(3)
        return nodes

    def submit(self, space: str, *tune_args: str, wait: bool = True, check: bool = True):
        """A search submitted as a Ray job, naming no store: the cluster's are the defaults."""
        args = ["job", "submit", "--address", DASHBOARD] + ([] if wait else ["--no-wait"])
        args += ["--", "raypeft", "tune", "--space", f"{INSIDE}/raypeft/cluster-test/{space}"]
        return self.ray(*args, "--address", "auto", "--quiet", *tune_args, check=check)


def experiment(name: str, train: dict, **sections) -> dict:
    return {
        "name": name,
        **TINY_SEARCH_BASE,
        "train": {**TINY_SEARCH_BASE["train"], **train},
        **sections,
    }


SPACES = {
    # two trials at once, one CPU each: only the workers have CPUs
    "placed.yaml": experiment(
        EXPERIMENT,
        PLACED,
        space={"method.lr_prompt": {"grid": [0.3, 0.5]}},
        search={"num_samples": 2, "max_concurrent": 2, "scheduler": {"type": "none"}},
    ),
    # one trial, two Ray Train workers (gloo), one CPU each
    "ddp.yaml": experiment(
        "cluster-ddp",
        DDP_TRAIN,
        space={"method.lr_prompt": {"grid": [0.3]}, "method.lr_lowrank": {"grid": [1.0e-3]}},
        search={"num_samples": 1, "scheduler": {"type": "none"}},
        resources={"trial_runner": "ray_train", "workers_per_trial": 2},
    ),
    # one long trial that loses its node
    "lost.yaml": experiment(
        "cluster-lost",
        LOST,
        space={"method.lr_prompt": {"grid": [0.3]}},
        search={"num_samples": 1, "scheduler": {"type": "none"}},
        run={"max_failures": 2},
    ),
    # two long trials, one at a time: a search the next `ray up` must let continue
    "resumed.yaml": experiment(
        "cluster-resumed",
        {"max_steps": 400, "eval_every": 40},
        space={"method.lr_prompt": {"grid": [0.3, 0.5]}},
        search={"num_samples": 2, "max_concurrent": 1, "scheduler": {"type": "none"}},
    ),
}


# ----------------------------------------------------------------------------- set-up


def _write_as(host: Host, relative: str, text: str, mode=0o644) -> Path:
    path = host.home / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    for part in [path, *path.relative_to(host.home).parents]:
        os.chown(host.home / part, host.uid, host.uid)
    return path


def _prepare(host: Host, wheels: Path, agent_port: int | None) -> None:
    """What the host's owner set up before the first `ray up`: pip's wheel folder (this
    machine has no package index) and the ports Ray cannot choose by itself."""
    _write_as(host, ".config/pip/pip.conf", f"[global]\nno-index = true\nfind-links = {wheels}\n")
    ports = dict(PORTS, RAYPEFT_AGENT_PORT=agent_port) if agent_port else PORTS
    _write_as(host, ".bashrc", "export " + " ".join(f"{k}={v}" for k, v in ports.items()) + "\n")


def _bake_venv(host: Host, checkout: Path, key: Path) -> None:
    """What a team bakes into its machine image: the repository and the venv node.sh's
    setup makes, installed on ``host`` before the first `ray up` (whose setup then finds it
    up to date). The head is not baked: `ray up` installs it in full."""
    shutil.copytree(checkout, host.home / "raypeft", symlinks=True)
    for folder, _, files in os.walk(host.home / "raypeft"):  # the host's user owns its copy
        for path in [folder, *(os.path.join(folder, f) for f in files)]:
            os.lchown(path, host.uid, host.uid)
    torch_index = "https://download.pytorch.org/whl/cpu"
    proc = host.ssh(key, f"bash ~/raypeft/cluster/node.sh setup {torch_index}", timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def _give_venv(host: Host, image: Host) -> None:
    """``image``'s baked venv on ``host`` too, as the same machine image gives it: hard
    links (every host sees it at the same path), its folders the host user's own, so that
    Python can write byte code there."""
    run(["cp", "-al", image.home / "venv", host.home / "venv"])
    for folder, _, _ in os.walk(host.home / "venv"):
        os.lchown(folder, host.uid, host.uid)


def _laptop(work: Path, stores: Stores) -> tuple[Path, dict]:
    home = work / "laptop"
    (home / ".raypeft").mkdir(parents=True)
    checkout = work / "checkout"
    files = run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO).stdout.split("\n")
    for name in filter(None, files):
        if (REPO / name).is_file():
            (checkout / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, checkout / name)
    (checkout / "cluster-test").mkdir()
    for name, space in SPACES.items():
        (checkout / "cluster-test" / name).write_text(yaml.safe_dump(space))
    # the documented production stores (cluster/cluster.env.example)
    cluster_env = {
        "MLFLOW_BACKEND_STORE_URI": stores.mlflow_db,
        "MLFLOW_ARTIFACTS_DESTINATION": f"s3://{BUCKET}/mlflow-artifacts",
        "RAYPEFT_SEARCH_STORAGE": stores.optuna_db,
        "RAYPEFT_STORAGE_PATH": f"s3://{BUCKET}/ray_results",
        **stores.s3_env,
    }
    env_file = home / ".raypeft" / "cluster.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in cluster_env.items()))
    env_file.chmod(0o600)
    # the hosts' SSH ports, in the laptop's ssh config; OpenSSH reads the config of the
    # user's passwd home, not $HOME, so the laptop's `ssh` (the launcher's and rsync's) is
    # told where its home's config is
    (home / ".ssh").mkdir(mode=0o700)
    (home / ".ssh" / "config").write_text(ssh_config(PEERS))
    (home / "bin").mkdir()
    (home / "bin" / "ssh").write_text(
        f'#!/bin/sh\nexec {shutil.which("ssh")} -F "$HOME/.ssh/config" "$@"\n'
    )
    (home / "bin" / "ssh").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "MLFLOW_", "AWS_"))}
    env.update(HOME=str(home), RAY_TMPDIR=str(work / "launcher"), RAY_AUTH_MODE="token")
    env.update(PATH=f"{home / 'bin'}:{BIN}:{env['PATH']}", RAY_USAGE_STATS_ENABLED="0")
    (work / "launcher").mkdir()
    run([BIN / "ray", "get-auth-token", "--generate"], env=env)
    return checkout, env


def _cluster_file(work: Path, key: Path) -> Path:
    """cluster/local.yaml with the hosts' addresses, the login and key, the CPU torch build,
    and the CPUs each node offers Ray."""
    config = yaml.safe_load((REPO / "cluster" / "local.yaml").read_text())
    config["cluster_name"] = f"raypeft-test-{os.getpid()}"
    config["provider"].update(
        head_ip=ADDRESSES["head"], worker_ips=[ADDRESSES["w1"], ADDRESSES["w2"]]
    )
    config["auth"] = {"ssh_user": LOGIN, "ssh_private_key": str(key)}
    (setup,) = config["setup_commands"]
    assert setup.endswith(" https://download.pytorch.org/whl/cu128"), setup
    config["setup_commands"] = [setup.replace("/whl/cu128", "/whl/cpu")]
    head_ray, mlflow = config["head_start_ray_commands"]
    config["head_start_ray_commands"] = [head_ray + " --num-cpus=0", mlflow]
    (worker_ray,) = config["worker_start_ray_commands"]
    config["worker_start_ray_commands"] = [worker_ray + " --num-cpus=1"]
    path = work / "cluster.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def cluster():
    cannot = why_hosts_cannot_run()
    if cannot:
        package, why = cannot
        if package:  # in the suite's summary of lost coverage; a failure in CI
            system.missing(package, f"the cluster's hosts: {why}")
        pytest.skip(why)
    # one such cluster per machine at a time: the addresses, uids and ports are fixed
    with FileLock("/tmp/raypeft-cluster-up.lock"):
        work = Path(tempfile.mkdtemp(prefix="rpc-", dir="/var/tmp"))
        work.chmod(0o755)
        hosts: dict[str, Host] = {}
        timings: dict = {}
        try:
            with (
                system_sshd(work / "system-sshd"),
                postgres_server(work) as pg,
                s3_server(work) as s3,
            ):
                s3.create_bucket(BUCKET)
                stores = Stores(
                    pg.create_database("mlflow"),
                    pg.create_database("optuna"),
                    dict(s3.env),
                    pg.password,
                )
                started = time.monotonic()
                wheels = node_wheels()
                timings["wheel folder"] = [round(time.monotonic() - started)]
                run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", work / "id"])
                public = (work / "id.pub").read_text()
                for name, address in ADDRESSES.items():
                    hosts[name] = start_host(name, address, work / name, UIDS[name], public, PEERS)
                    _prepare(hosts[name], wheels, AGENT_PORTS[name])
                checkout, env = _laptop(work, stores)
                cluster = Cluster(
                    work,
                    checkout,
                    _cluster_file(work, work / "id"),
                    env,
                    work / "id",
                    hosts,
                    stores,
                    wheels,
                    timings,
                )
                started = time.monotonic()
                _bake_venv(hosts["w1"], checkout, work / "id")
                _give_venv(hosts["w2"], hosts["w1"])
                timings["workers' image"] = [round(time.monotonic() - started)]
                cluster.up()
                started = time.monotonic()
                cluster.wait_for_nodes(3)
                timings["workers joined after up"] = [round(time.monotonic() - started)]
                cluster.baked_setups = cluster.setups_up_to_date()
                yield cluster
        finally:
            # no `ray down` (test_a_new_head_... runs it): ending a host ends all it runs
            end_hosts(list(hosts.values()))
            left = {name: host.processes() for name, host in hosts.items()}
            shutil.rmtree(work, ignore_errors=True)
            print(f"cluster timings (s): {timings}")
        assert not any(left.values()), f"processes survived their host: {left}"


# ----------------------------------------------------------------------------- helpers


def role(proc: psutil.Process, host: Host) -> str:
    """What a process of a cluster host is, in the words of docs/security.md's table."""
    try:
        name, command = proc.name(), " ".join(proc.cmdline())
        # its ancestors in the host, up to the host's init (beyond it: pytest's own)
        ancestors = []
        for parent in proc.parents():
            if parent.pid == host.init.pid:
                break
            ancestors.append(parent)
        lineage = " ".join(" ".join(p.cmdline()) for p in [proc, *ancestors])
    except psutil.NoSuchProcess:
        return "gone"
    if name in ("gcs_server", "raylet") or name.startswith("sshd"):
        return name.split(":")[0]
    if "raypeft tune" in command:  # the job's entrypoint (`ray job submit -- raypeft tune`)
        return "job driver"
    if "mlflow" in lineage:  # the server and the workers it spawns
        return "mlflow server"
    for marker, label in (
        ("DashboardAgent", "dashboard agent"),
        ("dashboard/agent.py", "dashboard agent"),
        ("RuntimeEnvAgent", "runtime env agent"),
        ("runtime_env/agent/main.py", "runtime env agent"),
        ("dashboard/dashboard.py", "dashboard"),
        ("ray-dashboard-", "dashboard"),
        ("ray.util.client.server", "ray client server"),
        ("log_monitor.py", "log monitor"),
        ("monitor.py", "autoscaler"),
        ("ray::", "ray worker"),
        ("default_worker.py", "ray worker"),
    ):
        if marker in name or marker in command:
            return label
    return name


def listening(host: Host) -> dict[tuple[str, str], str]:
    """(role, address kind) -> one process's command line, for every listening TCP socket of
    the host's processes: address kind is ``loopback`` (127.0.0.1), ``node`` (the host's own
    address) or ``wildcard``."""
    pids = {p.pid: p for p in host.processes()}
    found = {}
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status != psutil.CONN_LISTEN or conn.pid not in pids:
            continue
        ip = conn.laddr.ip.removeprefix("::ffff:")
        kind = {"127.0.0.1": "loopback", host.address: "node", "0.0.0.0": "wildcard"}.get(ip)
        kind = kind or ("wildcard" if ip == "::" else ip)
        proc = pids[conn.pid]
        if role(proc, host) != "sshd":
            try:
                command = " ".join(proc.cmdline())[:300]
            except psutil.NoSuchProcess:
                command = "gone"
            found[(role(proc, host), kind)] = f"{proc.pid} :{conn.laddr.port} {command}"
    return found


def socket_table() -> dict[tuple[str, str], set[str]]:
    """docs/security.md's table of a cluster's sockets: (role, address kind) -> node kinds."""
    text = (REPO / "docs" / "security.md").read_text()
    section = text.split("## Every socket of a cluster", 1)[1].split("\n## ", 1)[0]
    table = {}
    for line in section.splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) >= 4 and cells[0] not in ("process", "---") and not cells[0].startswith("-"):
            table[(cells[0], cells[2])] = {n.strip() for n in cells[1].split(",")}
    return table


def trial_histories(client: MlflowClient, run_id: str) -> dict[str, list[tuple[int, float]]]:
    return {
        name: sorted((m.step, m.value) for m in client.get_metric_history(run_id, name))
        for name in DDP_METRICS
    }


def the_search(client: MlflowClient, name: str):
    """The newest search's parent run of experiment ``name`` and its trial runs."""
    experiment_ = client.get_experiment_by_name(name)
    parents = client.search_runs(
        [experiment_.experiment_id],
        "tags.`raypeft.role` = 'experiment'",
        order_by=["attributes.start_time DESC"],
    )
    parent = parents[0]
    return parent, children(client, experiment_.experiment_id, parent.info.run_id)


def namespace_pids(host: Host) -> set[int]:
    """The pids of the host's processes as the host itself numbers them (NSpid's last)."""
    pids = set()
    for proc in host.processes():
        try:
            status = Path(f"/proc/{proc.pid}/status").read_text()
        except OSError:
            continue
        (line,) = [x for x in status.splitlines() if x.startswith("NSpid:")]
        pids.add(int(line.split()[-1]))
    return pids


def host_of(cluster: Cluster, node_id: str) -> str:
    ip = cluster.alive_nodes()[node_id]
    return next(name for name, address in ADDRESSES.items() if address == ip)


NOT_TRIALS = {"ray::IDLE", "ray::DashboardAgent", "ray::RuntimeEnvAgent"}  # every node has


def trials_on(host: Host) -> list[psutil.Process]:
    """The host's Ray worker processes busy with a task or actor (a trial, on a worker)."""
    found = []
    for proc in host.user_processes():
        try:
            title = " ".join(proc.cmdline())
        except psutil.NoSuchProcess:
            continue
        if title.startswith("ray::") and title.split()[0] not in NOT_TRIALS:
            found.append(proc)
    return found


@dataclass
class Seen:
    """One process of a host as read while a search ran: its role, command line, environment."""

    role: str
    command: str
    environ: dict


@dataclass
class Busy:
    """placed.yaml run as a job, and every host's processes read while both trials trained."""

    output: str  # what `ray job submit` printed
    processes: dict[str, list[Seen]]  # host name -> its processes
    sockets: dict[str, dict]  # host name -> its listening sockets (:func:`listening`)


def read_processes(host: Host) -> list[Seen]:
    seen = []
    for proc in host.processes():
        try:
            seen.append(Seen(role(proc, host), " ".join(proc.cmdline()), proc.environ()))
        except psutil.NoSuchProcess:
            continue
    return seen


@pytest.fixture(scope="module")
def busy(cluster) -> Busy:
    """The search every test that needs one finished search shares (the champion of
    EXPERIMENT among it): submitted as a job, naming no store, and while both its trials
    train on the workers, every host's processes are read."""
    submitted = {}
    job = threading.Thread(target=lambda: submitted.update(proc=cluster.submit("placed.yaml")))
    job.start()
    processes = sockets = None
    try:
        while job.is_alive() and processes is None:
            if all(trials_on(cluster.hosts[name]) for name in ("w1", "w2")):
                processes = {name: read_processes(h) for name, h in cluster.hosts.items()}
                sockets = {name: listening(h) for name, h in cluster.hosts.items()}
            time.sleep(0.2)
    finally:
        job.join()
    assert "proc" in submitted, "the job's submission raised"
    # catches: trials too short to be seen at work (the reads would prove nothing)
    assert processes is not None, submitted["proc"].stdout[-3000:]
    return Busy(submitted["proc"].stdout, processes, sockets)


# ----------------------------------------------------------------------------- tests


def test_workers_join_through_the_launcher_and_each_host_sees_only_itself(cluster):
    nodes = cluster.wait_for_nodes(3)
    # `ray status`'s count (the autoscaler's view) agrees with the state API's: three nodes
    status = cluster.hosts["head"].ssh(cluster.key, "ray status")
    assert status.returncode == 0, status.stderr[-2000:]
    assert re.search(r"Active:\n\s*3 local\.cluster\.node\n", status.stdout), status.stdout
    # catches: CPUs on the head (trials would land there) or a worker's CPUs not its own 1
    out = cluster.ray("list", "nodes", "--address", DASHBOARD, "--format", "json", "--detail")
    cpus = {
        n["node_ip"]: n["resources_total"].get("CPU", 0)
        for n in json.loads(out.stdout[out.stdout.index("[") :])
        if n["state"] == "ALIVE"
    }
    assert cpus == {ADDRESSES["head"]: 0, ADDRESSES["w1"]: 1, ADDRESSES["w2"]: 1}, cpus
    # catches: a worker that joined with another node's address, or a node counted twice
    assert sorted(nodes.values()) == sorted(ADDRESSES.values()), nodes
    for name in ("w1", "w2"):
        host = cluster.hosts[name]
        # catches: worker_start_ray_commands not run (or run on the wrong host): the raylet
        # of this host was started by node.sh joining the head's GCS at its own address
        (raylet,) = host.named("raylet")
        command = raylet.cmdline()
        assert f"--node_ip_address={host.address}" in command, command
        assert any(a.endswith(f"-address={GCS}") for a in command), command
        # catches: a raylet started without node.sh's token setting (that a node without the
        # token is refused: test_a_node_joins_only_with_the_clusters_token)
        assert raylet.environ().get("RAY_AUTH_MODE") == "token"
        assert not host.named("gcs_server")  # catches: a worker that started a head of its own
        # catches: the workers' file mounts not shipped (the repository, the token, the stores)
        assert (host.home / "raypeft" / "cluster" / "node.sh").is_file()
        laptop = Path(cluster.env["HOME"])
        assert (host.home / ".ray" / "auth_token").read_text() == (
            laptop / ".ray" / "auth_token"
        ).read_text()
        # the stores' file as the head split it: the laptop's lines but the databases'
        shipped = (host.home / ".raypeft" / "cluster.env").read_text().splitlines()
        laptop_lines = (laptop / ".raypeft" / "cluster.env").read_text().splitlines()
        assert shipped[1:] == [
            line for line in laptop_lines if not line.startswith(HEAD_ONLY_KEYS)
        ], shipped
        # the worker's venv, raypeft in it (baked: _bake_venv)
        assert (host.home / "venv" / "bin" / "raypeft").is_file()
    # catches: setup_commands not run on a worker: the head's autoscaler ran node.sh's setup
    # on each, which found the image's venv up to date (the head's was installed in full);
    # counted at `ray up`, before any other test's node came back
    assert cluster.baked_setups == 2
    # catches: hosts that share a process namespace: `ps` on w1 sees exactly the processes
    # this machine sees in w1's namespace (by their pids inside it), but for the ones of its
    # own SSH session
    w1 = cluster.hosts["w1"]
    before = namespace_pids(w1)
    inside = {}
    for line in w1.ssh(cluster.key, "ps -e -o pid=,comm=").stdout.splitlines():
        pid, comm = line.split(None, 1)
        inside[int(pid)] = comm
    after = namespace_pids(w1)
    session = {pid for pid, c in inside.items() if c.startswith("sshd") or c in ("bash", "ps")}
    assert before & after <= set(inside), (sorted(before & after), inside)
    assert set(inside) - session <= before | after, (inside, sorted(before | after))
    assert list(inside.values()).count("raylet") == 1 and "gcs_server" not in inside.values()


def test_a_node_joins_only_with_the_clusters_token(cluster, tmp_path):
    """`ray start` on a spare host, as node.sh would run it, with a wrong token and with
    none (refused, saying why) and, as the positive control, with the cluster's token
    (joins; then stopped on that host alone). The spare host has w2's venv (hard links: the
    same path in every host, no second install)."""
    public = (cluster.work / "id.pub").read_text()
    spare = start_host("spare", SPARE, cluster.work / "spare", UIDS["spare"], public, PEERS)
    try:
        run(["cp", "-al", cluster.hosts["w2"].home / "venv", spare.home / "venv"])
        token = (Path(cluster.env["HOME"]) / ".ray" / "auth_token").read_text().strip()
        join = (
            f"timeout 90 {INSIDE}/venv/bin/ray start --address={GCS} --node-ip-address={SPARE} "
            "--num-cpus=0 --dashboard-agent-listen-port=22368 --disable-usage-stats"
        )
        refused = {
            "a wrong token": f"RAY_AUTH_MODE=token RAY_AUTH_TOKEN=not-the-token {join}",
            "no token": f"RAY_AUTH_MODE=disabled {join}",
        }
        for why, command in refused.items():
            proc = spare.ssh(cluster.key, command)
            output = proc.stdout + proc.stderr
            # catches: a join that hangs until the timeout (124) passing for a refusal
            assert proc.returncode not in (0, 124), (why, proc.returncode, output[-2000:])
            assert re.search(
                r"(?i)unauthenticated|auth.*token|token.*(invalid|mismatch)", output
            ), (
                why,
                output[-2000:],
            )
            assert len(cluster.alive_nodes()) == 3, why  # catches: a refused node counted
        joined = spare.ssh(cluster.key, f"RAY_AUTH_MODE=token RAY_AUTH_TOKEN={token} {join}")
        assert joined.returncode == 0, joined.stdout[-2000:] + joined.stderr[-2000:]
        assert SPARE in cluster.wait_for_nodes(4).values()  # the control: the token joins
        # `ray stop` on the spare host stops its node alone (its own namespace)
        assert spare.ssh(cluster.key, f"{INSIDE}/venv/bin/ray stop").returncode == 0
        assert sorted(cluster.wait_for_nodes(3).values()) == sorted(ADDRESSES.values())
    finally:
        spare.end()


def test_a_search_submitted_as_a_job_places_trials_on_both_workers(cluster, busy):
    # catches: a job whose driver cannot reach the stores the head's environment names
    assert "Search finished" in busy.output and "succeeded" in busy.output, busy.output[-3000:]
    client = cluster.stores.mlflow()  # read in PostgreSQL itself, not through the server
    parent, kids = the_search(client, EXPERIMENT)
    assert parent.info.status == "FINISHED" and len(kids) == 2
    assert all(k.info.status == "FINISHED" for k in kids)
    # catches: trials placed on one node (or on the head): each ran on its own worker
    where = {host_of(cluster, k.data.tags["raypeft.worker_node_id"]) for k in kids}
    assert where == {"w1", "w2"}, where
    # catches: a champion that is not the search's chosen trial
    champion = client.get_model_version_by_alias(EXPERIMENT, "champion")
    assert champion.run_id == parent.data.tags["raypeft.best_run_id"]
    # the stores: the study in PostgreSQL, checkpoints and artefacts in the bucket
    # catches: RAYPEFT_SEARCH_STORAGE / RAYPEFT_STORAGE_PATH not reaching the job's driver
    study = optuna.load_study(study_name=EXPERIMENT, storage=cluster.stores.optuna_db)
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE] * 2
    assert any("/checkpoint_" in key for key in cluster.stores.objects("ray_results/"))
    artefacts = cluster.stores.objects("mlflow-artifacts/")
    for kid in kids:  # catches: artefacts written to the head's disk instead of S3
        assert any(kid.info.run_id in key and key.endswith(".safetensors") for key in artefacts)
    for host in cluster.hosts.values():  # catches: a store left on a node's own disk
        assert not (host.home / "ray_results").exists()
        state = host.home / "raypeft-state"
        assert not (state / "mlflow.db").exists() and not (state / "mlartifacts").exists()
        assert not list(host.home.rglob("optuna.db"))
    # catches: a trial no node can place (each worker has 1 CPU) left pending for ever, or
    # refused only after runs were created: one line naming the key and the cluster, no run
    refused = cluster.submit("placed.yaml", "--set", "resources.cpus_per_worker=2", check=False)
    assert refused.returncode != 0, refused.stdout[-3000:]
    assert re.search(r"resources\.cpus_per_worker.*the cluster at auto", refused.stdout), (
        refused.stdout[-3000:]
    )
    assert len(client.search_runs([parent.info.experiment_id])) == 1 + len(kids)


def test_a_ddp_trial_trains_across_both_workers_as_one_node_does(cluster, tmp_path):
    proc = cluster.submit("ddp.yaml")
    # catches: a Ray Train trial that cannot read its checkpoints back from S3
    assert "Search finished" in proc.stdout, proc.stdout[-3000:]
    client = cluster.stores.mlflow()
    _, (kid,) = the_search(client, "cluster-ddp")
    # catches: both DDP workers on one node: Ray's state API names each worker actor's node
    out = cluster.ray(
        "list", "actors", "--address", DASHBOARD, "--format", "json", "--detail", "--limit", "1000"
    ).stdout
    actors = [a for a in json.loads(out[out.index("[") :]) if a["class_name"] == "RayTrainWorker"]
    assert len(actors) == 2, actors
    assert {host_of_any(cluster, a["node_id"]) for a in actors} == {"w1", "w2"}

    # the same trial on one node here, with one worker trained inside its Tune trial (the
    # default runner): the same global batches (raypeft.training.sampler.GlobalBatchSampler),
    # so DDP's averaged gradient is the whole batch's (this is the suite's DDP test)
    local = dict(SPACES["ddp.yaml"], resources={})
    (tmp_path / "one.yaml").write_text(yaml.safe_dump(local))
    results = f"run.storage_path={tmp_path / 'ray_results'}"  # not ~/ray_results
    one = run_cli(
        ["tune", "--space", str(tmp_path / "one.yaml"), "--quiet", "--set", results], cwd=tmp_path
    )
    assert one.returncode == 0, one.stderr[-3000:]
    here = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    _, (reference,) = the_search(here, "cluster-ddp")
    a, b = trial_histories(here, reference.info.run_id), trial_histories(client, kid.info.run_id)
    for name in DDP_METRICS:  # catches: a DDP across nodes that does not average gradients
        assert [s for s, _ in a[name]] == [10, 20, 30, 40] == [s for s, _ in b[name]], name
        for (step, x), (_, y) in zip(a[name], b[name], strict=True):
            assert math.isclose(x, y, rel_tol=1e-3, abs_tol=1e-4), (name, step, x, y)
    # catches: a comparison of two untouched models (the loss moved: both trained)
    losses = [v for _, v in a["train_loss"]]
    assert losses[0] != losses[-1]


def host_of_any(cluster: Cluster, node_id: str) -> str:
    """The host of a node, dead or alive (Ray's state API keeps dead nodes)."""
    out = cluster.ray("list", "nodes", "--address", DASHBOARD, "--format", "json").stdout
    (node,) = [n for n in json.loads(out[out.index("[") :]) if n["node_id"] == node_id]
    return next(name for name, address in ADDRESSES.items() if address == node["node_ip"])


def test_database_passwords_stay_with_the_heads_writers(cluster, busy):
    """Read while both trials trained: no worker process (the trials among them) has the
    database password in its environment, no worker's disk holds it, no process of any
    host has it on its command line, and on the head only the MLflow server and the job
    driver may hold it."""
    secret = cluster.stores.password
    for name, processes in busy.processes.items():
        for seen in processes:
            # catches: a password on a command line (`ps` shows every user's)
            assert secret not in seen.command, (name, seen.role, seen.command)
    for name in ("w1", "w2"):
        holders = [s for s in busy.processes[name] if secret in "\0".join(s.environ.values())]
        # catches: cluster.env's database lines exported into a worker's Ray (and so trials)
        assert not holders, (name, [(s.role, s.command[:200]) for s in holders])
        # catches: the secrets shipped to a worker's disk (its venv is the image's, made
        # before the cluster had secrets: left out, 2 GB)
        found = run(
            ["grep", "-rlsF", "--exclude-dir=venv", secret, cluster.hosts[name].home]
            + [cluster.hosts[name].root / "tmp"],
            check=False,
        )
        assert found.returncode == 1 and not found.stdout, found.stdout
    # the trials were among the processes read: each worker ran one
    for name in ("w1", "w2"):
        titles = {s.command.split()[0] for s in busy.processes[name] if s.command}
        assert any(t.startswith("ray::") and t not in NOT_TRIALS for t in titles), titles
    head = busy.processes["head"]
    holders = {s.role for s in head if secret in "\0".join(s.environ.values())}
    # catches: the database URIs in the head's Ray (every Ray process there would have them)
    assert holders <= {"mlflow server", "job driver"} and "mlflow server" in holders, holders
    # the driver got the path of the head's secrets file, not the secrets (node.sh)
    drivers = [s for s in head if s.role == "job driver"]
    assert drivers and all("RAYPEFT_SECRETS_FILE" in s.environ for s in drivers)
    head_env = cluster.hosts["head"].home / ".raypeft" / "head.env"
    assert head_env.stat().st_mode & 0o777 == 0o600 and secret in head_env.read_text()
    for seen in psutil.process_iter(["cmdline"]):  # nor anywhere on this machine
        assert secret not in " ".join(seen.info["cmdline"] or []), seen.info["cmdline"]


def test_every_listening_socket_is_in_the_security_table(cluster, busy):
    """Every socket, read while a search's trials trained (its driver and trial workers
    listen then; Ray ends idle workers soon after) and again now."""
    table = socket_table()
    seen = {}
    readings = [(name, busy.sockets[name]) for name in cluster.hosts]
    readings += [(name, listening(host)) for name, host in cluster.hosts.items()]
    for name, sockets in readings:
        kind = "head" if name == "head" else "worker"
        for found, process in sockets.items():
            seen.setdefault(found, set()).add(kind)
            # catches: a socket nobody documented, or one on a wider address than documented
            assert found in table and kind in table[found], (name, found, process, sorted(table))
    # catches: MLflow or the dashboard and job API on anything but the head's loopback
    assert ("mlflow server", "loopback") in seen and ("dashboard", "loopback") in seen
    for host in cluster.hosts.values():
        pids = {p.pid for p in host.processes()}
        for conn in psutil.net_connections(kind="tcp"):
            port = conn.laddr.port
            if (
                conn.status == psutil.CONN_LISTEN
                and conn.pid in pids
                and port
                in (
                    PORTS["RAYPEFT_MLFLOW_PORT"],
                    PORTS["RAYPEFT_DASHBOARD_PORT"],
                )
            ):
                assert conn.laddr.ip == "127.0.0.1", (host.name, conn)
    # catches: a stale table (a row Ray no longer opens) that would hide a new socket's row
    assert set(table) <= set(seen), sorted(set(table) - set(seen))
    for host in cluster.hosts.values():  # catches: traffic leaving 127.0.0.0/8
        for conn in psutil.net_connections(kind="tcp"):
            if conn.pid in {p.pid for p in host.processes()} and conn.raddr:
                assert conn.raddr.ip.removeprefix("::ffff:").startswith("127."), conn


def test_a_worker_lost_mid_trial_resumes_from_its_checkpoint_on_the_other(cluster):
    cluster.submit("lost.yaml", wait=False)
    client = cluster.stores.mlflow()
    deadline = time.monotonic() + 600
    while True:  # wait for the trial's second checkpoint (its evaluation at step 200)
        assert time.monotonic() < deadline, "the trial never reported"
        try:
            _, kids = the_search(client, "cluster-lost")
        except (AttributeError, IndexError):  # the experiment or its parent is not there yet
            kids = []
        steps = [
            m.step for k in kids for m in client.get_metric_history(k.info.run_id, "val_accuracy")
        ]
        if kids and max(steps, default=0) >= 2 * LOST["eval_every"]:
            break
        time.sleep(1)
    (kid,) = kids
    lost = host_of(cluster, kid.data.tags["raypeft.worker_node_id"])
    survivor = {"w1": "w2", "w2": "w1"}[lost]
    # the node is lost: every Ray process of the host, by pid (SIGKILL: no goodbye)
    ray_processes = cluster.hosts[lost].user_processes()
    assert any(p.name() == "raylet" for p in ray_processes)
    for proc in ray_processes:
        proc.send_signal(signal.SIGKILL)
    psutil.wait_procs(ray_processes, timeout=30)

    deadline = time.monotonic() + 900
    while client.get_run(kid.info.run_id).info.status == "RUNNING":
        assert time.monotonic() < deadline, "the trial never finished after its node was lost"
        time.sleep(3)
    run_ = client.get_run(kid.info.run_id)
    assert run_.info.status == "FINISHED"  # catches: a trial failed by the lost node
    # catches: a restart from scratch (or no restart): it continued from a checkpoint
    assert int(run_.data.tags["raypeft.resumed_from_step"]) >= 2 * LOST["eval_every"]
    # catches: a restart on the lost node (or the head): it moved to the other worker
    assert host_of_any(cluster, run_.data.tags["raypeft.worker_node_id"]) == survivor
    # catches: evaluations lost or logged twice across the restart
    assert_each_step_once(client, kid.info.run_id, LOST["max_steps"], LOST["eval_every"])
    parent, _ = the_search(client, "cluster-lost")
    deadline = time.monotonic() + 300
    while client.get_run(parent.info.run_id).info.status == "RUNNING":
        assert time.monotonic() < deadline
        time.sleep(2)
    # catches: a search that ends (or hangs) with its node
    assert client.get_run(parent.info.run_id).info.status == "FINISHED"
    # the lost worker is set up and joined again by the head's autoscaler
    cluster.wait_for_nodes(3, timeout=600)


def tune_snapshot(cluster: Cluster) -> str:
    """The text of Tune's experiment snapshots of the searches in the bucket (what a resumed
    search restores its trials from)."""
    s3 = cluster.stores.s3()
    keys = [k for k in cluster.stores.objects("ray_results/") if "/experiment_state" in k]
    return "".join(s3.get_object(Bucket=BUCKET, Key=k)["Body"].read().decode() for k in keys)


def snapshot(cluster: Cluster) -> dict:
    """What must survive: every run (id, status, metrics), every artefact's digest, every
    Optuna trial's state, read in the stores themselves."""
    client = cluster.stores.mlflow()
    runs = {}
    for exp in client.search_experiments():
        for r in client.search_runs([exp.experiment_id], max_results=1000):
            runs[r.info.run_id] = (r.info.status, r.data.metrics)
    trials = {}
    for summary in optuna.get_all_study_summaries(cluster.stores.optuna_db):
        study = optuna.load_study(study_name=summary.study_name, storage=cluster.stores.optuna_db)
        trials[summary.study_name] = [(t.number, t.state.name, t.values) for t in study.trials]
    return {
        "runs": runs,
        "artefacts": cluster.stores.objects("mlflow-artifacts/"),
        "trials": trials,
    }


def test_a_new_head_keeps_every_run_artefact_and_study_and_the_search_resumes(cluster):
    """`ray down`, then `ray up` onto a head that is a new machine (a new disk from the
    workers' image at the same address, nothing of the old head's: what a changed head
    node_config gets on a cloud) with a code change: every run, artefact and trial is still
    there, and `--resume` finishes the interrupted search."""
    client = cluster.stores.mlflow()
    cluster.wait_for_jobs()  # every other search's driver has written its last record
    cluster.submit("resumed.yaml", wait=False)
    deadline = time.monotonic() + 600
    while True:  # the window: the first trial finished (its model logged), the second at work
        assert time.monotonic() < deadline, "the search never reached its second trial"
        try:
            parent, kids = the_search(client, "cluster-resumed")
        except (AttributeError, IndexError):
            kids = []
        done = [k for k in kids if k.info.status == "FINISHED"]
        if (
            done
            # its model's files in the bucket (the store's client cannot list an
            # mlflow-artifacts: URI, only the head's server can)
            and any(
                f"{done[0].info.run_id}/artifacts/model/" in key
                for key in cluster.stores.objects("mlflow-artifacts/")
            )
            and any("val_accuracy" in k.data.metrics for k in kids if k.info.status == "RUNNING")
        ):
            break
        time.sleep(0.5)
    # catches: a test that brings the head down after the search ended (nothing to resume)
    assert client.get_run(parent.info.run_id).info.status == "RUNNING"

    cluster.down()
    before = snapshot(cluster)
    # the trials Tune's last snapshot in the bucket did not know (it snapshots every 10 s or
    # more, longer when saving takes long: a busy head): `--resume` trains their
    # configurations again as new trials and closes their runs (docs/reliability.md)
    saved, (_, at_down) = tune_snapshot(cluster), the_search(client, "cluster-resumed")
    unsnapshotted = {k.info.run_id for k in at_down if k.data.tags["raypeft.trial_id"] not in saved}
    print(f"trials' runs Tune's last snapshot did not know: {sorted(unsnapshotted)}")
    old = cluster.hosts["head"]
    old.end()
    assert not old.processes()  # catches: a head process outliving its machine
    cluster.hosts["head"] = start_host(
        "head",
        ADDRESSES["head"],
        cluster.work / "head-2",
        UIDS["head"],
        (cluster.work / "id.pub").read_text(),
        PEERS,
    )
    _prepare(cluster.hosts["head"], cluster.wheels, AGENT_PORTS["head"])
    _give_venv(cluster.hosts["head"], cluster.hosts["w1"])
    shipped = cluster.checkout / "cluster-test" / "shipped.txt"
    shipped.write_text("a code change\n")
    printed = cluster.up()
    # catches: a `ray up` that skips the new head's setup_commands (they found the image's
    # venv up to date: node.sh's stamp)
    assert UP_TO_DATE in printed, printed[-3000:]
    # catches: a `ray up` that did not set the new head up (file mounts)
    assert (cluster.hosts["head"].home / "raypeft" / "cluster-test" / "shipped.txt").is_file()
    # the new head's autoscaler sets the workers up again (their hosts kept their disks)
    cluster.wait_for_nodes(3)
    # catches: a second setup that reinstalls an unchanged venv (node.sh's stamp)
    assert cluster.setups_up_to_date() == 2
    after = snapshot(cluster)
    # catches: anything that lived on the old head's disk: run ids, statuses and metrics,
    # artefact digests and trial states are exactly as before
    assert after == before

    proc = cluster.submit("resumed.yaml", "--resume")
    assert "Search finished" in proc.stdout, proc.stdout[-3000:]
    resumed, kids = the_search(client, "cluster-resumed")
    # catches: a new search instead of the interrupted one continued
    assert resumed.info.run_id == parent.info.run_id
    assert client.get_run(parent.info.run_id).info.status == "FINISHED"
    # every artefact of before is still there, unchanged: the finished trial's model among
    # them, logged before the head went down
    artefacts = cluster.stores.objects("mlflow-artifacts/")
    changed = {k: (v, artefacts.get(k)) for k, v in before["artefacts"].items()}
    changed = {k: etags for k, etags in changed.items() if etags[0] != etags[1]}
    assert not changed, f"artefacts changed or gone (before, after): {changed}"
    assert any(done[0].info.run_id in k for k in before["artefacts"])
    # catches: a trial Tune's snapshot did not know left RUNNING, or closed without a reason
    stale = [k for k in kids if k.info.run_id in unsnapshotted]
    for kid in stale:
        assert kid.info.status == "KILLED", kid.info
        assert "after Ray Tune's last snapshot" in kid.data.tags["raypeft.error"]
    if stale:  # catches: a summary silent about them
        assert f"{len(stale)} trial" in proc.stdout and "ran again" in proc.stdout, proc.stdout
    # catches: a configuration lost, trials restarted from scratch, or evaluations lost
    # across the new head: every configuration ran to its end, each step logged once
    ran = [k for k in kids if k.info.run_id not in unsnapshotted]
    ended = {k.info.run_id: (k.info.status, k.data.tags.get("raypeft.error")) for k in ran}
    assert [status for status, _ in ended.values()] == ["FINISHED"] * 2, ended
    assert sorted(float(k.data.params["method.lr_prompt"]) for k in ran) == [0.3, 0.5]
    for kid in ran:
        assert_each_step_once(client, kid.info.run_id, 400, 40)
    study = optuna.load_study(study_name="cluster-resumed", storage=cluster.stores.optuna_db)
    states = sorted(t.state.name for t in study.trials)  # the stale trials FAIL, with why
    assert states == sorted(["COMPLETE", "COMPLETE"] + ["FAIL"] * len(stale)), states
    failed = [t for t in study.trials if t.state.name == "FAIL"]
    assert all("after Ray Tune's last snapshot" in t.user_attrs["raypeft.error"] for t in failed)


def test_the_heads_mlflow_answers_through_an_ssh_tunnel(cluster, busy, tmp_path):
    """The route docs/cluster.md gives: `ssh -L` to the head's loopback; report and predict
    from the laptop through it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    forward = f"{port}:127.0.0.1:{PORTS['RAYPEFT_MLFLOW_PORT']}"
    tunnel = subprocess.Popen(
        ["ssh", "-i", str(cluster.key), *SSH_OPTIONS, "-N", "-L", forward]
        + ["-p", str(ssh_port(ADDRESSES["head"]))]
        + [f"{LOGIN}@{ADDRESSES['head']}"],
        start_new_session=True,
    )
    url = f"http://localhost:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=3) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline and tunnel.poll() is None, "tunnel not up"
            time.sleep(0.3)
        env = {**cluster.stores.s3_env, "MLFLOW_TRACKING_URI": url}
        report = run_cli(
            ["report", EXPERIMENT, "--tracking-uri", url, "--out", str(tmp_path / "r"), "--no-log"],
            cwd=tmp_path,
            env=env,
        )
        # catches: MLflow unreachable by the documented tunnel, artefacts not proxied from S3
        assert report.returncode == 0, report.stderr[-3000:]
        predict = run_cli(
            ["predict", "--model", f"models:/{EXPERIMENT}@champion"],
            cwd=tmp_path,
            env=env,
            stdin="what a great day\n",
        )
        assert predict.returncode == 0, predict.stderr[-3000:]
        assert len(predict.stdout.strip().splitlines()) == 1
    finally:
        tunnel.terminate()
        tunnel.wait(timeout=30)
