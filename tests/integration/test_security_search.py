"""No secret reaches the records of a search, and every artefact is a safe format.

A tiny ``raypeft tune`` runs with fake secrets planted in its environment (cloud keys, a
Hugging Face token, MLflow credentials, a database URL) and passwords planted in the query
strings of its MLflow tracking URI and its Optuna storage URL (the only credential-bearing
URLs that work offline: sqlite ignores them). Afterwards every byte of the MLflow store (the
sqlite database and every artefact file), of the Optuna database and of the command's output
is searched for the secrets; none may be there. The URLs are logged, redacted.

Every artefact file must be safetensors, YAML, JSON or a figure/table/text format: no pickle
(checked by content too), and the safetensors files must load with safetensors. The MLflow
model of the chosen trial adds MLflow's own YAML files without a suffix (``MLmodel``,
``registered_model_meta``) and its code, which must be raypeft's own ``pyfunc_model.py``.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient
from safetensors import safe_open

from raypeft.config.redact import redact_uri
from tests.helpers import run_cli, tiny_experiment

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("shared_ray")]

SAFE_SUFFIXES = {".safetensors", ".yaml", ".yml", ".json", ".png", ".html", ".csv", ".md", ".txt"}
MLFLOW_YAML_FILES = {"MLmodel", "registered_model_meta"}  # an MLflow model's metadata
PICKLE_OR_TORCH_ZIP = (b"\x80", b"PK\x03\x04")  # pickle protocol 2+, torch.save's zip


def _fake(name: str) -> str:
    return f"raypeft-fake-{name}-{uuid.uuid4().hex}"


@pytest.fixture(scope="module")
def secret_search(tmp_path_factory, request):
    """A finished tiny search run with planted secrets: (work dir, secrets, output, URLs)."""
    monkeypatch = pytest.MonkeyPatch()
    request.addfinalizer(monkeypatch.undo)
    root = tmp_path_factory.mktemp("secret-search")
    inputs, work = root / "input", root / "work"  # the experiment file and Ray apart
    inputs.mkdir()
    work.mkdir()
    env_secrets = {
        "AWS_ACCESS_KEY_ID": "AKIA" + uuid.uuid4().hex[:16].upper(),
        "AWS_SECRET_ACCESS_KEY": _fake("aws-secret"),
        "AWS_SESSION_TOKEN": _fake("aws-session"),
        "HF_TOKEN": "hf_" + _fake("hf"),
        "HUGGING_FACE_HUB_TOKEN": "hf_" + _fake("hub"),
        "MLFLOW_TRACKING_USERNAME": _fake("mlflow-user"),
        "MLFLOW_TRACKING_PASSWORD": _fake("mlflow-password"),
        "MLFLOW_TRACKING_TOKEN": _fake("mlflow-token"),
        "DATABASE_URL": f"postgresql://optuna:{_fake('db-password')}@db.internal/optuna",
        "RAYPEFT_TEST_SECRET": _fake("generic"),
    }
    for name, value in env_secrets.items():
        monkeypatch.setenv(name, value)
    storage_password, tracking_password = _fake("storage-password"), _fake("tracking-password")
    storage = f"sqlite:///{work / 'optuna.db'}?password={storage_password}"
    tracking = f"sqlite:///{work / 'mlflow.db'}?password={tracking_password}"
    path = tiny_experiment(
        inputs,
        tracking={"uri": tracking},
        search={"num_samples": 2, "storage": storage},
    )
    proc = run_cli(["tune", "--space", str(path), "--quiet"], cwd=work)
    assert proc.returncode == 0, proc.stderr[-3000:]
    secrets = {**env_secrets, "storage password": storage_password}
    secrets["tracking password"] = tracking_password
    secrets["DATABASE_URL password"] = env_secrets["DATABASE_URL"].split(":")[2].split("@")[0]
    return work, secrets, proc, {"storage": storage, "tracking": tracking}


def _store_files(work: Path) -> list[Path]:
    """Every file of the MLflow store (database and artefacts) and of the Optuna database."""
    files = [p for p in sorted(work.rglob("*")) if p.is_file()]
    names = {p.name for p in files}
    assert {"mlflow.db", "optuna.db"} <= names, names
    assert any(p.suffix == ".safetensors" for p in files), names  # the artefacts are there
    return files


def _artefacts(work: Path) -> list[Path]:
    client = MlflowClient(tracking_uri=f"sqlite:///{work / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("tiny-dept")
    assert experiment is not None
    location = experiment.artifact_location.removeprefix("file://")
    root = Path(location)
    assert root.is_dir() and root.resolve().is_relative_to(work.resolve()), location
    files = [p for p in sorted(root.rglob("*")) if p.is_file()]
    assert files
    return files


def test_no_secret_in_the_mlflow_store_or_the_optuna_db(secret_search):
    work, secrets, _, _ = secret_search
    leaks = {}
    for path in _store_files(work):
        data = path.read_bytes()
        leaked = [name for name, value in secrets.items() if value.encode() in data]
        if leaked:
            leaks[str(path.relative_to(work))] = leaked
    assert leaks == {}, f"secrets in the records: {leaks}"


def test_no_secret_in_the_output(secret_search):
    _, secrets, proc, _ = secret_search
    for stream in (proc.stdout, proc.stderr):
        leaked = [name for name, value in secrets.items() if value in stream]
        assert leaked == [], leaked


def test_urls_are_logged_redacted(secret_search):
    """The parent run records where things are, with the credentials hidden."""
    work, secrets, _, urls = secret_search
    client = MlflowClient(tracking_uri=f"sqlite:///{work / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("tiny-dept")
    [parent] = client.search_runs([experiment.experiment_id], "tags.`raypeft.role` = 'experiment'")
    redacted = {k: redact_uri(v) for k, v in urls.items()}
    assert redacted["storage"].endswith("optuna.db?password=***")
    assert parent.data.params["search.storage"] == redacted["storage"]
    assert parent.data.params["tracking.uri"] == redacted["tracking"]
    assert parent.data.tags["raypeft.optuna_storage"] == redacted["storage"]
    folder = client.download_artifacts(parent.info.run_id, "experiment.yaml", str(work / "dl"))
    logged = yaml.safe_load(Path(folder).read_text())
    assert logged["search"]["storage"] == redacted["storage"]
    assert logged["tracking"]["uri"] == redacted["tracking"]


def test_artefacts_are_safe_formats(secret_search):
    work, _, _, _ = secret_search
    from raypeft.tracking.models import MODEL_CODE

    tensors = models = 0
    for path in _artefacts(work):
        name = path.relative_to(work)
        if path.name == MODEL_CODE.name:  # a logged pyfunc model's code: raypeft's, verbatim
            assert path.read_bytes() == MODEL_CODE.read_bytes(), name
            models += 1
            continue
        if path.name in MLFLOW_YAML_FILES:
            yaml.safe_load(path.read_text())
            continue
        assert path.suffix in SAFE_SUFFIXES, f"{name}: not a safe artefact format"
        head = path.read_bytes()[:8]
        assert not head.startswith(PICKLE_OR_TORCH_ZIP), f"{name}: a pickle"
        if path.suffix == ".safetensors":
            with safe_open(str(path), framework="pt") as f:
                assert list(f.keys()), name
                for key in f.keys():
                    f.get_tensor(key)
            tensors += 1
        elif path.suffix == ".json":
            json.loads(path.read_text())
        elif path.suffix in (".yaml", ".yml"):
            yaml.safe_load(path.read_text())
    assert tensors >= 2  # each trial's model/trainable.safetensors
    assert models == 1  # the chosen trial's python_function model
