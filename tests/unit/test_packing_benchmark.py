"""``python -m benchmarks.device.packing`` runs where only torch, transformers, pydantic,
tabulate and raypeft's training core are installed (the GPU machines): on the CPU, at a tiny
setting, with Ray, MLflow, Optuna and datasets made unimportable in the benchmark's process and
in the processes it starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import run_benchmark

REPO = Path(__file__).resolve().parents[2]
MODULE = "benchmarks.device.packing"
ABSENT_ON_GPU_MACHINES = ("ray", "mlflow", "optuna", "datasets")


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
def test_packing_benchmark_prints_packed_against_separate_trials(tmp_path):
    blocked = _blocked_packages(tmp_path / "blocked")
    args = ["--tiny", "--methods", "pt", "--ks", "1,2", "--steps", "2", "--warmup", "1"]
    args += ["--batch-size", "4", "--seq-len", "16", "--precision", "fp32"]
    proc = run_benchmark(MODULE, args, tmp_path, [blocked, REPO])
    rows = [
        [cell.strip() for cell in line.split("|")[1:-1]]
        for line in proc.stdout.splitlines()
        if line.startswith("| tiny ")
    ]
    assert [(r[1], r[2], r[3], r[4]) for r in rows] == [
        ("pt", "fp32", "1", "unfused"),
        ("pt", "fp32", "1", "fused"),
        ("pt", "fp32", "2", "unfused"),
        ("pt", "fp32", "2", "fused"),
    ]
    for row in rows:
        step_ms, pack_h, separate_h = (float(c.replace(",", "")) for c in row[5:8])
        assert step_ms > 0 and pack_h > 0 and separate_h > 0, row
        # trials/h against separate and against sequential trials, and the memory ratio
        assert row[8].endswith("×") and row[10].endswith("×") and row[13].endswith("×"), row
        assert float(row[15]) >= 0  # the step's arithmetic rate, from its counted FLOPs
        assert row[16] == "-"  # a CPU has no known bf16 peak
    # K sequential trials: one trial alone (the separate K=1), whatever K
    assert len({r[9] for r in rows}) == 1 and rows[0][7] == rows[0][9]
    assert rows[0][14] == "-" and rows[2][14] != "-"  # what the second member adds
    measured = [line for line in proc.stdout.splitlines() if line.startswith("  measured | tiny")]
    assert len(measured) == 4  # each row printed as it is measured (a run cut off keeps them)
