"""benchmarks.replay_study on a synthetic table over the shipped DePT search's space: every
setting is a valid search, a row holds the simulation's figures, and an interrupted study
skips what it already wrote."""

from __future__ import annotations

import dataclasses
import json
import sys

import pytest

from benchmarks import replay_study
from raypeft.config.loading import validate_experiment
from raypeft.methods import BackboneDims
from raypeft.search.simulate import CurveTable
from raypeft.search.simulate.table import Curve

LR_PROMPT, LR_LOWRANK, LENGTHS = [0.3, 0.4, 0.5], [1e-4, 5e-4, 1e-3, 5e-3], [20, 40, 60, 80]
STEPS = [40, 80, 120, 160]  # the shipped dept.yaml's evaluations


def curve(a1: float, a2: float, m: int, seed: int) -> Curve:
    top = 0.8 - abs(a1 - 0.4) - 10 * abs(a2 - 1e-3) - 0.001 * abs(m - 40) + 0.003 * seed
    accuracy = [0.4 + (top - 0.4) * s / 160 for s in STEPS]
    return Curve(
        params={"method.lr_prompt": a1, "method.lr_lowrank": a2, "method.prompt_length": m},
        seed=seed,
        steps=list(STEPS),
        values={"val_accuracy": accuracy, "val_loss": [1.2 - a for a in accuracy]},
        wall_s=[s * 0.5 for s in STEPS],
    )


@pytest.fixture
def table_file(tmp_path):
    space = {
        "method.lr_prompt": {"grid": LR_PROMPT},
        "method.lr_lowrank": {"grid": LR_LOWRANK},
        "method.prompt_length": {"grid": LENGTHS},
    }
    recorded = replay_study.search_with({}).model_dump(mode="json")
    recorded |= {"space": space, "search": {"sampler": "grid", "seeds": [0, 1], "num_samples": 96}}
    cfg = validate_experiment(recorded, "recorded.yaml")
    table = CurveTable(
        experiment=cfg.model_dump(mode="json"),
        metric="accuracy",
        mode="max",
        dims=dataclasses.asdict(BackboneDims(384, 6, 30522, 64)),
        curves=[
            curve(a1, a2, m, s)
            for a1 in LR_PROMPT
            for a2 in LR_LOWRANK
            for m in LENGTHS
            for s in (0, 1)
        ],  # fmt: skip
        source={"experiment": "synthetic", "concurrency": 2},
    )
    path = tmp_path / "table.json"
    table.save(path)
    return path


@pytest.mark.parametrize("label", list(replay_study.SETTINGS))
def test_every_setting_is_a_valid_search(label):
    cfg = replay_study.search_with(replay_study.SETTINGS[label])
    assert cfg.space == replay_study.search_with({}).space  # only search.* differs


def test_a_row_holds_the_simulations_figures(table_file):
    table = CurveTable.load(table_file)
    row = replay_study.study_row("tpe-asha-loss (shipped)", table_file, table, 3, 0)
    assert row["replays"] == 3 and row["goal"]["median_steps"] == row["steps"]["median"]
    assert 0 < row["steps"]["median"] < 1  # ASHA stops trials the grid runs to the end
    assert row["regret"]["q25"] <= row["regret"]["median"] <= row["regret"]["q75"]


def test_an_interrupted_study_skips_what_it_wrote(table_file, tmp_path, monkeypatch, capsys):
    out = tmp_path / "study.jsonl"
    args = ["replay_study", "--table", str(table_file), "--replays", "2", "--out", str(out)]
    monkeypatch.setattr(sys, "argv", [*args, "--only", "tpe-none"])
    replay_study.main()
    first = out.read_text()
    monkeypatch.setattr(sys, "argv", [*args, "--only", "tpe-none", "--only", "random-none"])
    replay_study.main()
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert out.read_text().startswith(first) and [r["setting"] for r in rows] == [
        "tpe-none",
        "random-none",
    ]
    assert "| random-none" in capsys.readouterr().out
