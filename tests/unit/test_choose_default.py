"""benchmarks.choose_default's rule on replay rows whose held-out regrets are given: the
leader, its ties (paired by replay), the cheapest of them, and the confirmation's verdict."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import choose_default
from benchmarks.replay_study import shipped_setting


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


def test_confirmation_fails_where_the_chosen_is_worse_than_the_shipped(capsys):
    shipped = shipped_setting()
    holds = {"a": {"cheap": row(NOISY, 0.19), shipped: row(LEADER, 0.29)}}
    assert choose_default.confirm("cheap", [shipped], holds, shipped)
    fails = holds | {"b": {"cheap": row(WORSE, 0.19), shipped: row(LEADER, 0.29)}}
    assert not choose_default.confirm("cheap", [shipped], fails, shipped)
    printed = capsys.readouterr().out
    assert "| b " in printed and "+1.00 [+1.00, +1.00]" in printed


def test_confirmation_sets_replay_the_confirm_tables_and_fresh_choice_replays():
    sets = choose_default.confirmation_sets(
        [Path("table_dept_subj.json"), Path("table_dept_mr.json")],
        [Path("table_dept_tweets.json")],
        confirm_seed=2000,
        table_seed=3000,
        replays=200,
    )
    assert [(s.name, s.replays) for s in sets] == [
        ("dept_tweets, seed 3000", 200),
        ("dept_subj, seed 2000", 200),
        ("dept_mr, seed 2000", 200),
    ]
