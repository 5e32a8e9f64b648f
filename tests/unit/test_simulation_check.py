"""benchmarks.search.simulation_check's real runs: the experiment it runs is the one ``raypeft
simulate`` replays, with the real run's own seeds (none the table recorded), and a real run
is placed among the replays figure by figure."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from benchmarks.search import simulation_check
from benchmarks.search.replays import search_with
from raypeft.config.loading import load_experiment
from raypeft.search.simulate import CurveTable, replay_config, simulate

REPO = Path(__file__).resolve().parents[2]


def test_a_real_run_is_the_replayed_search_at_unrecorded_seeds(dept_table_file, tmp_path):
    table = CurveTable.load(dept_table_file)
    search = search_with({})
    overrides = ["task.max_test_examples=8"]
    cfg = simulation_check.real_config(search, table, 2, 100, overrides, tmp_path)
    replayed = replay_config(search, table, table.concurrency())
    assert cfg.space == replayed.space and cfg.train.max_steps == replayed.train.max_steps
    assert cfg.search.seed == search.search.seed + 2 and cfg.train.seed == 102
    assert cfg.train.seed not in table.seeds()
    assert cfg.search.max_concurrent == 2  # the table's concurrency
    assert cfg.tracking.uri == f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert cfg.task.max_test_examples == 8


def test_the_grid_figures_are_the_tables(dept_table_file):
    table = CurveTable.load(dept_table_file)
    sim = simulate(search_with({}), table, replays=3, concurrency=2)
    steps, wall = sim.grid_figures()
    assert steps == 48 * 160
    # 48 trials of 80 s (the synthetic curves' last wall time), two at a time
    assert wall == 48 * 80 / 2


def replays(table_file):
    """Four replays of the shipped search against the synthetic table."""
    return simulate(search_with({}), CurveTable.load(table_file), replays=4)


def report_of(sim, capsys, **figures) -> str:
    """What ``report`` prints for one real run (k 0, seeds 0/100) with ``figures``."""
    run = {
        "k": 0, "sampler_seed": 0, "train_seed": 100, "chosen": sim.scores[0].chosen,
        "regret": 0.0, "normalised": 0.0, "steps": 0.3, "wall": 0.3,
        "trials": 14, "stopped": 0, "search_wall_s": 60.0, "trials_wall_s": 50.0,
        "best_val": 0.8, "test": 0.79,
    } | figures  # fmt: skip
    args = type("Args", (), {"space": Path("dept.yaml"), "table": Path("t.json")})
    simulation_check.report(sim, [run], args, 48 * 160, 3840.0)
    return capsys.readouterr().out


def test_a_real_run_is_placed_among_the_replays(dept_table_file, capsys):
    sim = replays(dept_table_file)
    steps = sorted(s.steps for s in sim.scores)
    out = report_of(sim, capsys, steps=steps[-1] + 1.0)
    assert "| real run 0 (seeds 0/100)" in out
    assert f"{steps[-1] + 1.0:.2f} (p100, OUT)" in out  # beyond every replay's compute
    assert simulation_check.percentile_of(2.0, [1.0, 2.0, 3.0, 4.0]) == 50.0


def test_a_real_runs_regret_is_also_placed_among_the_heldout_seed_regrets(dept_table_file, capsys):
    sim = replays(dept_table_file)
    unseen = sorted(s.heldout for s in sim.scores)
    out = report_of(sim, capsys, regret=unseen[-1] + 5.0)
    assert "regret, held-out seed" in out and "normalised, held-out seed" in out
    # beyond every replay's held-out-seed regret: the 100th percentile, outside the band
    assert out.count(f"{unseen[-1] + 5.0:.2f} (p100, OUT)") == 2


@pytest.mark.slow
def test_the_pace_is_the_real_clock_over_the_tables_at_the_same_configuration_and_step(
    dept_table_file, tmp_path
):
    """Trials logged as raypeft logs them (the configuration tag, ``wall_time_s`` per
    evaluation) on a machine 1.5 times slower than the synthetic table's (0.5 s a step): pace
    1.5; a step the table never recorded counts for nothing."""
    from mlflow.tracking import MlflowClient

    from raypeft.config.space import configuration_key
    from raypeft.tracking.tags import CONFIGURATION_TAG

    table = CurveTable.load(dept_table_file)
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.create_experiment("pace")
    trials = []
    for a1, a2, m in [(0.3, 1e-4, 20), (0.5, 5e-3, 80)]:
        values = {"method.lr_prompt": a1, "method.lr_lowrank": a2, "method.prompt_length": m}
        run = client.create_run(experiment, tags={CONFIGURATION_TAG: configuration_key(values)})
        for step in (40, 80, 200):
            client.log_metric(run.info.run_id, "wall_time_s", 1.5 * 0.5 * step, step=step)
        trials.append(client.get_run(run.info.run_id))
    assert simulation_check.pace(client, trials, table) == 1.5


def test_the_wall_is_also_placed_at_the_tables_pace(dept_table_file, capsys):
    sim = replays(dept_table_file)
    walls = sorted(s.wall for s in sim.scores)
    out = report_of(sim, capsys, wall=2 * walls[-1], pace=2.0)
    assert f"{2 * walls[-1]:.2f} (p100, OUT)" in out  # as measured: twice the slowest replay
    assert f"| {walls[-1]:.2f} (p100, " in out  # at the table's pace: the slowest replay
    assert "pace 2.00x the table's clock" in out
    assert "| n/a" in report_of(sim, capsys)  # a run recorded before its pace was measured


def test_real_runs_are_keyed_by_the_files_settings_not_its_comments(tmp_path):
    path = tmp_path / "dept.yaml"
    path.write_text("# 17.6 min of search\nsearch:\n  num_samples: 12\n")
    before = simulation_check.settings_digest(path)
    path.write_text("# 18.0 min of search, measured again\nsearch: {num_samples: 12}\n")
    assert simulation_check.settings_digest(path) == before
    path.write_text("search:\n  num_samples: 13\n")
    assert simulation_check.settings_digest(path) != before


TWEETS = REPO / "benchmarks" / "results" / "table_dept_tweets.json"
STORED = TWEETS.parent / "simulation_check.jsonl"


def test_a_real_run_is_scored_by_its_unseen_seed_mean_on_the_shipped_table():
    """README's task: the shipped search's real run 1 chose (3e-1, 1e-4, 40), 2.40 points
    below the best seed-mean; on each of the 5 seeds against the reference picked without it,
    1.75 points on average (the reference no longer flatters by the seed it is scored on)."""
    quality = simulate_quality(TWEETS)
    chosen = "method.lr_lowrank=0.0001, method.lr_prompt=0.3, method.prompt_length=40"
    assert quality.regret(chosen) == pytest.approx(2.40)
    assert simulation_check.unseen_mean(quality, chosen) == pytest.approx(1.75)


def simulate_quality(path):
    from raypeft.search.simulate.scores import Quality

    return Quality.of(CurveTable.load(path))


def test_paired_real_runs_pair_by_k_beside_the_replays_prediction(tmp_path):
    """The stored real runs on README's task, 3 of the shipped search and 3 of the one before
    it at the same seeds: paired by k, against 2 replays of each (to keep this quick)."""
    previous = tmp_path / "dept_previous.yaml"
    data = yaml.safe_load((REPO / "search_spaces" / "dept.yaml").read_text())
    data["search"] = {**data["search"], "scheduler": {"type": "none"},
                      "repeat_best": {"top_k": 2, "seeds": 1}}  # fmt: skip
    previous.write_text(yaml.safe_dump(data))
    spaces = [REPO / "search_spaces" / "dept.yaml", previous]
    keys = [simulation_check.run_key(TWEETS, s, 100) for s in spaces]
    runs = [simulation_check.done_runs(STORED, key) for key in keys]
    assert [len(r) for r in runs] == [3, 3]  # the runs of 2026-11-28, pairs 0-2
    table = CurveTable.load(TWEETS)
    sims = [simulate(load_experiment(s), table, replays=2, label=s.stem) for s in spaces]
    line = simulation_check.pairs_line(sims, runs)
    assert line.startswith("dept minus dept_previous, 3 real pairs: unseen-seed mean regret +1.02")
    assert "trial-steps / grid -0.09" in line and "The replays predict" in line
    assert "(3 runs: 0.35, 1.75, 1.05)" in simulation_check.means_line(sims[0], runs[0])
