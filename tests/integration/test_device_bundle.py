"""The device bundle is complete: scripts/device-bundle.sh's packages, unpacked by
scripts/on-device.sh into a venv that has only what a lent GPU machine has (torch,
transformers at the device's version, and the device image's packages raypeft relies on),
run a real two-trial ``raypeft tune`` (Ray, MLflow's sqlite store, Optuna), CPU only.

The device runs Python 3.12; no CPU build of torch for 3.12 is reachable from here (the CPU
wheel index is not, and PyPI's torch for Linux is the CUDA build: GBs), so the venv is made from
this interpreter's Python with the torch build on this machine (constraints.txt's) and the
bundle is built for the same Python by the same script, from the same package list and pins.
What the cp312 build adds (the same wheels' cp312 binaries) is checked by its own test below
where a Python 3.12 is installed: the bundle alone imports and starts Ray, Tune, MLflow's
sqlite store and Optuna there.

Slow (a bundle build and a venv each: minutes); the wheels come from the package registry
with pip, as install.sh's do. The venv of this interpreter hard-links the packages this venv
already has at the same version (torch and most of the device image's) instead of unpacking
their wheels again, and pip compiles no bytecode ahead: 12 s of CPU instead of 50 for that
venv (2026-11-28, side by side), the same packages at the same versions (`pip list` compared).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from filelock import FileLock
from mlflow.tracking import MlflowClient

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
# The device image's versions where the device tool's notes give them (KINDS.md: transformers
# 5.17.0, tokenizers 0.23.2, safetensors 0.8.0, huggingface_hub 1.33.0; numpy 2.5.2 is for
# Python >= 3.12 only: constraints.txt's under 3.11); the other packages the device has and
# raypeft's search imports, at constraints.txt's pins.
DEVICE_VERSIONS = {
    "transformers": "5.17.0",
    "tokenizers": "0.23.2",
    "safetensors": "0.8.0",
    "huggingface-hub": "1.33.0",
}
DEVICE_HAS = [  # raypeft's closure (device-bundle.sh) that the device image has (KINDS.md)
    "numpy", "pandas", "pyarrow", "pyyaml", "click", "tabulate", "psutil", "filelock", "fsspec",
    "packaging", "protobuf", "msgpack", "requests", "tqdm", "typing-extensions", "xxhash",
    "cloudpickle", "anyio", "jinja2", "markupsafe", "attrs", "scipy", "regex", "annotated-doc",
    "certifi", "charset-normalizer", "h11", "hf-xet", "idna", "python-dateutil", "urllib3",
    "zipp", "six",
]  # fmt: skip
LACKS = ["ray", "mlflow", "optuna", "pydantic", "datasets", "sqlalchemy"]
DEVICE_LACKS_BUT_PIP_PULLS = ["pydantic", "pydantic-core", "annotated-types", "typing-inspection"]


def pins() -> dict[str, str]:
    """constraints.txt's pins, by normalised name."""
    found = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("#")[0].strip().split("==")
            found[name.lower().replace("_", "-")] = version
    return found


def device_requirements() -> list[str]:
    """torch, transformers and the device's other packages, each at its version."""
    pinned = pins()
    spec = [f"torch=={pinned['torch']}"]
    spec += [f"{name}=={version}" for name, version in DEVICE_VERSIONS.items()]
    spec += [f"{name}=={pinned[name]}" for name in DEVICE_HAS]
    return spec


def quiet(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    """``args`` run to success (the failure's output in the assertion otherwise)."""
    proc = subprocess.run(args, capture_output=True, text=True, **kwargs)
    assert proc.returncode == 0, (
        f"{' '.join(args[:3])}... failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return proc


def device_like_venv(root: Path, python: str, requirements: list[str]) -> Path:
    """A venv with only ``requirements`` (cached under ``root`` by their hash). Those this
    interpreter has installed at the same version (torch and the device image's packages, at
    constraints.txt's pins) are hard-linked from its site-packages, the files pip unpacked
    from the same wheels; pip installs the rest (the device's transformers and its libraries)
    and their dependencies."""
    key = hashlib.sha256("\n".join([python, *requirements]).encode()).hexdigest()[:12]
    venv = root / f"device-venv-{key}"
    with FileLock(str(root / f"device-venv-{key}.lock")):
        if not (venv / "installed").exists():
            shutil.rmtree(venv, ignore_errors=True)
            quiet([python, "-m", "venv", str(venv)])
            venv_python = str(venv / "bin" / "python")
            if same_interpreter(python):
                site = Path(quiet([venv_python, "-c", SITE_PACKAGES]).stdout.strip())
                link_installed(site, [r for r in requirements if installed_here(r)])
            # no bytecode compiled ahead: Python compiles what a run imports (a few hundred of
            # transformers' modules, not its thousands)
            pip = [venv_python, "-m", "pip", "install", "--quiet", "--no-compile"]
            quiet([*pip, "--disable-pip-version-check", *requirements])  # linked: satisfied
            # typer (transformers' CLI) pulls pydantic in now; the device's typer does not
            quiet([venv_python, "-m", "pip", "uninstall", "--quiet", "-y",
                   *DEVICE_LACKS_BUT_PIP_PULLS])  # fmt: skip
            (venv / "installed").write_text("\n".join(requirements))
    return venv


SITE_PACKAGES = "import sysconfig; print(sysconfig.get_paths()['purelib'])"


def same_interpreter(python: str) -> bool:
    """Whether ``python`` is the Python this venv was made from (its packages' binaries fit)."""
    ask = "import sys; print(sys.version, sys.platform)"
    return quiet([python, "-c", ask]).stdout.strip() == f"{sys.version} {sys.platform}"


def installed_here(requirement: str) -> bool:
    """Whether ``name==version`` is installed in this interpreter at that version (a local
    build tag such as torch's ``+cpu`` counts: constraints.txt pins without it)."""
    name, version = requirement.split("==")
    try:
        found = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return found.split("+")[0] == version


def link_installed(site: Path, requirements: list[str]) -> None:
    """Each distribution of ``requirements``, as installed here, hard-linked file by file into
    ``site`` (its RECORD's files; console scripts, outside site-packages, are left out)."""
    for requirement in requirements:
        dist = importlib.metadata.distribution(requirement.split("==")[0])
        for file in dist.files or []:
            source = Path(dist.locate_file(file))
            if file.parts[0] == ".." or not source.is_file():
                continue
            target = site / file
            target.parent.mkdir(parents=True, exist_ok=True)
            os.link(source, target)


def build_bundle(out: Path, python_version: str) -> None:
    """scripts/device-bundle.sh for ``python_version``, fast compression, no MiniLM weights."""
    quiet(
        ["bash", "scripts/device-bundle.sh", "--python-version", python_version, "--out",
         str(out), "--xz-level", "0", "--no-weights"],
        cwd=REPO, env={**os.environ, "PYTHON": sys.executable},
    )  # fmt: skip


def two_trial_search(folder: Path) -> Path:
    """A DePT search of two trials on tiny BERT and the packaged tweets, CPU only."""
    cfg = {
        "name": "bundle-check",
        "model": {"name": "tiny-bert", "max_length": 16},
        "task": {"name": "tweet_sentiment", "max_train_examples": 64, "max_eval_examples": 32,
                 "max_test_examples": 32},
        "method": {"name": "dept", "budget_prompt_length": 10, "prompt_length": 4},
        "train": {"max_steps": 4, "eval_every": 2, "batch_size": 8},
        "space": {"method.lr_prompt": {"grid": [0.3, 0.5]}},
        "search": {"num_samples": 2},
        "resources": {"use_gpu": False},
        "tracking": {"uri": f"sqlite:///{folder / 'mlflow.db'}"},
        "run": {"storage_path": str(folder / "ray_results")},
    }  # fmt: skip
    path = folder / "search.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module")
def cache_root(tmp_path_factory) -> Path:
    """The folder above each xdist worker's: the workers of one run share the venvs (a new run
    builds them again)."""
    return tmp_path_factory.getbasetemp().parent


def test_bundle_runs_a_search_where_only_torch_and_transformers_are(tmp_path, cache_root):
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    venv = device_like_venv(cache_root, sys._base_executable, device_requirements())
    python = str(venv / "bin" / "python")
    missing = quiet(
        [
            python,
            "-c",
            f"import importlib.util as u; print([m for m in {LACKS!r} if u.find_spec(m)])",
        ]
    )
    assert missing.stdout.strip() == "[]", "the device-like venv has a package the device lacks"
    bundle = tmp_path / "bundle"
    build_bundle(bundle, version)
    search = two_trial_search(tmp_path)

    run = quiet(
        ["bash", "scripts/on-device.sh", "--", "raypeft", "tune", str(search), "--quiet"],
        cwd=REPO,
        env={**os.environ, "PYTHON": python, "RAYPEFT_BUNDLE": str(bundle),
             "RAYPEFT_DEVICE_DIR": str(tmp_path / "unpacked"), "PYTHONPATH": ""},
        timeout=900,
    )  # fmt: skip
    assert "unpacked site" in run.stdout and "using its own packages" not in run.stdout
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("bundle-check")
    (parent,) = client.search_runs([exp.experiment_id], "tags.`raypeft.role` = 'experiment'")
    trials = client.search_runs(
        [exp.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'"
    )
    assert [t.info.status for t in trials] == ["FINISHED", "FINISHED"]
    assert parent.info.status == "FINISHED"


def python312() -> str | None:
    """A Python 3.12 interpreter on this machine (the device's version), if any (a pyenv
    shim that names a version not selected does not count)."""
    for candidate in (str(Path.home() / ".pyenv/versions/3.12.1/bin/python3"), "python3.12"):
        found = shutil.which(candidate)
        if found and subprocess.run([found, "--version"], capture_output=True).returncode == 0:
            return found
    return None


CP312_CHECK = """
import os, tempfile
import ray
from ray import tune
import mlflow, optuna, pydantic, datasets
folder = tempfile.mkdtemp()
ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
grid = tune.Tuner(lambda config: tune.report({"x": config["a"]}),
                  param_space={"a": tune.grid_search([1, 2])},
                  run_config=tune.RunConfig(storage_path=folder)).fit()
assert [r.metrics["x"] for r in grid] == [1, 2], grid
ray.shutdown()
mlflow.set_tracking_uri(f"sqlite:///{folder}/mlflow.db")
with mlflow.start_run():
    mlflow.log_metric("x", 1.0)
study = optuna.create_study(storage=f"sqlite:///{folder}/optuna.db")
study.optimize(lambda trial: trial.suggest_float("y", 0, 1), n_trials=2)
print("cp312 bundle ok", ray.__version__, mlflow.__version__, optuna.__version__)
"""


def test_cp312_bundle_starts_ray_mlflow_and_optuna(tmp_path, cache_root):
    """The device's build (cp312 binaries: Ray's, pydantic-core's, SQLAlchemy's) under a
    Python 3.12 that has only the device image's packages (no torch: none for 3.12 here)."""
    python = python312()
    if python is None:
        pytest.skip("no Python 3.12 on this machine")
    pinned = pins()
    requirements = [f"{n}=={pinned[n]}" for n in DEVICE_HAS if n != "numpy"]
    requirements += ["numpy==2.5.2", f"huggingface-hub=={DEVICE_VERSIONS['huggingface-hub']}"]
    venv = device_like_venv(cache_root, python, requirements)
    bundle = tmp_path / "bundle"
    build_bundle(bundle, "3.12")
    run = quiet(
        ["bash", "scripts/on-device.sh", "--", str(venv / "bin" / "python"), "-c", CP312_CHECK],
        cwd=REPO,
        env={**os.environ, "PYTHON": str(venv / "bin" / "python"),
             "RAYPEFT_BUNDLE": str(bundle), "RAYPEFT_DEVICE_DIR": str(tmp_path / "unpacked"),
             "PYTHONPATH": ""},
        timeout=600,
    )  # fmt: skip
    assert "cp312 bundle ok 2.60.0" in run.stdout
