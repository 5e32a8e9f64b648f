"""Replayed trials (``resources.trial_runner: replay``): which configurations a table can
replay (one-line errors naming the key), and which recorded seed a trial reports."""

from __future__ import annotations

import pytest

from raypeft.config.schema import ExperimentConfig, trial_config
from raypeft.errors import ConfigError
from raypeft.search.replay_trials import check_replayable, load_replay_table, replayed_curve
from tests.helpers import TINY_SEARCH_BASE
from tests.replay_tables import grid_table

GRID = {"method.lr_prompt": [0.1, 0.3], "method.prompt_length": [2, 4]}


def _cfg(table_path, **changes) -> ExperimentConfig:
    data = {
        "name": "replay",
        **TINY_SEARCH_BASE,
        "space": {key: {"grid": values} for key, values in GRID.items()},
        "search": {"num_samples": 4, "sampler": "grid"},
        "resources": {"trial_runner": "replay"},
        "replay": {"table": str(table_path)},
    }
    for key, value in changes.items():
        data[key] = value
    return ExperimentConfig.model_validate(data)


@pytest.fixture
def table(tmp_path):
    path = tmp_path / "table.json"
    return path, grid_table(path, _cfg(path).model_dump(mode="json"), GRID, [0, 1, 2], [4, 8, 12])


def test_the_tables_grid_is_replayable(table):
    path, _ = table
    check_replayable(_cfg(path), load_replay_table(_cfg(path)))


@pytest.mark.parametrize(
    ("space", "message"),
    [
        (
            {"method.lr_prompt": {"grid": [0.1, 0.2]}},
            "space.method.lr_prompt: [0.2] not in replay.table, which holds [0.1, 0.3]",
        ),
        (
            {"method.lr_lowrank": {"grid": [0.001]}},
            "space.method.lr_lowrank: replay.table does not vary it",
        ),
        (
            {"method.lr_prompt": {"uniform": [0.1, 0.3]}},
            "space.method.lr_prompt: a range, but replay.table holds the points [0.1, 0.3]",
        ),
        (
            {"method.lr_prompt": {"grid": [0.1]}},  # prompt_length fixed at 4: recorded
            None,
        ),
    ],
)
def test_a_configuration_outside_the_table_is_one_line_naming_the_key(table, space, message):
    path, recorded = table
    cfg = _cfg(path, space=space, search={"num_samples": 2, "sampler": "tpe"})
    if message is None:
        check_replayable(cfg, recorded)
        return
    with pytest.raises(ConfigError) as err:
        check_replayable(cfg, recorded)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_fixed_value_the_table_never_recorded_is_refused(table):
    path, recorded = table
    method = {**TINY_SEARCH_BASE["method"], "prompt_length": 6}
    cfg = _cfg(path, method=method, space={"method.lr_prompt": {"grid": [0.1, 0.3]}},
               search={"num_samples": 2, "sampler": "grid"})  # fmt: skip
    with pytest.raises(ConfigError, match=r"method.prompt_length: 6, but replay.table recorded"):
        check_replayable(cfg, recorded)


def test_the_training_length_must_be_the_recordings(table):
    path, recorded = table
    train = {**TINY_SEARCH_BASE["train"], "max_steps": 16}
    with pytest.raises(ConfigError, match=r"train.max_steps: 16, but replay.table recorded 12"):
        check_replayable(_cfg(path, train=train), recorded)


def test_a_missing_table_is_one_line_naming_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"^replay.table: .*nope.json: no such table file$"):
        load_replay_table(_cfg(tmp_path / "nope.json"))


def test_replay_needs_a_table_and_a_table_needs_replay(tmp_path):
    with pytest.raises(ValueError, match="replay.table: resources.trial_runner: replay needs"):
        _cfg(tmp_path, replay={})
    with pytest.raises(ValueError, match=r"replay.table: set .* but trials train"):
        _cfg(tmp_path / "t.json", resources={"trial_runner": "auto"})


def test_a_trial_replays_the_recorded_seed_at_its_seed_modulo_their_number(table):
    path, recorded = table
    base = _cfg(path)
    point = {"method.lr_prompt": 0.3, "method.prompt_length": 2}
    for seed, replayed in [(0, 0), (1, 1), (2, 2), (42, 0), (43, 1)]:
        cfg = trial_config(base, {**point, "train.seed": seed})
        curve = replayed_curve(recorded, cfg)
        assert (curve.seed, curve.params) == (replayed, point)
