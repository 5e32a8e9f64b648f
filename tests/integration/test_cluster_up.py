"""`ray up cluster/local.yaml` for real: Ray's launcher over SSH to this machine.

The "cluster" is this machine seen through an OpenSSH server (Debian's) listening on
127.0.0.2 only, with a key pair made here. The node is an unprivileged Unix user created for
the test (``raypeft-node``): the node commands run ``ray stop``, which stops every Ray process
its user may signal, so as that user it cannot touch any other Ray on the machine (checked
before the first ``ray up``). The launcher runs here as the "laptop", with a home of its own
(its Ray token) and a copy of the repository as its checkout.

The cluster file is cluster/local.yaml with this machine's addresses, user and key filled in
and the torch build set to CPU; every node command is the shipped one (cluster/node.sh, the
same script cluster/aws.yaml runs). The node's pip is pointed at a folder of wheels (made
once from this venv's packages and kept in /var/tmp, as pip keeps its cache), so the node's
venv is built offline. The node's ports are moved off Ray's and MLflow's defaults through
its environment (another Ray may use them here).

Teardown stops what the test started by process id (the sshd, the tunnel, and whatever the
node's user still runs), and removes the user with its home (the node's venv).
"""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
import yaml
from filelock import FileLock
from mlflow.tracking import MlflowClient

from raypeft.tracking.tags import ROLE_SEARCH, ROLE_TAG
from tests.helpers import TINY_SEARCH_BASE, children

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
HEAD = "127.0.0.2"  # Ray takes 127.0.0.1 for "this machine" and binds its outward address
USER = "raypeft-node"
HOME = Path("/home") / USER
PORTS = {  # off Ray's defaults and its worker port range (10002-19999)
    "RAYPEFT_GCS_PORT": 26379,
    "RAYPEFT_DASHBOARD_PORT": 28265,
    "RAYPEFT_CLIENT_PORT": 30001,
    "RAYPEFT_AGENT_PORT": 22365,
    "RAYPEFT_MLFLOW_PORT": 25000,
}
DASHBOARD = f"http://127.0.0.1:{PORTS['RAYPEFT_DASHBOARD_PORT']}"
WHEELS = Path("/var/tmp/raypeft-node-wheels")
SSH_OPTIONS = ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]
SSH_OPTIONS += ["-o", "IdentitiesOnly=yes", "-o", "LogLevel=ERROR", "-o", "BatchMode=yes"]
EXPERIMENT = "cluster-tiny"


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "creating the node's Unix user needs root"
    for tool in ("/usr/sbin/sshd", "rsync", "ssh", "ssh-keygen", "useradd", "git"):
        if not shutil.which(tool):
            return f"{tool} is not installed (apt-get install openssh-server rsync)"
    return None


def run(args, timeout=600, check=True, **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, timeout=timeout, **kwargs
    )
    if check:
        assert proc.returncode == 0, f"{args[:4]}: {proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def node_wheels() -> Path:
    """Every package of this venv as a wheel, for the node's offline pip: made once per set."""
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
class Cluster:
    work: Path
    checkout: Path  # the laptop's repository (a copy: the test ships a change from it)
    config: Path  # the generated cluster file
    env: dict  # the laptop's environment: its home, the token, the launcher's temp dir
    key: Path
    uid: int
    timings: dict = field(default_factory=dict)

    def ray(self, *args, timeout=900) -> subprocess.CompletedProcess:
        started = time.monotonic()
        proc = run([BIN / "ray", *args], timeout=timeout, cwd=self.checkout, env=self.env)
        self.timings.setdefault(" ".join(args[:1]), []).append(time.monotonic() - started)
        return proc

    def up(self) -> None:
        self.ray("up", "-y", "--no-config-cache", self.config)

    def down(self) -> None:
        self.ray("down", "-y", self.config)

    def ssh(self, command: str, check=True, timeout=300) -> subprocess.CompletedProcess:
        """A command on the node, in a login shell as the launcher runs its commands."""
        return run(
            ["ssh", "-i", self.key, *SSH_OPTIONS, f"{USER}@{HEAD}"]
            + [f"bash --login -c -i {shlex_quote('source ~/.bashrc; ' + command)}"],
            check=check,
            timeout=timeout,
        )

    def node_processes(self) -> list[psutil.Process]:
        """The node user's live processes (zombies not yet reaped by their parent excepted)."""
        return [
            p
            for p in psutil.process_iter(["uids", "cmdline", "status"])
            if p.info["uids"].real == self.uid and p.info["status"] != psutil.STATUS_ZOMBIE
        ]

    def submit(self, *tune_args: str, wait: bool = True) -> subprocess.CompletedProcess:
        args = ["job", "submit", "--address", DASHBOARD]
        args += [] if wait else ["--no-wait"]
        args += ["--", "raypeft", "tune", "--space", f"{HOME}/raypeft/cluster-test/tiny.yaml"]
        args += [
            "--address",
            "auto",
            "--tracking-uri",
            f"http://{HEAD}:{PORTS['RAYPEFT_MLFLOW_PORT']}",
        ]
        args += ["--set", f"run.storage_path={HOME}/raypeft-state/ray_results"]
        args += ["--set", f"search.storage=sqlite:///{HOME}/raypeft-state/optuna.db", "--quiet"]
        return self.ray(*args, *tune_args)


def shlex_quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def tiny_experiment(**search) -> dict:
    return {
        "name": EXPERIMENT,
        **TINY_SEARCH_BASE,
        "space": {
            "method.lr_prompt": {"grid": [0.3, 0.5]},
            "method.prompt_length": {"choice": [2, 4]},
        },
        "search": {"num_samples": 2, "scheduler": {"type": "asha", "grace_period": 1}, **search},
    }


def _make_user(work: Path) -> int:
    if _user_exists():
        _remove_user()
    run(["useradd", "--create-home", "--shell", "/bin/bash", USER])
    run(["usermod", "-p", "*", USER])  # no password, but not locked: sshd lets the key in
    entry = pwd.getpwnam(USER)
    return entry.pw_uid


def _user_exists() -> bool:
    try:
        pwd.getpwnam(USER)
        return True
    except KeyError:
        return False


def _remove_user() -> None:
    uid = pwd.getpwnam(USER).pw_uid
    left = [p for p in psutil.process_iter(["uids"]) if p.info["uids"].real == uid]
    assert not left, f"processes of {USER} from an earlier run: {[p.pid for p in left]}"
    run(["userdel", "--remove", USER], check=False)
    shutil.rmtree(HOME, ignore_errors=True)


def _as_node(path: Path, text: str, mode=0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    shutil.chown(path.parent, USER, USER)
    shutil.chown(path, USER, USER)


def _machine(work: Path, uid: int, wheels: Path) -> None:
    """The node machine: the test's key may log in; pip installs from the wheel folder; Ray
    keeps its temp files and ports apart from any other Ray here."""
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", work / "id"])
    _as_node(HOME / ".ssh" / "authorized_keys", (work / "id.pub").read_text(), 0o600)
    (HOME / ".ssh").chmod(0o700)
    _as_node(
        HOME / ".config" / "pip" / "pip.conf", f"[global]\nno-index = true\nfind-links = {wheels}\n"
    )
    runtime = work / "rt"
    runtime.mkdir()
    shutil.chown(runtime, USER, USER)
    exports = " ".join(f"{k}={v}" for k, v in PORTS.items())
    with (HOME / ".bashrc").open("a") as bashrc:
        bashrc.write(f"export RAY_TMPDIR={runtime} {exports}\n")


def _start_sshd(work: Path) -> subprocess.Popen:
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", work / "host_key"])
    (work / "sshd_config").write_text(
        f"ListenAddress {HEAD}:22\nHostKey {work / 'host_key'}\nPidFile none\n"
        f"AllowUsers {USER}\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "PubkeyAuthentication yes\nUsePAM no\nPermitRootLogin no\n"
    )
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation dir
    sshd = subprocess.Popen(
        ["/usr/sbin/sshd", "-D", "-e", "-f", str(work / "sshd_config")],
        stdout=open(work / "sshd.log", "w"),  # noqa: SIM115 - the child owns it
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and sshd.poll() is None:
        with socket.socket() as sock:
            if sock.connect_ex((HEAD, 22)) == 0:
                return sshd
        time.sleep(0.2)
    sshd.kill()
    pytest.skip(f"sshd cannot run here: {(work / 'sshd.log').read_text()[-300:].strip()}")


def _laptop(work: Path) -> tuple[Path, dict]:
    home = work / "laptop"
    home.mkdir()
    checkout = work / "checkout"
    files = run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO).stdout.split("\n")
    for name in filter(None, files):
        if (REPO / name).is_file():
            (checkout / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, checkout / name)
    (checkout / "cluster-test").mkdir()
    (checkout / "cluster-test" / "tiny.yaml").write_text(yaml.safe_dump(tiny_experiment()))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "MLFLOW_"))}
    env.update(HOME=str(home), RAY_TMPDIR=str(work / "launcher"), RAY_AUTH_MODE="token")
    env.update(PATH=f"{BIN}:{env['PATH']}", RAY_USAGE_STATS_ENABLED="0")
    (work / "launcher").mkdir()
    run([BIN / "ray", "get-auth-token", "--generate"], env=env)
    return checkout, env


def _cluster_file(work: Path) -> Path:
    """cluster/local.yaml with this machine's address, user and key, and the CPU torch build."""
    config = yaml.safe_load((REPO / "cluster" / "local.yaml").read_text())
    config["cluster_name"] = f"raypeft-test-{os.getpid()}"
    config["provider"].update(head_ip=HEAD, worker_ips=[])
    config["auth"] = {"ssh_user": USER, "ssh_private_key": str(work / "id")}
    (setup,) = config["setup_commands"]
    assert setup.endswith(" https://download.pytorch.org/whl/cu128"), setup
    config["setup_commands"] = [setup.replace("/whl/cu128", "/whl/cpu")]
    path = work / "cluster.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _stop(procs: list[psutil.Process]) -> list[psutil.Process]:
    for proc in procs:
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=15)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    return psutil.wait_procs(alive, timeout=10)[1]


@pytest.fixture(scope="module")
def cluster():
    why = _why_not()
    if why:
        pytest.skip(why)
    # one such cluster per machine at a time: the user, the address and the ports are fixed
    with FileLock("/tmp/raypeft-cluster-up.lock"):
        work = Path(tempfile.mkdtemp(prefix="rpc-", dir="/tmp"))  # short: Ray's socket paths
        work.chmod(0o755)
        sshd, up, env, timings = None, False, None, {}
        uid = _make_user(work)
        try:
            started = time.monotonic()
            wheels = node_wheels()
            timings["wheel folder"] = [time.monotonic() - started]
            _machine(work, uid, wheels)
            sshd = _start_sshd(work)
            checkout, env = _laptop(work)
            cluster = Cluster(work, checkout, _cluster_file(work), env, work / "id", uid, timings)
            # the node's user cannot signal another user's process (here: pid 1, root's), so
            # the node's `ray stop` cannot reach any Ray it did not start
            denied = cluster.ssh("kill -0 1", check=False)
            assert denied.returncode != 0 and "Operation not permitted" in denied.stderr
            up = True
            cluster.up()
            yield cluster
        finally:
            if up:
                subprocess.run(
                    [BIN / "ray", "down", "-y", work / "cluster.yaml"],
                    cwd=work,
                    env=env,
                    capture_output=True,
                    timeout=300,
                )
            left = _stop([p for p in psutil.process_iter(["uids"]) if p.info["uids"].real == uid])
            if sshd is not None:
                sshd.terminate()
                sshd.wait(timeout=30)
            _remove_user()
            shutil.rmtree(work, ignore_errors=True)
            print(f"cluster timings (s): {timings}")
        assert not left, f"processes of the node survived teardown: {left}"


# ----------------------------------------------------------------------------- helpers


def listening(cluster: Cluster) -> dict[int, set[str]]:
    """Port -> the addresses the node's processes listen on it (IPv4-mapped shown as IPv4)."""
    pids = {p.pid for p in cluster.node_processes()}
    found: dict[int, set[str]] = {}
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.pid in pids:
            found.setdefault(conn.laddr.port, set()).add(conn.laddr.ip.removeprefix("::ffff:"))
    return found


def process(cluster: Cluster, name: str) -> psutil.Process:
    (proc,) = [p for p in cluster.node_processes() if p.name() == name]
    return proc


def environment(proc: psutil.Process) -> dict[str, str]:
    return proc.environ()


class Tunnel:
    """`ssh -N -L PORT:HEAD:MLFLOW_PORT`: the route docs/cluster.md gives to the head's MLflow."""

    def __init__(self, cluster: Cluster):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        forward = f"{self.port}:{HEAD}:{PORTS['RAYPEFT_MLFLOW_PORT']}"
        self.proc = subprocess.Popen(
            ["ssh", "-i", str(cluster.key), *SSH_OPTIONS, "-N", "-L", forward, f"{USER}@{HEAD}"],
            start_new_session=True,
        )
        self.url = f"http://localhost:{self.port}"
        deadline = time.monotonic() + 30
        while not self._answers():
            assert time.monotonic() < deadline and self.proc.poll() is None, "tunnel not up"
            time.sleep(0.3)

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=3) as response:
                return response.status == 200
        except OSError:
            return False

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def raypeft_cli(args: list[str], cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_TRACKING")}
    env.update(kwargs.pop("env", {}), HF_HUB_OFFLINE="1", MLFLOW_DISABLE_TELEMETRY="true")
    return run([BIN / "raypeft", *args], check=False, cwd=cwd, env=env, **kwargs)


# ----------------------------------------------------------------------------- tests


def test_the_running_head_is_secured_as_documented(cluster):
    """Asserted on the processes `ray up` started, not on the cluster file."""
    ports = listening(cluster)
    gcs, dashboard = PORTS["RAYPEFT_GCS_PORT"], PORTS["RAYPEFT_DASHBOARD_PORT"]
    client, mlflow = PORTS["RAYPEFT_CLIENT_PORT"], PORTS["RAYPEFT_MLFLOW_PORT"]
    assert ports[dashboard] == {"127.0.0.1"}, ports  # the dashboard and job API: loopback
    assert ports[mlflow] == {HEAD}, ports  # MLflow: the head's address, never 0.0.0.0
    assert ports[client] <= {"127.0.0.1", HEAD}, ports  # Ray client: not a wildcard
    # Ray 2.60's GCS (and raylet, agents) listen on every interface whatever
    # --node-ip-address says, unless it is 127.0.0.1; token authentication guards them, and
    # on AWS the security group. docs/cluster.md says so: if this changes, update it.
    assert ports[gcs] in ({"::"}, {"0.0.0.0"}), ports
    # token authentication: the mode every Ray process of the node started with
    for name in ("gcs_server", "raylet"):
        assert environment(process(cluster, name)).get("RAY_AUTH_MODE") == "token", name
    dash = next(
        p
        for p in cluster.node_processes()
        if "dashboard/dashboard.py" in " ".join(p.info["cmdline"] or [])
    )
    assert "--host=127.0.0.1" in dash.info["cmdline"]
    # the node ran `ray start` with the address it was reached at
    assert f"--node-ip-address={HEAD}" in process(cluster, "gcs_server").cmdline()

    # a node without the token cannot join: `ray start` as the node would, with a wrong
    # token, then with none (on the node's machine, in a temp dir of its own)
    address = f"{HEAD}:{gcs}"
    for env in ("RAY_AUTH_MODE=token RAY_AUTH_TOKEN=not-the-token", "RAY_AUTH_MODE=disabled"):
        proc = cluster.ssh(
            f"{env} RAY_TMPDIR=$(mktemp -d) timeout 120 ray start --address={address} "
            f"--node-ip-address={HEAD} --dashboard-agent-listen-port=0 --disable-usage-stats",
            check=False,
        )
        assert proc.returncode != 0, proc.stdout[-2000:]
    nodes = cluster.ssh("ray list nodes --format yaml --filter state=ALIVE").stdout
    assert nodes.count("node_id:") == 1, nodes  # the head alone


def test_a_search_submitted_as_a_job_reaches_the_heads_mlflow(cluster, tmp_path):
    proc = cluster.submit()
    assert "Search finished" in proc.stdout and "succeeded" in proc.stdout, proc.stdout[-3000:]

    tunnel = Tunnel(cluster)
    try:
        client = MlflowClient(tracking_uri=tunnel.url)
        experiment = client.get_experiment_by_name(EXPERIMENT)
        (parent,) = client.search_runs(
            [experiment.experiment_id], "tags.`raypeft.role` = 'experiment'"
        )
        assert parent.info.status == "FINISHED"
        kids = children(client, experiment.experiment_id, parent.info.run_id)
        assert len(kids) == 2 and all(k.info.status == "FINISHED" for k in kids)
        champion = client.get_model_version_by_alias(EXPERIMENT, "champion")
        assert champion.run_id == parent.data.tags["raypeft.best_run_id"] or champion.run_id

        # the laptop's raypeft through the tunnel: report, predict; ui says to open the
        # server itself, whose UI answers through the tunnel
        report = raypeft_cli(
            [
                "report",
                EXPERIMENT,
                "--tracking-uri",
                tunnel.url,
                "--out",
                tmp_path / "report",
                "--no-log",
            ],
            tmp_path,
        )
        assert report.returncode == 0, report.stderr[-3000:]
        assert list((tmp_path / "report").iterdir())
        predict = raypeft_cli(
            ["predict", "--model", f"models:/{EXPERIMENT}@champion"],
            tmp_path,
            env={"MLFLOW_TRACKING_URI": tunnel.url},
            input="what a great day\n",
        )
        assert predict.returncode == 0, predict.stderr[-3000:]
        assert len(predict.stdout.strip().splitlines()) == 1
        ui = raypeft_cli(["ui", EXPERIMENT, "--tracking-uri", tunnel.url], tmp_path)
        assert ui.returncode == 2 and "open it in a browser" in ui.stderr
        with urllib.request.urlopen(f"{tunnel.url}/", timeout=30) as page:
            assert page.status == 200 and b"MLflow" in page.read()
    finally:
        tunnel.close()


def searches(client: MlflowClient) -> list:
    """Every search's parent run in the head's MLflow store, newest first."""
    experiment = client.get_experiment_by_name(EXPERIMENT)
    if experiment is None:
        return []
    return client.search_runs(
        [experiment.experiment_id],
        f"tags.`{ROLE_TAG}` = '{ROLE_SEARCH}'",
        order_by=["attributes.start_time DESC"],
    )


def a_trial_reported(client: MlflowClient, parent) -> bool:
    """Whether a trial of the search ``parent`` has logged a validation accuracy."""
    trials = children(client, parent.info.experiment_id, parent.info.run_id)
    return any("val_accuracy" in t.data.metrics for t in trials)


def test_nothing_is_lost_across_ray_down_and_ray_up(cluster):
    """A search stopped by `ray down` continues with --resume after the next `ray up`, which
    ships a code change and keeps the head's MLflow store, artefacts and Optuna study."""
    state = HOME / "raypeft-state"
    before = sorted(p.name for p in (state / "mlartifacts").rglob("*") if p.is_file())
    longer = ["--set", "search.num_samples=2", "--set", "train.max_steps=200"]
    longer += ["--set", "train.eval_every=20", "--set", "search.scheduler.type=none"]
    db = state / "mlflow.db"
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    known = len(searches(client))
    cluster.submit(*longer, wait=False)

    # Wait for this search's own trial to report: the earlier search's parent also holds
    # val_accuracy (its best trial's), so counting runs with that metric is not enough.
    deadline = time.monotonic() + 600
    while len(newest := searches(client)) == known or not a_trial_reported(client, newest[0]):
        assert time.monotonic() < deadline, "the second search never reported"
        time.sleep(0.5)
    status = client.get_run(newest[0].info.run_id).info.status
    assert status == "RUNNING", f"the second search ended ({status}) before ray down"

    cluster.down()

    def left_running() -> list[str]:
        commands = [" ".join(p.info["cmdline"] or [])[:120] for p in cluster.node_processes()]
        return [c for c in commands if "sshd" not in c]

    # `ray down` returns before every process has exited: wait for them, not a fixed time
    deadline = time.monotonic() + 120
    while (left := left_running()) and time.monotonic() < deadline:
        time.sleep(1)
    assert not left, f"ray down left these running: {left}"

    shipped = cluster.checkout / "cluster-test" / "shipped.txt"
    shipped.write_text("a code change\n")
    cluster.up()
    assert (HOME / "raypeft" / "cluster-test" / "shipped.txt").read_text() == "a code change\n"
    after = sorted(p.name for p in (state / "mlartifacts").rglob("*") if p.is_file())
    assert set(before) <= set(after)
    assert (state / "optuna.db").exists()

    proc = cluster.submit(*longer, "--resume")
    assert "Search finished" in proc.stdout, proc.stdout[-3000:]
    experiment = client.get_experiment_by_name(EXPERIMENT)
    parents = client.search_runs([experiment.experiment_id], "tags.`raypeft.role` = 'experiment'")
    assert len(parents) == 2 and all(p.info.status == "FINISHED" for p in parents)
    resumed = max(parents, key=lambda p: p.info.start_time)
    assert len(children(client, experiment.experiment_id, resumed.info.run_id)) == 2
