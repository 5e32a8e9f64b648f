"""``raypeft simulate`` on synthetic learning-curve tables: the replay loop drives raypeft's
searcher and Tune's schedulers as Tune does, the scores are what they claim, and every bad
input is one line, exit 2, nothing created."""

from __future__ import annotations

import dataclasses
import json
import random

import numpy as np
import pytest
from click.testing import CliRunner

from raypeft.cli.main import main
from raypeft.config.loading import validate_experiment
from raypeft.config.space import configuration_key
from raypeft.errors import ConfigError
from raypeft.methods import BackboneDims
from raypeft.search.simulate import CurveTable, records, replay_config, simulate
from raypeft.search.simulate.replay import SeedDraw, draw_seeds, replay_search
from raypeft.search.simulate.scores import Paired, Quality, Spread, regret_at
from raypeft.search.simulate.table import Curve, continuous_clock

DIMS = BackboneDims(hidden_size=32, num_layers=2, vocab_size=100, max_length=16)
LRS = [0.1, 0.2, 0.3, 0.4]
LENGTHS = [2, 4, 6]
STEPS = [10, 20, 30, 40, 50, 60]
BASE = {
    "name": "synthetic",
    "model": {"name": "tiny-bert", "max_length": 16},
    "method": {"name": "pt", "prompt_length": 4},
    "train": {"max_steps": 60, "eval_every": 10},
}


def skill(lr: float, length: int) -> float:
    """The final accuracy of a configuration: best at lr 0.3, length 4."""
    return 0.9 - abs(lr - 0.3) - 0.02 * abs(length - 4)


def curve(lr: float, length: int, seed: int) -> Curve:
    """A rising curve towards the configuration's skill, shifted by its seed."""
    top = skill(lr, length) + 0.004 * (seed - 1)
    accuracy = [0.5 + (top - 0.5) * min(1.0, s / 40) for s in STEPS]
    return Curve(
        params={"method.lr": lr, "method.prompt_length": length},
        seed=seed,
        steps=list(STEPS),
        values={"val_accuracy": accuracy, "val_loss": [1.5 - a for a in accuracy]},
        wall_s=[s * (1 + 0.1 * length) for s in STEPS],
    )


@pytest.fixture
def table() -> CurveTable:
    space = {"method.lr": {"grid": LRS}, "method.prompt_length": {"grid": LENGTHS}}
    recorded = validate_experiment(
        {**BASE, "space": space, "search": {"sampler": "grid", "seeds": [0, 1, 2],
                                            "num_samples": 36}}, "recorded.yaml"
    )  # fmt: skip
    curves = [curve(lr, m, s) for lr in LRS for m in LENGTHS for s in (0, 1, 2)]
    return CurveTable(
        experiment=recorded.model_dump(mode="json"),
        metric="accuracy",
        mode="max",
        dims=dataclasses.asdict(DIMS),
        curves=curves,
        source={"experiment": "synthetic", "concurrency": 2},
    )


def search(space=None, **settings):
    space = space or {"method.lr": {"choice": LRS}, "method.prompt_length": {"choice": LENGTHS}}
    return validate_experiment({**BASE, "space": space, "search": settings}, "search.yaml")


def full_grid_search():
    """Every configuration of the table once, run to the end."""
    grid = {"method.lr": {"grid": LRS}, "method.prompt_length": {"grid": LENGTHS}}
    return search(grid, sampler="grid", num_samples=12, scheduler={"type": "none"})


def test_the_full_grid_replayed_finds_the_best_and_reports_every_recorded_value(table):
    cfg = replay_config(full_grid_search(), table, 2)
    draws = draw_seeds(table, random.Random(0))
    replay = replay_search(cfg, table, draws, 2)
    assert len(replay.trials) == 12 and all(t.ran_to_end for t in replay.trials)
    for trial in replay.trials:
        key = f"method.lr={trial.config['method.lr']}, "
        key += f"method.prompt_length={trial.config['method.prompt_length']}"
        recorded = draws.curves[key].values["val_accuracy"]
        assert trial.metrics["best_val_accuracy"] == max(recorded)
        assert trial.metrics["val_accuracy"] == recorded[-1]
    assert replay.trial_steps() == 12 * 60
    best = max(replay.trials, key=lambda t: t.metrics["best_val_accuracy"])
    assert replay.chosen is best


def test_a_tie_goes_to_the_trial_created_first_as_in_the_real_search(table):
    """Every configuration reports the same values, the slow ones end last: the choice is
    still the first trial created (``raypeft tune`` chooses on Tune's creation order)."""
    flat = [0.5, 0.6, 0.7, 0.7, 0.7, 0.7]
    cfg = replay_config(full_grid_search(), table, 2)
    draws = draw_seeds(table, random.Random(0))
    trials = replay_search(cfg, table, draws, 2).trials  # the same draws, the same first trial
    first = next(t.config for t in trials if t.trial_id == "replay_00000")

    def tied(c: Curve) -> Curve:
        slow = all(c.params[k] == first[k] for k in c.params)  # the first created ends last
        wall = [w * (100 if slow else 1) for w in c.wall_s]
        return dataclasses.replace(c, values=values, wall_s=wall)

    values = {"val_accuracy": flat, "val_loss": [1 - a for a in flat]}
    table = dataclasses.replace(table, curves=[tied(c) for c in table.curves])
    replay = replay_search(cfg, table, draw_seeds(table, random.Random(0)), 2)
    assert replay.trials[0].trial_id != "replay_00000"  # the first created did not end first
    assert replay.chosen.trial_id == "replay_00000"


def test_asha_stops_trials_the_grid_would_run_and_spends_less(table):
    tpe_asha = search(
        num_samples=12,
        seed=3,
        scheduler={"type": "asha", "grace_period": 1, "reduction_factor": 3},
    )
    sim = simulate(tpe_asha, table, replays=5)
    assert all(score.stopped > 0 for score in sim.scores)
    assert all(score.steps < 1.0 for score in sim.scores)
    for score in sim.scores:  # each replay's regret is what the table says of its choice
        assert score.regret == pytest.approx(sim.quality.regret(score.chosen))
        assert score.curve[-1][1] == pytest.approx(score.regret)


def test_a_hyperband_search_replays_the_same_every_time(table):
    """Ray's asynchronous HyperBand draws each trial's bracket from numpy's global RNG: the
    scheduler seeds it with search.seed, so whatever drew from it before, a replay (and a real
    search) puts its trials in the same brackets."""
    hyperband = {"type": "hyperband", "grace_period": 1, "reduction_factor": 2, "brackets": 3}
    cfg = replay_config(search(num_samples=12, seed=3, scheduler=hyperband), table, 2)
    draws = draw_seeds(table, random.Random(0))
    runs = []
    for disturbance in (1, 2, 3):
        np.random.seed(disturbance)
        replay = replay_search(cfg, table, draws, concurrency=2)
        runs.append(
            [(t.trial_id, t.metrics["step"], t.metrics["val_accuracy"]) for t in replay.trials]
        )
    assert runs[0] == runs[1] == runs[2]
    assert {step for _, step, _ in runs[0]} != {STEPS[-1]}  # some trials were stopped early


@pytest.mark.parametrize("sampler", ["random", "gp"])
def test_other_samplers_replay_through_the_same_searcher(table, sampler):
    sim = simulate(search(num_samples=8, sampler=sampler, scheduler={"type": "none"}), table, 3)
    assert sim.cfg.search.sampler == sampler
    assert [score.trials for score in sim.scores] == [8, 8, 8]
    assert all(score.chosen in sim.quality.means for score in sim.scores)


def test_answer_repeats_off_trains_a_proposed_again_configuration_again(table):
    """20 random proposals over 12 configurations: answered from the study, at most 12 train;
    with ``answer_repeats: false`` all 20 train (each another draw of its seeds)."""
    settings = {"num_samples": 20, "sampler": "random", "scheduler": {"type": "none"}}
    answered = simulate(search(**settings), table, 2)
    trained = simulate(search(**settings, answer_repeats=False), table, 2)
    assert all(score.trials <= 12 for score in answered.scores)
    assert [score.trials for score in trained.scores] == [20, 20]


def test_repeat_best_retrains_the_top_trials_on_other_seeds_and_the_best_mean_wins(table):
    """One lucky draw leads the search (0.92 at seed 0, mean 0.80) and the best configuration
    (mean 0.90) drew its worst seed: ``search.repeat_best`` trains the top 4 again on the
    table's other seeds, to the end, after the search, and chooses by the mean."""
    finals = {(0.3, 4): [0.80, 0.95, 0.95], (0.2, 4): [0.92, 0.74, 0.74]}

    def noisy(c: Curve) -> Curve:
        top = finals.get((c.params["method.lr"], c.params["method.prompt_length"]))
        if top is None:
            return c
        accuracy = [0.5 + (top[c.seed] - 0.5) * min(1.0, s / 40) for s in STEPS]
        return dataclasses.replace(c, values={"val_accuracy": accuracy,
                                              "val_loss": [1.5 - a for a in accuracy]})  # fmt: skip

    table = dataclasses.replace(table, curves=[noisy(c) for c in table.curves])
    draws = SeedDraw.fixed({c.configuration: c for c in table.curves if c.seed == 0}, table)
    grid = {"method.lr": {"grid": LRS}, "method.prompt_length": {"grid": LENGTHS}}
    plain = search(grid, sampler="grid", num_samples=12, scheduler={"type": "none"})
    repeated = search(grid, sampler="grid", num_samples=12, scheduler={"type": "none"},
                      repeat_best={"top_k": 4, "seeds": 2})  # fmt: skip
    alone = replay_search(replay_config(plain, table, 2), table, draws, 2)
    replay = replay_search(replay_config(repeated, table, 2), table, draws, 2)
    assert (alone.chosen.config["method.lr"], alone.chosen.config["method.prompt_length"]) == (
        0.2, 4)  # fmt: skip
    assert (replay.chosen.config["method.lr"], replay.chosen.config["method.prompt_length"]) == (
        0.3, 4)  # fmt: skip
    repeats = replay.trials[12:]
    assert len(repeats) == 8 and all(t.ran_to_end for t in repeats)
    assert replay.trial_steps() == 20 * 60 and replay.wall_s > alone.wall_s
    for trial in repeats:  # train.seed 43, 44 -> the configuration's seeds 1, 2
        key = configuration_key({k: trial.config[k] for k in grid})
        seed = trial.config["train.seed"] - 42
        assert trial.metrics["best_val_accuracy"] == max(table.curve(key, seed).values[
            "val_accuracy"])  # fmt: skip
    sim = simulate(repeated, table, replays=3)
    assert all(s.curve[-1][1] == pytest.approx(s.regret) for s in sim.scores)
    # the search saw seed 0 of every configuration, the repeats seeds 1 and 2 of the top 4
    lucky, best = "method.lr=0.2, method.prompt_length=4", "method.lr=0.3, method.prompt_length=4"
    assert alone.seen[lucky] == {0} and replay.seen[best] == {0, 1, 2}
    quality = Quality.of(table)
    # scored on a seed: against the best configuration's value on that same seed
    assert quality.heldout_regret(lucky, 1) == pytest.approx(100 * (0.95 - 0.74))
    assert quality.heldout_regret(best, 2) == 0.0
    assert np.isnan(quality.heldout_regret(best, None))  # no seed held out


def test_repeat_best_needs_as_many_other_recorded_seeds(table):
    too_many = search(num_samples=4, repeat_best={"top_k": 2, "seeds": 3})
    with pytest.raises(ConfigError, match=r"repeat_best.seeds: 3 more seeds .* \(at most 2\)"):
        replay_config(too_many, table, 2)


def test_per_trial_draws_one_seed_per_configuration_at_random_and_holds_one_out(table):
    first = draw_seeds(table, random.Random("0/0"), "per_trial", replay=0)
    assert len(first.curves) == 12
    assert first.heldout == 0  # replay 0 holds out the first seed, replay 1 the second, ...
    assert {c.seed for c in first.curves.values()} == {1, 2}  # never the held-out seed
    other = draw_seeds(table, random.Random("0/1"), "per_trial", replay=1)
    assert other.heldout == 1 and {c.seed for c in other.curves.values()} == {0, 2}


def test_fixed_draws_one_seed_for_every_configuration_rotated_across_replays(table):
    """``trial_seed: fixed`` trains every trial of a search on one seed: a replay reports one
    recorded seed for all its configurations, and over 6 replays every (held-out, seen) pair
    of the 3 seeds comes once, so no seed is favoured."""
    pairs = []
    for i in range(6):
        draws = draw_seeds(table, random.Random(f"0/{i}"), "fixed", replay=i)
        seen = {c.seed for c in draws.curves.values()}
        assert len(seen) == 1 and draws.heldout not in seen
        pairs.append((draws.heldout, seen.pop()))
    assert sorted(pairs) == [(h, s) for h in (0, 1, 2) for s in (0, 1, 2) if h != s]


def test_no_seed_is_held_out_when_the_repeats_need_every_other_seed(table):
    assert draw_seeds(table, random.Random(0), "fixed", replay=0, spare=1).heldout == 0
    assert draw_seeds(table, random.Random(0), "fixed", replay=0, spare=2).heldout is None


def test_repeats_draw_seeds_not_yet_seen_at_random_not_the_lowest(table):
    """A real search trains a top configuration again on seeds it has not trained yet; which
    recorded seed stands for ``train.seed + 1`` is drawn at random per replay, so the lowest
    other seed is not always the one a repeat reports (nor ever the held-out one)."""
    grid = {"method.lr": {"grid": LRS}, "method.prompt_length": {"grid": LENGTHS}}
    repeated = search(grid, sampler="grid", num_samples=12, scheduler={"type": "none"},
                      repeat_best={"top_k": 3, "seeds": 1})  # fmt: skip
    cfg = replay_config(repeated, table, 2)
    repeat_seeds = set()
    for i in range(12):
        draws = draw_seeds(table, random.Random(f"0/{i}"), "per_trial", replay=i, spare=1)
        replay = replay_search(cfg, table, draws, 2)
        for trial in replay.trials[12:]:
            key = configuration_key({k: trial.config[k] for k in grid})
            drawn = draws.curves[key].seed
            reported = trial.metrics["best_val_accuracy"]
            seeds = [c.seed for c in table.by_configuration()[key]
                     if max(c.values["val_accuracy"]) == reported]  # fmt: skip
            assert seeds and draws.heldout not in seeds and drawn not in seeds
            repeat_seeds.add((draws.heldout, drawn, seeds[0]))
    # the seed a repeat reports is the only one left: held-out and drawn seeds vary by replay
    assert len({h for h, _, _ in repeat_seeds}) == 3 and len({r for _, _, r in repeat_seeds}) == 3


def test_two_searches_replayed_on_the_same_draws_pair_by_replay(table):
    """The same draws for both (same --seed, same policy): the paired difference of a search
    with itself is exactly 0 on every replay, and ASHA against the full grid spends less."""
    none = search(num_samples=12, seed=3, scheduler={"type": "none"})
    asha = search(num_samples=12, seed=3, scheduler={"type": "asha", "grace_period": 1,
                                                     "reduction_factor": 3})  # fmt: skip
    a, again, b = simulate(none, table, 6), simulate(none, table, 6), simulate(asha, table, 6)
    assert [s.heldout_seed for s in a.scores] == [0, 1, 2, 0, 1, 2]
    same = a.paired(again)
    assert (same.n, same.mean, same.ties) == (6, 0.0, 6) and np.isnan(same.p_value)
    cheaper = b.paired(a, "steps")
    assert cheaper.lower == 6 and cheaper.mean < 0 and cheaper.mean_ci[1] < 0


def test_paired_figures_count_wins_and_test_with_wilcoxon():
    paired = Paired.of([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], [0.0] * 8)
    assert (paired.n, paired.lower, paired.higher, paired.ties) == (8, 0, 8, 0)
    assert paired.mean == 4.5 and paired.mean_ci[0] > 0
    assert paired.p_value < 0.01
    assert "+4.50" in paired.describe() and "8 higher" in paired.describe()
    with_nan = Paired.of([1.0, float("nan")], [0.0, 0.0])
    assert with_nan.n == 1


def test_quality_is_the_seed_mean_and_regret_is_in_points(table):
    quality = Quality.of(table)
    assert quality.best == "method.lr=0.3, method.prompt_length=4"
    assert quality.means[quality.best] == pytest.approx(0.9)
    worst = "method.lr=0.1, method.prompt_length=2"
    assert quality.regret(worst) == pytest.approx(100 * (0.9 - skill(0.1, 2)))
    assert quality.normalised(quality.best) == 0.0
    assert quality.tolerance(0.5) == (0.5, "0.5 points")


def test_a_resumed_trials_restarted_clock_is_read_as_going_on():
    """Recorded before the clock went on across a resume: a drop is a new process (twice here,
    as in a SUBJ trial), whose seconds add to where the trial stood; a monotone clock is kept."""
    assert continuous_clock([35, 70, 33, 82, 132, 185]) == [35, 70, 103, 152, 202, 255]
    assert continuous_clock([60, 120, 179, 237, 99, 96]) == [60, 120, 179, 237, 336, 432]
    assert continuous_clock([10.0, 20.5, 31.0]) == [10.0, 20.5, 31.0]
    assert continuous_clock([]) == []


def test_spread_and_anytime_helpers():
    spread = Spread.of([1.0, 2.0, 3.0, 4.0, 100.0])
    assert spread.median == 3.0 and spread.iqm == pytest.approx(3.0)
    assert spread.median_ci[0] <= spread.median <= spread.median_ci[1]
    curve_points = [(0.1, 5.0), (0.4, 1.0)]
    assert regret_at(curve_points, 0.05) != regret_at(curve_points, 0.05)  # NaN before
    assert regret_at(curve_points, 0.2) == 5.0 and regret_at(curve_points, 1.0) == 1.0


@pytest.mark.slow
def test_simulate_end_to_end_writes_summary_figures_and_an_mlflow_run(table, tmp_path):
    table.save(tmp_path / "table.json")
    (tmp_path / "search.yaml").write_text(
        json.dumps({**BASE, "space": {"method.lr": {"choice": LRS}},
                    "search": {"num_samples": 4, "scheduler": {"type": "asha"}}})
    )  # fmt: skip
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result = CliRunner().invoke(
        main,
        ["simulate", str(tmp_path / "search.yaml"), "--table", str(tmp_path / "table.json"),
         "--replays", "6", "--out", str(tmp_path / "out"), "--tracking-uri", uri],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "synthetic" in result.output and "regret" in result.output
    assert "goal" in result.output
    folder = tmp_path / "out" / "synthetic"
    rows = (folder / "replays.csv").read_text().splitlines()
    assert len(rows) == 1 + 6
    strict = {"parse_constant": lambda c: pytest.fail(f"{c} in summary.json: not JSON")}
    summary = json.loads((folder / "summary.json").read_text(), **strict)
    assert summary["replays"] == 6 and set(summary["figures"]) >= {"regret", "steps"}
    assert summary["grid_trial_steps"] == len(LRS) * STEPS[-1]  # the fractions' denominator
    assert summary["grid_wall_s"] > 0
    assert (tmp_path / "out" / "anytime.png").stat().st_size > 0
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("synthetic-simulate")
    (run,) = client.search_runs([experiment.experiment_id])
    assert "regret_median" in run.data.metrics and "steps_median" in run.data.metrics
    assert {a.path for a in client.list_artifacts(run.info.run_id)} >= {"replays.csv"}


@pytest.mark.parametrize(
    "space, fragment",
    [
        ({"method.lr": {"loguniform": [0.1, 0.4]}}, "space.method.lr: a range"),
        ({"method.lr": {"choice": [0.1, 0.7]}}, "space.method.lr: [0.7] not in the table"),
        ({"train.head_lr": {"choice": [0.1]}}, "space.train.head_lr: the table does not vary"),
    ],
)
def test_bad_search_files_are_one_line_errors_and_nothing_is_created(
    table, tmp_path, monkeypatch, space, fragment
):
    table.save(tmp_path / "table.json")
    (tmp_path / "search.yaml").write_text(json.dumps({**BASE, "space": space}))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(
        main, ["simulate", "search.yaml", "--table", "table.json", "--replays", "2"]
    )
    assert result.exit_code == 2
    assert fragment in result.output and len(result.output.strip().splitlines()) == 1
    assert "error: search.yaml: space." in result.output  # which file, of several
    assert sorted(p.name for p in tmp_path.iterdir()) == ["search.yaml", "table.json"]


def test_a_fixed_value_the_table_lacks_and_a_damaged_table_are_refused(table, tmp_path):
    table.save(tmp_path / "table.json")
    fixed = {**BASE, "method": {"name": "pt", "prompt_length": 5},
             "space": {"method.lr": {"choice": LRS}}}  # fmt: skip
    (tmp_path / "search.yaml").write_text(json.dumps(fixed))
    (tmp_path / "damaged.json").write_text('{"format": "raypeft.curves/1", "curv')
    runner = CliRunner()
    for table_file, fragment in [
        ("table.json", "method.prompt_length: the file fixes it at 5"),
        ("damaged.json", "not a learning-curve table"),
        ("absent.json", "no such table file"),
    ]:
        result = runner.invoke(
            main, ["simulate", str(tmp_path / "search.yaml"), "--table", str(tmp_path / table_file)]
        )
        assert result.exit_code == 2 and fragment in result.output, result.output


def test_nan_in_a_summary_is_written_as_null():
    summary = {"figures": {"heldout": {"median": float("nan"), "q": [1.0, float("nan")]}}}
    assert records.nan_as_null(summary) == {
        "figures": {"heldout": {"median": None, "q": [1.0, None]}}
    }
