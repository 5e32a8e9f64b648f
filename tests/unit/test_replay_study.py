"""benchmarks.search.replay_study on a synthetic table over the shipped DePT search's space (the
``dept_table_file`` fixture): every setting is a valid search, a row holds the simulation's
figures, and an interrupted study skips what it already wrote."""

from __future__ import annotations

import json
import re
import sys

import pytest

from benchmarks.search import replay_study, replays
from raypeft.search.simulate import CurveTable


@pytest.mark.parametrize("label", list(replays.SETTINGS))
def test_every_setting_is_a_valid_search(label):
    cfg = replays.search_with(replays.SETTINGS[label])
    if "space" not in replays.SETTINGS[label]:  # only search.* differs
        assert cfg.space == replays.search_with({}).space


def test_the_shipped_file_is_one_of_the_settings():
    """What docs/search_efficiency.md says won is what search_spaces/dept.yaml ships."""
    assert replays.shipped_setting() == "tpe-asha-loss-repeat3x1"


@pytest.mark.slow
def test_a_row_holds_the_simulations_figures(dept_table_file):
    table = CurveTable.load(dept_table_file)
    row = replays.study_row("tpe-asha-loss", dept_table_file, table, 3, 0)
    assert row["replays"] == 3 and row["goal"]["median_steps"] == row["steps"]["median"]
    assert 0 < row["steps"]["median"] < 1  # ASHA stops trials the grid runs to the end
    assert row["regret"]["q25"] <= row["regret"]["median"] <= row["regret"]["q75"]


def test_an_interrupted_study_skips_what_it_wrote(dept_table_file, tmp_path, monkeypatch, capsys):
    """Without --only a study replays only what is not stored, and prints the stored rows
    marked as such; --only replays what it names again and replaces the stored row."""
    settings = {k: replays.SETTINGS[k] for k in ("tpe-asha-loss", "tpe-none", "random-none")}
    monkeypatch.setattr(replay_study, "SETTINGS", settings)
    monkeypatch.setattr(replay_study, "shipped_setting", lambda: "tpe-none")
    monkeypatch.setattr(replays, "shipped_setting", lambda: "tpe-none")  # its rows say it
    out = tmp_path / "study.jsonl"
    args = ["replay_study", "--table", str(dept_table_file), "--replays", "2", "--out", str(out)]
    monkeypatch.setattr(sys, "argv", [*args, "--only", "tpe-none"])
    replay_study.main()
    first = json.loads(out.read_text())
    assert first["setting"] == "tpe-none" and len(first["per_replay"]["heldout"]) == 2
    monkeypatch.setattr(sys, "argv", args)
    replay_study.main()
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["setting"] for r in rows] == ["tpe-none", "tpe-asha-loss", "random-none"]
    printed = capsys.readouterr().out
    assert "tpe-none (shipped) (stored" in printed and "| random-none " in printed
    assert "(baseline)" in printed  # tpe-asha-loss, the default --baseline
    monkeypatch.setattr(sys, "argv", [*args, "--only", "tpe-none"])
    replay_study.main()
    again = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["setting"] for r in again) == ["random-none", "tpe-asha-loss", "tpe-none"]
    printed = capsys.readouterr().out
    assert re.search(r"tpe-none \(shipped\) +\|", printed)  # replayed now: not stored
    assert "tpe-asha-loss (stored" in printed


@pytest.mark.slow
def test_rows_pair_by_replay_with_the_baseline(dept_table_file):
    """Replays of two settings see the same draws: the paired cell of a setting against
    itself is zero, and a row records each replay's held-out seed in rotation."""
    table = CurveTable.load(dept_table_file)
    row = replays.study_row("tpe-none", dept_table_file, table, 3, 0)
    again = replays.study_row("tpe-none", dept_table_file, table, 3, 0)
    assert row["heldout_seeds"] == [0, 1, 0]  # the synthetic table has seeds 0 and 1
    assert replay_study.paired_cell(row, again, "heldout").startswith("+0.00 [+0.00, +0.00]")


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
