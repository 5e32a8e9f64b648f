"""``search.seeds``: every configuration of a grid once per seed, grouped by configuration."""

from __future__ import annotations

import collections

import pytest

from raypeft.config.loading import validate_experiment
from raypeft.config.schema import ExperimentConfig
from raypeft.config.space import configuration_key
from raypeft.errors import ConfigError
from raypeft.methods import BackboneDims
from raypeft.search.objectives import Constraints, ResolvedObjective
from raypeft.search.searcher import StudySearcher, discrete_space
from raypeft.search.space import DefineByRun
from raypeft.search.study import CONFIGURATION_ATTR, build_sampler, open_storage

BASE = {
    "name": "s",
    "model": {"name": "tiny-bert", "max_length": 16},
    "method": {"name": "pt", "prompt_length": 4},
    "train": {"max_steps": 30, "eval_every": 10, "seed": 7},
    "space": {"method.lr": {"grid": [0.1, 0.2]}, "method.prompt_length": {"choice": [2, 4]}},
}
DIMS = BackboneDims(hidden_size=32, num_layers=2, vocab_size=100, max_length=16)


def experiment(**search) -> ExperimentConfig:
    return validate_experiment({**BASE, "search": {"sampler": "grid", **search}}, "exp.yaml")


def test_seeds_are_a_grid_over_train_seed_and_survive_a_round_trip():
    cfg = experiment(seeds=[0, 1, 2], num_samples=12)
    assert cfg.space["train.seed"].listed() == [0, 1, 2]
    assert cfg.grid_size() == 2 * 3  # the choice key is sampled, not gridded
    again = ExperimentConfig.model_validate(cfg.model_dump(mode="json"))
    assert again.space == cfg.space
    assert discrete_space(cfg)  # seeds differ, so no configuration is answered from another


def test_the_configuration_leaves_the_seed_and_derived_values_out():
    cfg = experiment(seeds=[0, 1], num_samples=8)
    one = {"method.lr": 0.1, "method.prompt_length": 4, "train.seed": 0, "derived.x": 1}
    other = {**one, "train.seed": 1, "derived.x": 2}
    assert cfg.configuration_of(one) == cfg.configuration_of(other)
    assert cfg.configuration_of(one) == "method.lr=0.1, method.prompt_length=4"
    assert configuration_key({"b": 1, "a": 2, "train.seed": 3}) == "a=2, b=1"


@pytest.mark.parametrize(
    "search, fragment",
    [
        ({"seeds": [0, 1], "sampler": "tpe"}, "search.seeds: every configuration runs once per"),
        ({"seeds": [0, 0]}, "seeds repeat a seed"),
        ({"seeds": []}, "search.seeds"),
    ],
)
def test_bad_seeds_are_one_line_errors_naming_the_key(search, fragment):
    with pytest.raises(ConfigError) as err:
        experiment(**search)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_seeds_given_twice_differently_are_refused():
    data = {**BASE, "search": {"sampler": "grid", "seeds": [0, 1]}}
    data["space"] = {**BASE["space"], "train.seed": {"grid": [3, 4]}}
    with pytest.raises(ConfigError, match="given twice"):
        validate_experiment(data, "exp.yaml")


def test_a_grid_with_seeds_gives_each_configuration_every_seed(tmp_path):
    cfg = experiment(seeds=[0, 1, 2], num_samples=12)
    acc = ResolvedObjective("accuracy", "max", "best_val_accuracy")
    search = StudySearcher(
        DefineByRun(cfg, DIMS),
        open_storage(f"sqlite:///{tmp_path / 'optuna.db'}"),
        "study",
        build_sampler(cfg),
        [acc],
        Constraints({}),
        "parent",
        answer_repeats=discrete_space(cfg),
    )
    configs = [search.suggest(f"t{i}") for i in range(12)]
    seeds = collections.defaultdict(set)
    for trial in search.study.get_trials(deepcopy=False):
        seeds[trial.user_attrs[CONFIGURATION_ATTR]].add(trial.params["train.seed"])
    assert len(seeds) == 4 and all(s == {0, 1, 2} for s in seeds.values())
    assert {c["train.seed"] for c in configs} == {0, 1, 2}


def test_the_table_recordings_are_valid_seeded_grids():
    from pathlib import Path

    from raypeft.config.loading import load_experiment

    files = sorted((Path(__file__).resolve().parents[2] / "benchmarks" / "tables").glob("*.yaml"))
    assert files
    for path in files:
        cfg = load_experiment(path)
        assert cfg.search.sampler == "grid" and len(cfg.search.seeds) >= 3
        assert cfg.search.num_samples == cfg.grid_size()  # every configuration x seed
