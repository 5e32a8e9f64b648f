"""benchmarks.replay_study on a synthetic table over the shipped DePT search's space (the
``dept_table_file`` fixture): every setting is a valid search, a row holds the simulation's
figures, and an interrupted study skips what it already wrote."""

from __future__ import annotations

import json
import sys

import pytest

from benchmarks import replay_study
from raypeft.search.simulate import CurveTable


@pytest.mark.parametrize("label", list(replay_study.SETTINGS))
def test_every_setting_is_a_valid_search(label):
    cfg = replay_study.search_with(replay_study.SETTINGS[label])
    if "space" not in replay_study.SETTINGS[label]:  # only search.* differs
        assert cfg.space == replay_study.search_with({}).space


def test_the_shipped_file_is_one_of_the_settings():
    """What docs/search_efficiency.md says won is what search_spaces/dept.yaml ships."""
    assert replay_study.shipped_setting() == "tpe-none-repeat2x1"


def test_a_row_holds_the_simulations_figures(dept_table_file):
    table = CurveTable.load(dept_table_file)
    row = replay_study.study_row("tpe-asha-loss", dept_table_file, table, 3, 0)
    assert row["replays"] == 3 and row["goal"]["median_steps"] == row["steps"]["median"]
    assert 0 < row["steps"]["median"] < 1  # ASHA stops trials the grid runs to the end
    assert row["regret"]["q25"] <= row["regret"]["median"] <= row["regret"]["q75"]


def test_an_interrupted_study_skips_what_it_wrote(dept_table_file, tmp_path, monkeypatch, capsys):
    out = tmp_path / "study.jsonl"
    args = ["replay_study", "--table", str(dept_table_file), "--replays", "2", "--out", str(out)]
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


def test_figures_draw_the_named_settings_side_by_side(dept_table_file, tmp_path, monkeypatch):
    figures = tmp_path / "figures"
    monkeypatch.setattr(sys, "argv", [
        "replay_study", "--table", str(dept_table_file), "--replays", "2", "--only", "tpe-none",
        "--out", str(tmp_path / "study.jsonl"), "--figures", str(figures),
        "--figure-setting", "tpe-none", "--figure-setting", "random-none",
    ])  # fmt: skip
    replay_study.main()
    drawn = sorted(p.name for p in figures.iterdir())
    assert drawn == ["table-anytime.png", "table-tradeoff.png"]
    assert all((figures / name).read_bytes().startswith(b"\x89PNG") for name in drawn)


def test_an_unknown_figure_setting_is_refused(dept_table_file, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [
        "replay_study", "--table", str(dept_table_file), "--figure-setting", "nope",
    ])  # fmt: skip
    with pytest.raises(SystemExit) as exit_:
        replay_study.main()
    assert exit_.value.code == 2 and "unknown settings ['nope']" in capsys.readouterr().err
