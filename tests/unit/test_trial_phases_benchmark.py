"""``python -m benchmarks.device.trial_phases --smoke`` runs a real two-trial search of the tiny
BERT through raypeft's search and prints each phase of a trial, the first trial on an actor
against the later one. Structure only: every phase present, every measured time a number >= 0
(the last trial has no next one to wait for); no time is judged here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.device.trial_phases import DRIVER_PHASES, GAP, SUMMARY_ROWS, TRIAL_PHASES

REPO = Path(__file__).resolve().parents[2]


def _rows(stdout: str) -> list[list[str]]:
    """The cells of the table's rows (after its header and rule)."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| phase (s) "))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.split("|")[1:-1]])
    return rows


@pytest.mark.slow
def test_every_phase_of_the_first_and_a_later_trial_is_printed(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.device.trial_phases", "--smoke"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert out.startswith("Command: python -m benchmarks.device.trial_phases --smoke\nMachine: ")
    assert "2 trials read, 1 on a reused actor" in out
    rows = _rows(out)
    assert [r[0] for r in rows] == [*TRIAL_PHASES, *DRIVER_PHASES, *SUMMARY_ROWS]
    for name, _side, first, later in rows:
        if name == GAP:  # the later trial is the last: no next trial to start
            assert later == "-"
            later = first
        # measured phases cannot be negative; the rows between two clocks are differences
        floor = 0 if name not in SUMMARY_ROWS else float("-inf")
        assert float(first) >= floor and float(later) >= floor, name
    assert "once per search: test split " in out
