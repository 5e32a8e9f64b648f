"""Issue 57, item 5, on the shipped tables and the stored replays: the held-out reference is
picked without the seed it is scored on, intervals are hierarchical (seeds, then replays), and
rows stored before either are re-scored exactly."""

from __future__ import annotations

import statistics

import numpy as np
import pytest

from benchmarks.common.paths import RESULTS
from benchmarks.search import replays as replay_rows
from raypeft.search.simulate import CurveTable, Paired, simulate
from raypeft.search.simulate.scores import Quality, Spread, hierarchical_interval

TABLES = {name: RESULTS / f"table_dept_{name}.json" for name in ("subj", "mr", "tweets")}


@pytest.fixture(scope="module")
def qualities():
    return {name: Quality.of(CurveTable.load(path)) for name, path in TABLES.items()}


def test_the_reference_is_the_best_mean_over_the_other_seeds(qualities):
    for quality in qualities.values():
        for seed in next(iter(quality.values.values())):
            others = {k: statistics.fmean(v for s, v in by.items() if s != seed)
                      for k, by in quality.values.items()}  # fmt: skip
            assert quality.best_without(seed) == max(others, key=others.get)
            assert quality.heldout_regret(quality.best_without(seed), seed) == 0.0


def test_picking_it_with_the_scoring_seed_inflated_held_out_regret_by_half_a_point_and_more(
    qualities,
):
    """What issue 57 measured: 0.65-1.25 points on tweets and MR (0.5 on SUBJ)."""
    inflation = {
        name: {s: round(q.reference_inflation(s), 6) for s in next(iter(q.values.values()))}
        for name, q in qualities.items()
    }
    assert inflation["mr"] == {0: 1.25, 1: 2.5, 2: 2.5, 3: 0.0, 4: 0.0}
    assert inflation["tweets"] == {0: 1.75, 1: 0.75, 2: 0.0, 3: 0.0, 4: 0.75}
    assert inflation["subj"] == {0: 0.0, 1: 0.0, 2: 1.5}
    for quality in qualities.values():  # the old reference scores minus the inflation
        for seed in next(iter(quality.values.values())):
            assert quality.heldout_regret(quality.best, seed) == pytest.approx(
                -quality.reference_inflation(seed)
            )


def stored(table: str, setting: str, replays: int, seed: int) -> dict:
    digest = replay_rows.digest(TABLES[table])
    rows = [r for r in replay_rows.read_rows(RESULTS / "replay_study.jsonl")
            if r["table_digest"] == digest and r["setting"] == setting
            and r["replays"] == replays and r["seed"] == seed]  # fmt: skip
    assert len(rows) == 1
    return rows[0]


def test_a_row_stored_before_is_rescored_to_what_a_replay_gives_now():
    row = stored("subj", "tpe-asha-loss", 30, 0)
    raw = next(r for r in replay_rows.stored_rows(RESULTS / "replay_study.jsonl")
               if r["table_digest"] == row["table_digest"] and r["setting"] == row["setting"]
               and r["replays"] == 30 and r["seed"] == 0)  # fmt: skip
    assert "reference" not in raw and row["reference"] == replay_rows.REFERENCE
    table = CurveTable.load(TABLES["subj"])
    search = replay_rows.search_with(replay_rows.SETTINGS["tpe-asha-loss"])
    now = simulate(search, table, replays=4, seed=0)
    assert [s.heldout_seed for s in now.scores] == row["heldout_seeds"][:4]
    assert [s.heldout for s in now.scores] == pytest.approx(row["per_replay"]["heldout"][:4])
    assert row["heldout"]["iqm"] != raw["heldout"]["iqm"]


def test_the_hierarchical_interval_of_200_replays_is_as_wide_as_their_5_seeds():
    """The shipped search against the previous one on 200 replays of README's task: over
    replays alone the interval excluded 0; drawn by seed first, it is twice as wide."""
    shipped = stored("tweets", "tpe-asha-loss-repeat3x1", 200, 3000)
    previous = stored("tweets", "tpe-none-repeat2x1", 200, 3000)
    heldout = [replay_rows.as_float(r["per_replay"]["heldout"]) for r in (shipped, previous)]
    paired = Paired.of(*heldout, groups=shipped["heldout_seeds"])
    assert paired.seeds == 5 and paired.mean == pytest.approx(0.20, abs=0.01)
    assert paired.replay_ci[0] > 0  # "worse, interval just above 0" before
    low, high = paired.mean_ci
    assert low < 0 < paired.mean < high
    assert high - low > 1.8 * (paired.replay_ci[1] - paired.replay_ci[0])
    again = Paired.of(*heldout, groups=shipped["heldout_seeds"])
    assert again.mean_ci == paired.mean_ci  # seeded: the same interval every time


def test_the_hierarchical_interval_spans_the_seeds_means_and_is_a_point_where_all_agree():
    x = np.array([0.0] * 10 + [1.0] * 10 + [2.0] * 10)  # replays agree within a seed
    groups = [0] * 10 + [1] * 10 + [2] * 10
    low, high = hierarchical_interval(x, groups)
    assert 0.0 <= low < 1.0 < high <= 2.0
    assert hierarchical_interval(np.ones(6), [0, 0, 1, 1, 2, 2]) == (1.0, 1.0)
    spread = Spread.of(list(x), groups=groups)
    assert spread.iqm_ci[0] < spread.iqm < spread.iqm_ci[1]
