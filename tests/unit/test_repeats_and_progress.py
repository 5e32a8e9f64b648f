"""Repeated seeds of the top configurations, per-trial seeds, and the live trial table."""

from __future__ import annotations

import optuna
from ray.tune.search import Searcher

from raypeft.config.loading import validate_experiment
from raypeft.config.schema import trial_config
from raypeft.methods import BackboneDims
from raypeft.search.progress import ProgressPrinter
from raypeft.search.repeats import FixedConfigs, group_repeats, repeat_configs, top_trials
from raypeft.search.results import TrialResult
from raypeft.search.space import DefineByRun
from raypeft.training.result_keys import TRIAL_STEPS_KEY

BASE = {
    "name": "s",
    "model": {"name": "tiny-bert", "max_length": 16},
    "method": {"name": "pt", "prompt_length": 4},
    "train": {"max_steps": 30, "eval_every": 10, "seed": 7},
    "space": {"method.lr": {"choice": [0.1, 0.2]}},
}
DIMS = BackboneDims(hidden_size=32, num_layers=2, vocab_size=100, max_length=16)


def rows():
    return [
        TrialResult(
            "a", {"method.lr": 0.1}, {"best_val_accuracy": 0.60, "step": 30, TRIAL_STEPS_KEY: 30}
        ),
        TrialResult(
            "b", {"method.lr": 0.2}, {"best_val_accuracy": 0.90, "step": 10, TRIAL_STEPS_KEY: 30}
        ),  # early
        TrialResult(
            "c", {"method.lr": 0.3}, {"best_val_accuracy": 0.70, "step": 30, TRIAL_STEPS_KEY: 30}
        ),
        TrialResult("d", {"method.lr": 0.4}, {}),  # failed
    ]


def test_top_trials_prefer_full_length_trials():
    top = top_trials(rows(), "best_val_accuracy", "max", 2)
    assert [t.trial_id for t in top] == ["c", "a"]  # b's 0.9 is a low-fidelity score
    top3 = top_trials(rows(), "best_val_accuracy", "max", 3)
    assert [t.trial_id for t in top3] == ["c", "a", "b"]
    assert [t.trial_id for t in top_trials(rows(), "best_val_accuracy", "min", 1)] == ["a"]


def test_repeat_configs_and_groups():
    top = top_trials(rows(), "best_val_accuracy", "max", 2)
    configs = repeat_configs(top, base_seed=7, seeds=2)
    assert configs == [
        {"method.lr": 0.3, "train.seed": 8, "repeat.of": "c"},
        {"method.lr": 0.3, "train.seed": 9, "repeat.of": "c"},
        {"method.lr": 0.1, "train.seed": 8, "repeat.of": "a"},
        {"method.lr": 0.1, "train.seed": 9, "repeat.of": "a"},
    ]
    repeats = [
        TrialResult("r1", configs[0], {"best_val_accuracy": 0.50}),
        TrialResult("r2", configs[1], {"best_val_accuracy": 0.60}),
        TrialResult("r3", configs[2], {"best_val_accuracy": 0.62}),
        TrialResult("r4", configs[3], {}),  # failed: left out of the mean
    ]
    c, a = group_repeats(top, repeats, "best_val_accuracy", base_seed=7)
    assert c.scores == {7: 0.70, 8: 0.50, 9: 0.60} and c.trial_ids == {7: "c", 8: "r1", 9: "r2"}
    assert abs(c.mean - 0.6) < 1e-9 and abs(c.std - 0.1) < 1e-9
    assert a.scores == {7: 0.60, 8: 0.62} and abs(a.mean - 0.61) < 1e-9
    # a repeat's config is a normal trial config once its record keys are dropped
    cfg = validate_experiment(BASE, "x")
    trial = trial_config(cfg, configs[0])
    assert trial.train.seed == 8 and trial.method.lr == 0.3


def test_fixed_configs_searcher_hands_out_each_once(tmp_path):
    searcher = FixedConfigs([{"x": 1}, {"x": 2}], "m", "max")
    assert searcher.suggest("t1") == {"x": 1}
    searcher.save(str(tmp_path / "s.pkl"))
    assert searcher.suggest("t2") == {"x": 2}
    assert searcher.suggest("t3") == Searcher.FINISHED
    restored = FixedConfigs([], "m", "max")
    restored.restore(str(tmp_path / "s.pkl"))
    assert restored.suggest("t2") == {"x": 2}


def test_per_trial_seeds_come_from_the_optuna_trial_number():
    study = optuna.create_study(direction="maximize")
    fixed = DefineByRun(validate_experiment(BASE, "x"), DIMS)
    per_trial = DefineByRun(
        validate_experiment({**BASE, "search": {"trial_seed": "per_trial"}}, "x"), DIMS
    )
    assert "train.seed" not in fixed(study.ask())  # every trial trains with train.seed
    seeds = [per_trial(study.ask())["train.seed"] for _ in range(3)]
    assert seeds == [7 + 1, 7 + 2, 7 + 3]  # trial numbers 1, 2, 3 (one asked before)


class FakeTrial:
    def __init__(self, name, status, config, last_result):
        self.name, self.status, self.config, self.last_result = name, status, config, last_result
        self.trial_id = name

    def __str__(self):
        return self.name


def test_progress_table_and_lines():
    lines = []
    printer = ProgressPrinter(
        ["method.lr"], "best_val_accuracy", "max", num_samples=4, echo=lines.append
    )
    trials = [
        FakeTrial(
            "pt_1",
            "TERMINATED",
            {"method.lr": 0.1, "derived.trainable_params": 128},
            {"step": 30, "best_val_accuracy": 0.6, TRIAL_STEPS_KEY: 30},
        ),
        FakeTrial(
            "pt_2",
            "RUNNING",
            {"method.lr": 0.2, "derived.trainable_params": 128},
            {"step": 10, "best_val_accuracy": 0.5, TRIAL_STEPS_KEY: 30},
        ),
        FakeTrial(
            "pt_3",
            "TERMINATED",
            {"method.lr": 0.3, "derived.trainable_params": 128},
            {"step": 10, "best_val_accuracy": 0.7, TRIAL_STEPS_KEY: 30},
        ),
        FakeTrial("pt_4", "PENDING", {}, {}),
    ]
    printer.on_trial_complete(0, trials, trials[2])
    printer.on_trial_complete(0, trials, trials[0])
    assert lines == [
        "[1/4] pt_3 stopped early at step 10: best_val_accuracy 0.7",
        "[2/4] pt_1 finished: best_val_accuracy 0.6",
    ]
    table = printer.table(trials).splitlines()
    # what became of each trial, as the summary says it (not Tune's "terminated")
    assert "1 finished, 1 pending, 1 running, 1 stopped early of 4" in table[0]
    assert "best best_val_accuracy 0.7 (pt_3)" in table[0]
    assert table[1].split() == [
        "trial",
        "status",
        "lr",
        "trainable_params",
        "step",
        "best_val_accuracy",
    ]
    assert [row.split()[0] for row in table[2:]] == ["pt_2", "pt_3", "pt_1"]  # running, best
    assert table[3].split()[1:3] == ["stopped", "early"] and table[4].split()[1] == "finished"


def test_a_trial_a_pause_left_unfinished_is_shown_interrupted():
    printer = ProgressPrinter(["method.lr"], "best_val_accuracy", "max", num_samples=2)
    paused = FakeTrial("pt_1", "RUNNING", {"method.lr": 0.1}, {"step": 10})
    printer.table([paused])  # seen training by this search
    paused.status = "TERMINATED"  # the pause ended it
    assert printer.status(paused) == "interrupted"  # Tune never completed it
