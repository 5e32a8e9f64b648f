"""benchmarks.synetune: its scoring is raypeft's, its CLI says what is wrong in one line, and
raypeft's simulator agrees with syne-tune's on random search and ASHA (issue 57, item 3).

syne-tune lives in a venv of its own (benchmarks/synetune/__init__.py); the agreement test
runs syne-tune's half there and is skipped, naming it, where that venv is absent."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks.synetune import curves as st_curves
from benchmarks.synetune import report, study
from raypeft.search.simulate.replay import draw_seeds
from raypeft.search.simulate.scores import Quality
from raypeft.search.simulate.table import CurveTable
from tests.system import missing

REPO = Path(__file__).resolve().parents[2]
SUBJ = REPO / "benchmarks" / "results" / "table_dept_subj.json"
TWEETS = REPO / "benchmarks" / "results" / "table_dept_tweets.json"
SYNETUNE_PYTHON = Path(
    os.environ.get("RAYPEFT_SYNETUNE_PYTHON", REPO / ".venv-synetune" / "bin" / "python")
)
INSTALL = "bash scripts/install-synetune.sh"


def test_the_scoring_is_raypefts_on_a_shipped_table():
    ours, table = st_curves.load(SUBJ), CurveTable.load(SUBJ)
    mine, theirs = st_curves.Quality.of(ours), Quality.of(table)
    keys = list(table.by_configuration())
    assert keys[mine.best] == theirs.best
    for row, key in enumerate(keys):
        assert mine.regret(row) == pytest.approx(theirs.regret(key))
        for seed in ours.seeds:
            assert mine.heldout_regret(row, seed) == pytest.approx(theirs.heldout_regret(key, seed))
    for seed in ours.seeds:  # the reference picked without the held-out seed (issue 57)
        assert keys[mine.best_without(seed)] == theirs.best_without(seed)
        assert mine.reference_inflation(seed) == pytest.approx(theirs.reference_inflation(seed))


def test_a_replay_stored_before_is_rescored_to_what_raypeft_scores_now():
    """The stored shipped-search replays on SUBJ (written with the reference picked with the
    held-out seed) read back equal to raypeft's replay scored today, at every budget."""
    rows = report.read(study.OUT)[("table_dept_subj", report.SHIPPED)]
    for index in (0, 2):  # held out: seeds 0 and 2 (the latter's reference changes)
        assert "reference" not in json.loads(next(
            line for line in study.OUT.read_text().splitlines()
            if f'"method": "{report.SHIPPED}", "table": "table_dept_subj"' in line
            and f'"replay": {index},' in line))  # fmt: skip
        points = study.raypeft_points(SUBJ, report.SHIPPED, index, 2)
        for budget in study.BUDGETS:
            point = st_curves.at_budget(points, budget)
            assert rows[index]["budgets"][str(budget)]["heldout"] == pytest.approx(
                point[2], abs=1e-3
            )


@pytest.mark.parametrize("spare", [0, 1])
def test_replay_i_trains_on_and_holds_out_raypefts_seeds(spare):
    ours, table = st_curves.load(SUBJ), CurveTable.load(SUBJ)
    for i in range(9):
        draw = st_curves.Draw.of(ours, i, spare)
        theirs = draw_seeds(table, random.Random(f"0/{i}"), "fixed", i, spare)
        assert draw.heldout == theirs.heldout
        assert {c.seed for c in theirs.curves.values()} == {draw.common}


def test_the_anytime_choice_is_the_best_ended_trial_the_first_created_on_a_tie():
    trials = [
        st_curves.EndedTrial(row=3, steps=20, best=0.8, created=1, ended_s=10.0),
        st_curves.EndedTrial(row=5, steps=120, best=0.9, created=0, ended_s=50.0),
        st_curves.EndedTrial(row=7, steps=120, best=0.9, created=2, ended_s=40.0),
    ]
    points = st_curves.anytime(trials, sign=1, grid_steps=240)
    assert [p[2] for p in points] == [3, 7, 5]  # at 50 s trial 0 ties trial 2 and came first
    assert st_curves.at_budget(points, 0.5) == points[0]
    assert st_curves.at_budget(points, 0.01) is None


def test_a_bad_table_or_method_is_one_line_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "t.json"
    bad.write_text("{}")
    for argv in (["--table", str(bad)], ["--method", "st-nothing"], ["--replays", "0"]):
        with pytest.raises(SystemExit) as exit_info:
            study.main([*argv, "--out", str(tmp_path / "o.jsonl")])
        assert exit_info.value.code == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_the_smoke_run_stores_each_replay_once_and_resumes(tmp_path):
    out = tmp_path / "o.jsonl"
    study.main(["--smoke", "--method", "raypeft-shipped", "--out", str(out)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["replay"] for r in rows] == [0, 1]
    assert all(set(r["budgets"]) == {"0.1", "0.2", "0.3"} for r in rows)
    study.main(["--smoke", "--method", "raypeft-shipped", "--out", str(out)])
    assert len(out.read_text().splitlines()) == 2  # nothing replayed twice


@pytest.mark.slow
def test_raypefts_simulator_agrees_with_syne_tunes_on_random_search_and_asha(tmp_path):
    """30 replays of each setting on README's table (tweet_sentiment, which no default was
    chosen on): the mean held-out regret of raypeft's replay and of syne-tune's differ by less
    than their bootstrap interval (it contains 0) at every budget. (On SUBJ one of the six
    comparisons, ASHA's held-out regret at 0.2 and 0.3, miss: docs/synetune.md.)"""
    if not SYNETUNE_PYTHON.exists():
        missing("syne-tune-venv", f"{SYNETUNE_PYTHON} (syne-tune's own venv)", INSTALL)
    out = tmp_path / "agree.jsonl"
    args = ["-m", "benchmarks.synetune.study", "--table", str(TWEETS), "--replays", "30",
            "--out", str(out)]  # fmt: skip
    subprocess.run([str(SYNETUNE_PYTHON), *args, "--method", "st-random", "--method", "st-asha"],
                   cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, check=True,
                   capture_output=True)  # fmt: skip
    study.main(args[2:] + ["--method", "raypeft-random", "--method", "raypeft-random-asha"])
    rows = report.read(out)
    for ours, theirs in report.CROSS_CHECK:
        for budget in study.BUDGETS:
            a = np.asarray(list(report.figure(rows[(TWEETS.stem, ours)], budget).values()))
            b = np.asarray(list(report.figure(rows[(TWEETS.stem, theirs)], budget).values()))
            low, high = report.interval(a, b, statistic=lambda x, y: np.mean(x) - np.mean(y))
            assert low <= 0 <= high, (ours, theirs, budget, a.mean(), b.mean())


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
