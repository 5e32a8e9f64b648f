"""benchmarks.search.choose_default's rule on replay rows whose held-out regrets are given: the
leader, its ties (paired by replay), the cheapest of them, and the confirmation's verdict."""

from __future__ import annotations

import pytest

from benchmarks.common.paths import RESULTS
from benchmarks.search import choose_default
from benchmarks.search.replays import shipped_setting


def row(heldout: list[float], steps: float) -> dict:
    """A replay_study row with these held-out regrets per replay and median trial-steps."""
    ordered = sorted(heldout)
    middle = ordered[len(ordered) // 4 : len(ordered) - len(ordered) // 4]
    return {
        "heldout": {"n": len(heldout), "iqm": sum(middle) / len(middle)},
        "steps": {"median": steps},
        "per_replay": {"heldout": heldout},
    }


LEADER = [0.0, 0.25, 0.5, 0.0, 0.25, 0.5, 0.0, 0.25, 0.5, 0.0, 0.25, 0.5]
# a little worse on some replays, better on others: its paired interval reaches 0
NOISY = [0.25, 0.0, 0.5, 0.25, 0.25, 0.25, 0.0, 0.5, 0.5, 0.0, 0.5, 0.25]
WORSE = [v + 1.0 for v in LEADER]  # one point worse on every replay


@pytest.mark.slow
def test_a_cheaper_tie_is_chosen_over_the_leader():
    tables = [
        {"leader": row(LEADER, 0.29), "cheap-tie": row(NOISY, 0.19), "cheap-worse": row(WORSE, 0.1)}
    ] * 2
    choice = choose_default.choose(tables)
    assert choice.leader == "leader"
    assert choice.tied == ("leader", "cheap-tie")
    assert choice.chosen == "cheap-tie"
    assert choice.steps["cheap-tie"] == pytest.approx(0.19)


def test_an_interval_that_reaches_0_but_passes_the_margin_is_no_tie():
    """Low power is no tie: -1 and +2 points in turn (mean +0.5, an interval from below 0 to
    above the 0.5-point margin) loses to the leader however cheap it is."""
    wide = [v + (-1.0 if i % 2 else 2.0) for i, v in enumerate(LEADER)]
    tables = [{"leader": row(LEADER, 0.29), "cheap-wide": row(wide, 0.1)}]
    low, high = choose_default.paired(tables[0]["cheap-wide"], tables[0]["leader"]).mean_ci
    assert low < 0 < choose_default.MARGIN < high
    assert choose_default.choose(tables).chosen == "leader"


def test_a_tie_on_one_table_only_is_no_tie():
    first = {"leader": row(LEADER, 0.29), "cheap": row(NOISY, 0.19)}
    second = {"leader": row(LEADER, 0.29), "cheap": row(WORSE, 0.19)}
    assert choose_default.choose([first, second]).chosen == "leader"


def test_a_candidate_without_a_held_out_figure_is_refused():
    no_seed = {"heldout": {"n": 0, "iqm": None}, "steps": {"median": 0.1}, "per_replay": {}}
    with pytest.raises(SystemExit, match="no held-out figure for \\['no-seed'\\]"):
        choose_default.choose([{"leader": row(LEADER, 0.29), "no-seed": no_seed}])


@pytest.mark.slow
def test_confirmation_fails_where_the_chosen_loses_more_than_its_margin(capsys):
    shipped = shipped_setting()
    holds = {"a": {"cheap": row(NOISY, 0.19), shipped: row(LEADER, 0.29)}}
    assert choose_default.confirm({"cheap": 0.5}, holds, shipped) == {"cheap": True}
    fails = holds | {"b": {"cheap": row(WORSE, 0.19), shipped: row(LEADER, 0.29)}}
    assert choose_default.confirm({"cheap": 0.5}, fails, shipped) == {"cheap": False}
    printed = capsys.readouterr().out
    assert "| b " in printed and "+1.00 [+1.00, +1.00]" in printed
    assert "trial-steps 0.29" in printed  # both settings' figures


def test_the_margin_is_the_cost_saved_at_the_goals_rate():
    """0.5 points for 0.30 of the grid: the shipped search saves 0.13 of the grid against the
    previous one, worth 0.22 points; a setting that costs more must be better by as much."""
    assert choose_default.cost_margin(0.16, 0.29) == pytest.approx(0.13 * 0.5 / 0.3)
    assert choose_default.cost_margin(0.19, 0.16) == pytest.approx(-0.05)


def test_a_confirmation_runs_once_on_replays_no_one_read():
    """The stored study: README's task was read at seeds 0 (30) and 3000 (200) before, and
    by the confirmation of 2026-11-29 at seed 5000; that confirmation is in the ledger."""
    tweets = RESULTS / "table_dept_tweets.json"
    out = RESULTS / "replay_study.jsonl"
    assert choose_default.read_by_others(tweets, 3100, 200, out)
    assert choose_default.read_by_others(tweets, 5000, 200, out)
    assert not choose_default.read_by_others(tweets, 7000, 200, out)
    sets = [choose_default.ConfirmationSet(tweets, 5000, 200)]
    declared = choose_default.declaration(
        "tpe-asha-loss-grace2-repeat2x1-startup4", "tpe-asha-loss-repeat3x1", sets,
        choose_default.POINTS_PER_GRID,
    )  # fmt: skip
    entry = choose_default.ledger_entry(choose_default.LEDGER, declared)
    assert entry["date"] == "2026-11-29"
    assert entry["passes"] == {"tpe-asha-loss-grace2-repeat2x1-startup4": False,
                               "tpe-asha-loss": False}  # fmt: skip


def run_main(monkeypatch, tmp_path, *extra: str) -> None:
    """The 2026-11-29 command on copies of the stored replays and ledger."""
    for name in ("replay_study.jsonl", "confirmations.jsonl"):
        (tmp_path / name).write_text((RESULTS / name).read_text())
    argv = ["choose_default", "--choose", str(RESULTS / "table_dept_subj.json"),
            "--choose", str(RESULTS / "table_dept_mr.json"),
            "--confirm", str(RESULTS / "table_dept_tweets.json"), "--confirm-replays", "200",
            "--confirm-seed", "5000", "--out", str(tmp_path / "replay_study.jsonl"),
            "--ledger", str(tmp_path / "confirmations.jsonl"), *extra]  # fmt: skip
    monkeypatch.setattr("sys.argv", argv)
    choose_default.main()


@pytest.mark.slow
def test_the_confirmation_of_2026_11_29_is_shown_from_the_ledger_not_judged_again(
    monkeypatch, tmp_path, capsys
):
    run_main(monkeypatch, tmp_path, "--confirm-table-seed", "5000")
    out = capsys.readouterr().out
    assert "chosen tpe-asha-loss-grace2-repeat2x1-startup4" in out
    assert "run once on 2026-11-29, shown again" in out
    assert "NOT confirmed against tpe-asha-loss-repeat3x1 (margin -0.05 points)" in out
    assert "control, the cheapest candidate tpe-asha-loss: fails (margin +0.10 points)" in out
    assert (tmp_path / "confirmations.jsonl").read_text() == (
        RESULTS / "confirmations.jsonl"
    ).read_text()  # nothing recorded twice


def test_a_confirmation_on_replays_read_before_is_refused(monkeypatch, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        run_main(monkeypatch, tmp_path, "--confirm-table-seed", "3100")
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "its replays were read before (tpe-asha-loss-repeat3x1, seed 3000" in err
    assert "choose a seed past 3200" in err
