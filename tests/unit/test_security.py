"""Security defaults (docs/security.md).

- Static: no code that unpickles or writes pickles (``torch.load`` only with
  ``weights_only=True``, no pickle/cloudpickle/joblib, no ``torch.save``, ``yaml`` only with a
  safe loader, no ``np.load(allow_pickle=True)``), no ``eval``/``exec``, no ``shell=True``,
  no ``trust_remote_code``.
- Secrets: :mod:`raypeft.config.redact` hides credentials in URLs and secret-named keys, and leaves
  every ordinary value (all of raypeft's own search spaces) as it was.
- Servers: ``raypeft ui`` listens on 127.0.0.1 by default, and the local Ray that
  ``raypeft tune`` starts (``init_ray(None)``) listens on loopback only: measured on the real
  processes of one Ray session started in a subprocess.
"""

from __future__ import annotations

import ast
import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from raypeft.config.redact import REDACTED, is_secret_key, redact_config, redact_params, redact_uri

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("raypeft", "benchmarks", "scripts")
RAYPEFT = str(Path(sys.executable).with_name("raypeft"))

# ----------------------------------------------------------------------------- static checks

PICKLE_MODULES = {"pickle", "_pickle", "cPickle", "cloudpickle", "dill", "joblib", "shelve"}
SAFE_YAML_LOADERS = {"yaml.SafeLoader", "yaml.CSafeLoader", "yaml.BaseLoader", "yaml.CBaseLoader"}
TORCH_LOAD = {"torch.load", "torch.serialization.load"}
TORCH_SAVE = {"torch.save", "torch.serialization.save"}
NUMPY_LOAD = {"numpy.load", "np.load"}


class _Checker(ast.NodeVisitor):
    """Findings (``path:line: what``) of one module, names resolved through its imports."""

    def __init__(self, path: str):
        self.path = path
        self.aliases: dict[str, str] = {}  # local name -> dotted import path
        self.safe_loaders: set[str] = set(SAFE_YAML_LOADERS)  # and this module's subclasses
        self.findings: dict[str, list[str]] = {
            "torch_load": [],
            "pickle": [],
            "yaml": [],
            "numpy": [],
            "eval": [],
            "shell": [],
            "remote_code": [],
        }

    def _add(self, kind: str, node: ast.AST, what: str) -> None:
        self.findings[kind].append(f"{self.path}:{node.lineno}: {what}")

    def _dotted(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id, node.id)
        if isinstance(node, ast.Attribute):
            base = self._dotted(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    # imports: record aliases, flag the pickle family
    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.asname:
                self.aliases[alias.asname] = alias.name
            else:
                top = alias.name.split(".")[0]
                self.aliases[top] = top
            self._check_module(node, alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level or not node.module:
            return  # relative imports: raypeft's own modules
        self._check_module(node, node.module)
        for alias in node.names:
            full = f"{node.module}.{alias.name}"
            self.aliases[alias.asname or alias.name] = full
            self._check_module(node, full)

    def _check_module(self, node: ast.AST, module: str) -> None:
        parts = module.split(".")
        if parts[0] in PICKLE_MODULES or (parts[0] == "ray" and "cloudpickle" in parts):
            self._add("pickle", node, f"imports {module}")

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        if any(self._dotted(base) in self.safe_loaders for base in node.bases):
            self.safe_loaders.add(node.name)  # e.g. class _UniqueKeyLoader(yaml.SafeLoader)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        name = self._dotted(node.func) or ""
        keywords = {k.arg: k.value for k in node.keywords if k.arg}
        unpacked = any(k.arg is None for k in node.keywords)
        if name in TORCH_LOAD:
            flag = keywords.get("weights_only")
            if not (isinstance(flag, ast.Constant) and flag.value is True):
                self._add("torch_load", node, f"{name}(...) without weights_only=True")
        if name in TORCH_SAVE:
            self._add("pickle", node, f"{name}(...) writes a pickle (use safetensors)")
        if name.endswith((".read_pickle", ".to_pickle")):
            self._add("pickle", node, f"{name}(...)")
        if name in ("yaml.load", "yaml.load_all"):
            loader = keywords.get("Loader", node.args[1] if len(node.args) > 1 else None)
            if loader is None or self._dotted(loader) not in self.safe_loaders:
                self._add("yaml", node, f"{name}(...) without a safe Loader (use yaml.safe_load)")
        if name in ("yaml.unsafe_load", "yaml.unsafe_load_all", "yaml.full_load"):
            self._add("yaml", node, f"{name}(...)")
        if name in NUMPY_LOAD or name.endswith("numpy.load"):
            flag = keywords.get("allow_pickle")
            if unpacked or (flag is not None and not _false(flag)):
                self._add("numpy", node, f"{name}(...) may unpickle (allow_pickle)")
        if isinstance(node.func, ast.Name) and node.func.id in ("eval", "exec"):
            self._add("eval", node, f"{node.func.id}(...)")
        if name in ("os.system", "os.popen"):
            self._add("shell", node, f"{name}(...) runs a shell")
        shell = keywords.get("shell")
        if shell is not None and not _false(shell):
            self._add("shell", node, f"{name or 'a call'}(..., shell=...) runs a shell")
        remote = keywords.get("trust_remote_code")
        if remote is not None and not _false(remote):
            self._add("remote_code", node, f"{name}(..., trust_remote_code=...) runs Hub code")
        self.generic_visit(node)


def _false(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value in (False, None, 0)


def check_source(text: str, path: str = "<string>") -> dict[str, list[str]]:
    tree = ast.parse(text, filename=path)
    names = _Checker(path)
    names.visit(tree)  # first pass: every import alias and safe loader subclass
    checker = _Checker(path)
    checker.aliases, checker.safe_loaders = names.aliases, names.safe_loaders
    checker.visit(tree)
    return checker.findings


@pytest.fixture(scope="module")
def findings() -> dict[str, list[str]]:
    """Every finding in raypeft/, benchmarks/ and scripts/ (every .py file there)."""
    out: dict[str, list[str]] = {}
    files = [p for folder in SCANNED for p in sorted((ROOT / folder).rglob("*.py"))]
    assert any(p.match("raypeft/search/run.py") for p in files)  # the scan sees the package
    for path in files:
        for kind, found in check_source(path.read_text(), str(path.relative_to(ROOT))).items():
            out.setdefault(kind, []).extend(found)
    return out


def test_torch_load_always_with_weights_only(findings):
    assert findings["torch_load"] == []


def test_no_pickles_written_or_read(findings):
    """No pickle/cloudpickle/joblib import and no torch.save: safetensors, YAML and JSON only."""
    assert findings["pickle"] == []


def test_yaml_only_with_a_safe_loader(findings):
    assert findings["yaml"] == []


def test_numpy_never_unpickles(findings):
    assert findings["numpy"] == []


def test_no_eval_exec_or_shell(findings):
    assert findings["eval"] == [] and findings["shell"] == []


def test_no_remote_code_from_the_hub(findings):
    assert findings["remote_code"] == []


def test_the_checker_catches_each_violation():
    source = textwrap.dedent(
        """
        import pickle
        import torch as th
        import numpy as np
        import subprocess
        from torch import load
        from ray import cloudpickle
        import yaml
        from yaml import Loader
        th.load("a.pt")
        load("a.pt", weights_only=False)
        th.save({}, "a.pt")
        yaml.load(text)
        yaml.load(text, Loader=Loader)
        class Mine(yaml.Loader): pass
        yaml.load(text, Loader=Mine)
        yaml.unsafe_load(text)
        np.load("a.npy", allow_pickle=True)
        eval("1")
        subprocess.run("ls", shell=True)
        AutoModel.from_pretrained("x", trust_remote_code=True)
        """
    )
    found = check_source(source)
    assert len(found["pickle"]) == 3  # pickle, ray.cloudpickle, th.save
    assert len(found["torch_load"]) == 2
    assert len(found["yaml"]) == 4
    assert len(found["numpy"]) == 1
    assert len(found["eval"]) == 1 and len(found["shell"]) == 1
    assert len(found["remote_code"]) == 1
    safe = textwrap.dedent(
        """
        import torch, yaml, numpy as np
        torch.load("a.pt", weights_only=True)
        yaml.safe_load(text)
        yaml.load(text, Loader=yaml.SafeLoader)
        yaml.load(text, Loader=Strict)
        class Strict(yaml.SafeLoader):
            pass
        np.load("a.npy")
        model.eval()
        """
    )
    assert not any(check_source(safe).values())


# ----------------------------------------------------------------------------- redaction

SECRET = "hunter2-s3cr3t"


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("postgresql://user:pass@host/db", "postgresql://user:***@host/db"),
        ("postgresql+psycopg2://u:p%40ss@h:5432/db?sslmode=require", None),
        (
            "mysql+pymysql://optuna:pa/ss?w#rd@db:3306/optuna",  # unencoded: SQLAlchemy takes it
            "mysql+pymysql://optuna:***@db:3306/optuna",
        ),
        ("redis://:pw@cache:6379/0", "redis://:***@cache:6379/0"),
        ("http://token@host", "http://***@host"),
        ("https://ghp_abc123@github.com/org/repo.git", "https://***@github.com/org/repo.git"),
        ("https://h/db?password=x&timeout=3", "https://h/db?password=***&timeout=3"),
        ("sqlite:////tmp/optuna.db?password=x", "sqlite:////tmp/optuna.db?password=***"),
        ("https://api.example/v1?token=abc", "https://api.example/v1?token=***"),
        ("https://api.example/v1?api_key=a&key=b", "https://api.example/v1?api_key=***&key=***"),
        (
            "https://b.s3.amazonaws.com/k.csv?X-Amz-Algorithm=AWS4-HMAC-SHA256"
            "&X-Amz-Credential=AKIA%2F20240101%2Fus-east-1&X-Amz-Date=20240101T000000Z"
            "&X-Amz-Security-Token=FwoG&X-Amz-Signature=0f1e2d",
            "https://b.s3.amazonaws.com/k.csv?X-Amz-Algorithm=AWS4-HMAC-SHA256"
            "&X-Amz-Credential=***&X-Amz-Date=20240101T000000Z"
            "&X-Amz-Security-Token=***&X-Amz-Signature=***",
        ),
        (
            "https://acct.blob.core.windows.net/c/b.csv?sv=2022-11-02&se=2030&sig=AbC%2Bd",
            "https://acct.blob.core.windows.net/c/b.csv?sv=2022-11-02&se=2030&sig=***",
        ),
        ("https://h/cb#access_token=xyz&state=1", "https://h/cb#access_token=***&state=1"),
        (
            "https://h/?AWSAccessKeyId=AK&Signature=s&Expires=1",
            "https://h/?AWSAccessKeyId=***&Signature=***&Expires=1",
        ),
        ("opened postgresql://u:pw@h/db: refused", "opened postgresql://u:***@h/db: refused"),
    ],
)
def test_redact_uri_hides_credentials(uri, expected):
    if expected is None:
        expected = uri.replace("p%40ss", REDACTED)
    assert redact_uri(uri) == expected


@pytest.mark.parametrize(
    "uri",
    [
        "sqlite:///mlflow.db",
        "sqlite:////abs/path/optuna.db",
        "s3://bucket/path/to/results",
        "gs://bucket/a@b/c",  # an @ in the path is no userinfo
        "file:///home/me/@scope/x",
        "/abs/path/data.csv",
        "relative/data.jsonl",
        "stanfordnlp/imdb",
        "http://127.0.0.1:5000",
        "http://mlflow:5000/#/experiments/1/runs?searchFilter=x",
        "http://host:8080/p?email=a@b.com",  # host:port, not user:password
        "https://huggingface.co/datasets/x?revision=main",
        "databricks",
        "",
    ],
)
def test_redact_uri_leaves_ordinary_values_alone(uri):
    assert redact_uri(uri) == uri


@pytest.mark.parametrize(
    ("key", "secret"),
    [
        ("password", True),
        ("search.db_password", True),
        ("hf_token", True),
        ("HF_TOKEN", True),
        ("api_key", True),
        ("apiKey", True),
        ("AWSAccessKeyId", True),
        ("aws_secret_access_key", True),
        ("credentials.user", True),
        ("X-Amz-Signature", True),
        ("client_secret", True),
        ("method.pretrain_max_tokens", False),
        ("task.text_column", False),
        ("search.storage", False),
        ("tracking.uri", False),
        ("model.revision", False),
    ],
)
def test_secret_key_names(key, secret):
    assert is_secret_key(key) is secret


def test_redact_params_hides_secret_keys_and_uri_values():
    params = {
        "search.storage": f"postgresql://optuna:{SECRET}@db.internal:5432/optuna",
        "tracking.uri": f"https://user:{SECRET}@mlflow.internal",
        "task.files.train": f"https://b.s3.amazonaws.com/t.csv?X-Amz-Signature={SECRET}",
        "run.storage_path": "s3://bucket/ray_results",
        "extra.hf_token": SECRET,
        "extra.password": None,  # nothing to hide
        "train.batch_size": 8,
        "space.method.lr": {"loguniform": [1e-4, 1e-2]},
        "search.objectives": [{"metric": "accuracy", "mode": "max"}],
    }
    before = json.dumps(params, sort_keys=True)
    out = redact_params(params)
    assert json.dumps(params, sort_keys=True) == before  # the input is not modified
    assert SECRET not in json.dumps(out)
    assert out["search.storage"] == f"postgresql://optuna:{REDACTED}@db.internal:5432/optuna"
    assert out["tracking.uri"] == f"https://user:{REDACTED}@mlflow.internal"
    assert out["task.files.train"].endswith(f"X-Amz-Signature={REDACTED}")
    assert out["extra.hf_token"] == REDACTED and out["extra.password"] is None
    for key in ("run.storage_path", "train.batch_size", "space.method.lr", "search.objectives"):
        assert out[key] == params[key]


def test_redact_config_is_recursive_and_keeps_the_config_valid():
    from raypeft.config.loading import load_experiment
    from raypeft.config.schema import ExperimentConfig

    cfg = load_experiment(ROOT / "search_spaces" / "dept.yaml", [])
    data = cfg.model_dump(mode="json")
    data["search"]["storage"] = f"postgresql://optuna:{SECRET}@db/optuna"
    data["tracking"]["uri"] = f"https://u:{SECRET}@mlflow.internal"
    data["run"]["storage_path"] = f"s3://bucket/results?X-Amz-Credential={SECRET}"
    out = redact_config(data)
    assert SECRET not in json.dumps(out)
    assert out["search"]["storage"] == f"postgresql://optuna:{REDACTED}@db/optuna"
    # a redacted config still loads (predict/export read the logged config.yaml back)
    redone = ExperimentConfig.model_validate(out)
    assert redone.method == cfg.method and redone.model == cfg.model and redone.task == cfg.task


@pytest.mark.parametrize("space", sorted(p.name for p in (ROOT / "search_spaces").glob("*.yaml")))
def test_raypeft_search_spaces_are_not_redacted(space):
    """No false positives: every param and the config of the shipped search spaces as is."""
    from raypeft.config.dotted import flatten
    from raypeft.config.loading import load_experiment

    cfg = load_experiment(ROOT / "search_spaces" / space, [])
    params = flatten(cfg.model_dump(mode="json", exclude={"space"}))
    params.update({f"space.{k}": v.model_dump() for k, v in cfg.space.items()})
    assert redact_params(params) == params
    assert redact_config(cfg.model_dump(mode="json")) == cfg.model_dump(mode="json")


# ----------------------------------------------------------------------------- servers


def _is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip.split("%")[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # ::ffff:127.0.0.1, a dual-stack socket's IPv4 side
    return address.is_loopback


def _listening(pids: set[int]) -> set[tuple[int, str, int]]:
    """``(pid, ip, port)`` of every listening TCP socket of ``pids``."""
    return {
        (c.pid, c.laddr.ip, c.laddr.port)
        for c in psutil.net_connections(kind="inet")
        if c.pid in pids and c.status == psutil.CONN_LISTEN
    }


def _tree(pid: int) -> set[int]:
    try:
        root = psutil.Process(pid)
        return {pid} | {p.pid for p in root.children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_loopback_check():
    assert _is_loopback("127.0.0.1") and _is_loopback("::1") and _is_loopback("::ffff:127.0.0.1")
    assert not _is_loopback("0.0.0.0") and not _is_loopback("::")
    assert not _is_loopback("192.0.2.2") and not _is_loopback("::ffff:192.0.2.2")


def test_ui_host_defaults_to_loopback():
    from raypeft.cli.ui import command

    host = next(p for p in command.params if p.name == "host")
    assert host.default == "127.0.0.1"


@pytest.mark.slow
def test_ui_server_listens_on_loopback_only(tmp_path):
    """The real ``raypeft ui``: every socket its MLflow server (and workers) listen on; and
    the store's URI (a database's password) on none of their command lines."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    MlflowClient(tracking_uri=uri).create_experiment("sec")
    port = _free_port()
    env = dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true")
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.Popen(
        [RAYPEFT, "ui", "sec", "--tracking-uri", uri, "--port", str(port)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = proc.stdout.readline()  # "MLflow UI: <url>" once the server answers
        assert line.startswith("MLflow UI: http://127.0.0.1:"), line
        sockets = _listening(_tree(proc.pid))
        assert any(p == port for _, _, p in sockets), sockets
        exposed = sorted(s for s in sockets if not _is_loopback(s[1]))
        assert exposed == [], f"raypeft ui listens beyond loopback: {exposed}"
        servers = [psutil.Process(pid) for pid in _tree(proc.pid) - {proc.pid}]
        assert servers and not [p.pid for p in servers if uri in " ".join(p.cmdline())]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            for pid in sorted(_tree(proc.pid), reverse=True):
                try:
                    os.killpg(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            proc.kill()
            proc.wait()


# Runs in a fresh interpreter: starts raypeft's local Ray, runs a task, then watches every
# listening socket of this Ray session's processes (the driver's descendants: GCS, raylet,
# dashboard and its agents, monitor, workers; and any process whose command line names the
# session) until they have been stable for a while, and prints them as JSON.
_RAY_PROBE = textwrap.dedent(
    """
    import json, time
    import psutil, ray
    from raypeft.search.ray_session import init_ray

    init_ray(None, quiet=True)

    @ray.remote
    def add_one(x):
        return x + 1

    assert ray.get(add_one.remote(1)) == 2  # trials still run
    node = ray._private.worker._global_node
    session = node.session_name

    def members():
        me = psutil.Process()
        pids = {me.pid} | {p.pid for p in me.children(recursive=True)}
        for proc in psutil.process_iter(["pid", "cmdline"]):
            if session in " ".join(proc.info["cmdline"] or []):
                pids.add(proc.info["pid"])
        return pids

    def snapshot():
        pids = members()
        out = set()
        for c in psutil.net_connections(kind="inet"):
            if c.pid in pids and c.status == psutil.CONN_LISTEN:
                try:
                    name = psutil.Process(c.pid).name()
                except psutil.NoSuchProcess:
                    name = "?"
                out.add((name, c.laddr.ip, c.laddr.port))
        return out

    seen, last, stable, start = set(), None, 0, time.monotonic()
    while time.monotonic() - start < 40:
        now = snapshot()
        seen |= now
        stable = stable + 1 if now == last else 0
        last = now
        if stable >= 5 and time.monotonic() - start > 8:
            break
        time.sleep(1)
    print("RESULT " + json.dumps({"node_ip": node.node_ip_address,
                                  "gcs": node.gcs_address,
                                  "sockets": sorted(seen)}))
    ray.shutdown()
    """
)


@pytest.mark.slow
def test_local_ray_listens_on_loopback_only(tmp_path):
    """``init_ray(None)`` (what ``raypeft tune`` without --address starts): a one-machine Ray
    whose every server (GCS, raylet, object manager, workers, agents, metrics) is on loopback."""
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")
    for var in ("RAY_ADDRESS", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"):
        env.pop(var, None)  # measure init_ray's own choice
    proc = subprocess.run(
        [sys.executable, "-c", _RAY_PROBE],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    result = json.loads(line[len("RESULT ") :])
    names = {name for name, _, _ in result["sockets"]}
    assert {"gcs_server", "raylet"} <= names, result  # the session's servers were found
    exposed = [s for s in result["sockets"] if not _is_loopback(s[1])]
    assert exposed == [], (
        f"local Ray listens beyond loopback (node IP {result['node_ip']}): {exposed}"
    )
    assert _is_loopback(result["node_ip"]), result
