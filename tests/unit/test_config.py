"""Experiment files: loading, overrides, one-line errors naming the file and key."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import yaml

from raypeft.config.loading import load_experiment
from raypeft.config.schema import ExperimentConfig, apply_trial_params
from raypeft.config.space import ChoiceParam, GridParam, IntParam, LogUniformParam, UniformParam
from raypeft.errors import ConfigError
from raypeft.methods.dept import DePTConfig
from raypeft.methods.prompt_tuning import PromptTuningConfig

REPO = Path(__file__).resolve().parents[2]
SEARCH_SPACES = REPO / "search_spaces"

BASE = {
    "model": {"name": "tiny-bert", "max_length": 16},
    "method": {"name": "dept", "prompt_length": 4, "budget_prompt_length": 10},
    "train": {"max_steps": 20, "eval_every": 10},
}


def write(tmp_path: Path, data: dict | str, name: str = "exp.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def config_error(path: Path, overrides: list[str] = ()) -> str:
    with pytest.raises(ConfigError) as info:
        load_experiment(path, overrides)
    msg = str(info.value)
    assert "\n" not in msg, msg
    return msg


def with_(base: dict, **sections) -> dict:
    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base.items()}
    for key, value in sections.items():
        data[key] = value
    return data


# ----------------------------------------------------------------------------- loading


def test_loads_file_and_defaults_name_to_stem(tmp_path):
    path = write(tmp_path, BASE, "my_search.yaml")
    cfg = load_experiment(path)
    assert cfg.name == "my_search"
    assert cfg.model.name == "tiny-bert" and cfg.model.max_length == 16
    assert isinstance(cfg.method, DePTConfig)
    assert (cfg.method.prompt_length, cfg.method.budget_prompt_length, cfg.method.rank) == (
        4,
        10,
        None,
    )
    assert cfg.train.max_steps == 20 and cfg.train.eval_every == 10
    assert cfg.train.head_lr == 1e-3  # untouched defaults
    assert cfg.space == {}


def test_explicit_name_and_pt_method(tmp_path):
    path = write(
        tmp_path, with_(BASE, name="pt-run", method={"name": "pt", "prompt_length": 7, "lr": 0.1})
    )
    cfg = load_experiment(path)
    assert cfg.name == "pt-run"
    assert isinstance(cfg.method, PromptTuningConfig)
    assert cfg.method.learning_rates() == {"prompt": 0.1}


@pytest.mark.parametrize(
    "data,key",
    [
        (with_(BASE, bogus=1), "bogus"),
        (with_(BASE, model={"name": "tiny-bert", "max_lenght": 16}), "model.max_lenght"),
        (
            with_(BASE, method={"name": "pt", "prompt_length": 5, "lr_prompt": 0.1}),
            "method.lr_prompt",
        ),
        (with_(BASE, search={"scheduler": {"type": "asha", "grace": 3}}), "search.scheduler.grace"),
    ],
)
def test_unknown_key_names_key_and_file(tmp_path, data, key):
    path = write(tmp_path, data, "typo.yaml")
    msg = config_error(path)
    assert msg.startswith(f"{path}: {key}: ")
    assert "unknown key" in msg


def test_unknown_method(tmp_path):
    path = write(tmp_path, with_(BASE, method={"name": "lora"}))
    msg = config_error(path)
    assert msg.startswith(f"{path}: method: ")
    assert "unknown method" in msg and "'dept'" in msg and "'pt'" in msg


def test_missing_method(tmp_path):
    data = {k: v for k, v in BASE.items() if k != "method"}
    msg = config_error(write(tmp_path, data))
    assert ": method: " in msg and "required" in msg.lower()


@pytest.mark.parametrize(
    "section,value,key,got",
    [
        ("train", {"max_steps": "many"}, "train.max_steps", "'many'"),
        ("train", {"max_steps": 20, "eval_every": 10, "head_lr": -1}, "train.head_lr", "-1"),
        ("model", {"name": "tiny-bert", "max_length": "long"}, "model.max_length", "'long'"),
        ("search", {"sampler": "bayes"}, "search.sampler", "'bayes'"),
        ("resources", {"use_gpu": "maybe"}, "resources.use_gpu", "'maybe'"),
    ],
)
def test_wrong_types(tmp_path, section, value, key, got):
    path = write(tmp_path, with_(BASE, **{section: value}), "types.yaml")
    msg = config_error(path)
    assert msg.startswith(f"{path}: {key}: ")
    assert f"(got {got})" in msg


def test_wrong_type_inside_method(tmp_path):
    path = write(tmp_path, with_(BASE, method={"name": "dept", "prompt_length": "x", "rank": 2}))
    msg = config_error(path)
    assert msg.startswith(f"{path}: method.prompt_length: ")
    assert "dept" not in msg.split(":")[1]  # the union tag is not part of the key path


def test_file_errors(tmp_path):
    missing = tmp_path / "nope.yaml"
    assert config_error(missing) == f"{missing}: file not found"
    bad = write(tmp_path, "model: [unclosed\n", "bad.yaml")
    assert config_error(bad).startswith(f"{bad}: not valid YAML")
    listing = write(tmp_path, "- a\n- b\n", "list.yaml")
    assert "top level must be a mapping" in config_error(listing)


def test_eval_every_above_max_steps(tmp_path):
    path = write(tmp_path, with_(BASE, train={"max_steps": 5, "eval_every": 10}))
    msg = config_error(path)
    assert str(path) in msg
    assert (
        "train: `eval_every <= max_steps` must hold" in msg
        and "eval_every=10" in msg
        and "max_steps=5" in msg
    )


def test_dept_rank_and_budget_both_set(tmp_path, tiny_model_cfg):
    # Both knobs may be written (a saved checkpoint records the derived rank next to its
    # budget), so the file alone cannot tell; a rank that contradicts the budget is rejected
    # once the backbone's d and s are known (the CLI resolves every trial before Ray starts).
    from raypeft.modeling.backbones import backbone_dims, load_config

    dims = backbone_dims(load_config(tiny_model_cfg, 2, "classification"), 16)
    method = {"name": "dept", "prompt_length": 4, "rank": 3, "budget_prompt_length": 10}
    cfg = load_experiment(write(tmp_path, with_(BASE, method=method)))
    with pytest.raises(ValueError) as info:
        cfg.method.resolve(dims)
    msg = str(info.value)
    assert "\n" not in msg
    assert "rank=3" in msg and "l=10" in msg and "r=4" in msg
    # the derived rank itself (d=32, s=16: (10-4)·32 // 48 = 4) is consistent
    method["rank"] = 4
    cfg = load_experiment(write(tmp_path, with_(BASE, method=method)))
    assert cfg.method.resolve(dims).rank == 4


def test_dept_neither_rank_nor_budget(tmp_path):
    path = write(tmp_path, with_(BASE, method={"name": "dept", "prompt_length": 4}))
    msg = config_error(path)
    assert msg.startswith(f"{path}: method: ")
    assert "`rank`" in msg and "`budget_prompt_length`" in msg


def test_dept_prompt_not_below_budget(tmp_path):
    path = write(
        tmp_path,
        with_(BASE, method={"name": "dept", "prompt_length": 10, "budget_prompt_length": 10}),
    )
    msg = config_error(path)
    assert msg.startswith(f"{path}: method: ") and "prompt_length < budget_prompt_length" in msg


# ----------------------------------------------------------------------------- overrides


def test_set_overrides_nested_and_typed(tmp_path):
    path = write(tmp_path, BASE)
    cfg = load_experiment(
        path,
        [
            "train.max_steps=50",
            "train.adam_betas=[0.8, 0.9]",
            "search.scheduler.type=none",
            "search.scheduler.reduction_factor=3",
            "method.lr_prompt=0.5",
            "tracking.uri=sqlite:///x.db",
            "resources.use_gpu=true",
            "task.max_train_examples=null",
        ],
    )
    assert cfg.train.max_steps == 50 and cfg.train.eval_every == 10
    assert cfg.train.adam_betas == (0.8, 0.9)
    assert cfg.search.scheduler.type == "none" and cfg.search.scheduler.reduction_factor == 3
    assert cfg.method.lr_prompt == 0.5
    assert cfg.tracking.uri == "sqlite:///x.db"  # the value after the first '=' kept whole
    assert cfg.resources.use_gpu is True
    assert cfg.task.max_train_examples is None


def test_set_creates_missing_sections_and_switches_method(tmp_path):
    path = write(tmp_path, {"method": {"name": "pt"}})
    cfg = load_experiment(path, ["method.prompt_length=12", "model.name=tiny-bert", "name=renamed"])
    assert (
        cfg.method.prompt_length == 12 and cfg.model.name == "tiny-bert" and cfg.name == "renamed"
    )
    cfg = load_experiment(path, ["method={name: dept, prompt_length: 3, rank: 2}"])
    assert isinstance(cfg.method, DePTConfig) and cfg.method.rank == 2


def test_set_override_errors_still_name_the_file(tmp_path):
    path = write(tmp_path, BASE, "base.yaml")
    msg = config_error(path, ["train.max_steps=abc"])
    assert msg.startswith(f"{path}: train.max_steps: ") and "(got 'abc')" in msg
    msg = config_error(path, ["train.bogus=1"])
    assert msg.startswith(f"{path}: train.bogus: unknown key")
    msg = config_error(path, ["train.eval_every=21"])
    assert str(path) in msg and "eval_every=21" in msg


@pytest.mark.parametrize("bad", ["no_equals_sign", "=3"])
def test_malformed_set(tmp_path, bad):
    msg = config_error(write(tmp_path, BASE), [bad])
    assert "--set" in msg and repr(bad) in msg


def test_set_inside_a_scalar_is_rejected(tmp_path):
    msg = config_error(write(tmp_path, BASE), ["train.max_steps.inner=1"])
    assert "max_steps" in msg and "not a section" in msg


def test_set_space_entries_keep_dotted_keys(tmp_path):
    path = write(tmp_path, BASE)
    cfg = load_experiment(
        path,
        [
            "space.method.lr_prompt={loguniform: [0.01, 0.5]}",
            "space.method.prompt_length={grid: [2, 4, 6]}",
            "space.train.batch_size={choice: [8, 16]}",
            "space.method.lr_lowrank={uniform: [0.0001, 0.001]}",
            "space.train.max_steps={int: [10, 40], step: 10}",
        ],
    )
    assert list(cfg.space) == [
        "method.lr_prompt",
        "method.prompt_length",
        "train.batch_size",
        "method.lr_lowrank",
        "train.max_steps",
    ]
    assert isinstance(cfg.space["method.lr_prompt"], LogUniformParam)
    assert cfg.space["method.lr_prompt"].loguniform == (0.01, 0.5)
    assert isinstance(cfg.space["method.prompt_length"], GridParam)
    assert isinstance(cfg.space["train.batch_size"], ChoiceParam)
    assert isinstance(cfg.space["method.lr_lowrank"], UniformParam)
    assert isinstance(cfg.space["train.max_steps"], IntParam)
    assert cfg.space["train.max_steps"].int == (10, 40) and cfg.space["train.max_steps"].step == 10


def test_set_space_entry_replaces_file_entry(tmp_path):
    data = with_(BASE, space={"method.lr_prompt": {"grid": [0.1, 0.2]}})
    cfg = load_experiment(write(tmp_path, data), ["space.method.lr_prompt={choice: [0.3]}"])
    assert isinstance(cfg.space["method.lr_prompt"], ChoiceParam)
    assert cfg.space["method.lr_prompt"].choice == [0.3]


# ----------------------------------------------------------------------------- search space


def test_space_entry_with_two_kinds(tmp_path):
    data = with_(BASE, space={"method.lr_prompt": {"grid": [0.1], "choice": [0.2]}})
    path = write(tmp_path, data, "space.yaml")
    msg = config_error(path)
    assert msg.startswith(f"{path}: space: ")
    assert "`method.lr_prompt` must have exactly one of" in msg and "['choice', 'grid']" in msg


def test_space_entry_with_no_kind(tmp_path):
    path = write(tmp_path, with_(BASE, space={"method.lr_prompt": [0.1, 0.2]}))
    msg = config_error(path)
    assert "`method.lr_prompt` must have exactly one of" in msg


def test_space_entry_unknown_inner_key(tmp_path):
    path = write(tmp_path, with_(BASE, space={"method.lr_prompt": {"grid": [0.1], "weights": [1]}}))
    msg = config_error(path)
    assert msg.startswith(f"{path}: space.method.lr_prompt.") and "unknown key" in msg


@pytest.mark.parametrize("key", ["method.lr", "method.nope", "train.learning_rate", "optimizer.lr"])
def test_space_key_unknown_field(tmp_path, key):
    # method.lr is PT's knob: with DePT it is not a field
    path = write(tmp_path, with_(BASE, space={key: {"choice": [0.1, 0.2]}}), "unk.yaml")
    msg = config_error(path)
    assert msg.startswith(f"{path}: space.{key}: unknown key")


@pytest.mark.parametrize(
    "key",
    ["search.seed", "tracking.uri", "name", "model.max_length", "task.max_train_examples"],
)
def test_space_key_not_searchable(tmp_path, key):
    # model and task keys would not reach the data: it is tokenised once per experiment
    path = write(tmp_path, with_(BASE, space={key: {"choice": [16, 32]}}))
    msg = config_error(path)
    assert msg.startswith(f"{path}: space.{key}: ") and "only method, methods.<name>" in msg


def test_space_value_makes_dept_impossible(tmp_path):
    data = with_(BASE, space={"method.prompt_length": {"grid": [4, 8, 12]}})
    path = write(tmp_path, data, "dept.yaml")
    msg = config_error(path)
    assert msg.startswith(f"{path}: method: ")
    assert "prompt_length < budget_prompt_length" in msg
    assert msg.endswith("[from space.method.prompt_length=12]")


def test_space_value_invalid_for_field(tmp_path):
    data = with_(BASE, space={"train.max_steps": {"int": [5, 100]}})
    msg = config_error(write(tmp_path, data))
    assert "train: `eval_every <= max_steps`" in msg and "[from space.train.max_steps=5]" in msg
    data = with_(BASE, space={"method.lr_lowrank": {"uniform": [-1.0, 0.1]}})
    msg = config_error(write(tmp_path, data))
    assert "method.lr_lowrank" in msg and "[from space.method.lr_lowrank=-1.0]" in msg


def test_loguniform_low_must_be_positive(tmp_path):
    msg = config_error(
        write(tmp_path, with_(BASE, space={"method.lr_prompt": {"loguniform": [0, 1]}}))
    )
    assert "space.method.lr_prompt" in msg and "0 < low" in msg


def test_space_may_search_unset_dept_rank(tmp_path):
    # `rank` defaults to None; it is still a searchable DePT field (with a rank, not a budget)
    method = {"name": "dept", "prompt_length": 4, "rank": 2}
    cfg = load_experiment(
        write(tmp_path, with_(BASE, method=method, space={"method.rank": {"grid": [1, 2, 4]}}))
    )
    assert cfg.grid_points() == [{"method.rank": r} for r in (1, 2, 4)]


def test_grid_points_every_combination_in_file_order(tmp_path):
    space = {
        "method.prompt_length": {"grid": [2, 4, 6]},
        "method.lr_prompt": {"loguniform": [0.01, 0.5]},
        "method.lr_lowrank": {"grid": [1e-4, 1e-3]},
        "train.batch_size": {"choice": [4, 8]},
        "train.seed": {"grid": [0, 1]},
    }
    cfg = load_experiment(write(tmp_path, with_(BASE, space=space)))
    assert cfg.grid_keys() == ["method.prompt_length", "method.lr_lowrank", "train.seed"]
    points = cfg.grid_points()
    assert len(points) == 3 * 2 * 2
    expected = [
        {"method.prompt_length": m, "method.lr_lowrank": a, "train.seed": s}
        for m, a, s in itertools.product([2, 4, 6], [1e-4, 1e-3], [0, 1])
    ]
    assert points == expected


def test_grid_points_without_grid_is_empty(tmp_path):
    # no grid key: nothing to enqueue (Optuna samples every trial)
    cfg = load_experiment(
        write(tmp_path, with_(BASE, space={"train.batch_size": {"choice": [4, 8]}}))
    )
    assert cfg.grid_keys() == [] and cfg.grid_points() == []


def test_apply_trial_params(tmp_path):
    space = {
        "method.prompt_length": {"grid": [2, 4]},
        "method.lr_prompt": {"loguniform": [0.01, 0.5]},
    }
    cfg = load_experiment(write(tmp_path, with_(BASE, space=space)))
    trial = apply_trial_params(
        cfg, {"method.prompt_length": 2, "method.lr_prompt": 0.05, "train.batch_size": 4}
    )
    assert isinstance(trial, ExperimentConfig) and isinstance(trial.method, DePTConfig)
    assert trial.method.prompt_length == 2 and trial.method.lr_prompt == 0.05
    assert trial.method.budget_prompt_length == 10 and trial.method.rank is None
    assert trial.train.batch_size == 4
    assert trial.space == cfg.space and trial.name == cfg.name and trial.model == cfg.model
    # the file's config is not modified
    assert cfg.method.prompt_length == 4 and cfg.train.batch_size == 16
    # nested keys create levels in the dumped config
    trial = apply_trial_params(cfg, {"search.scheduler.grace_period": 5})
    assert trial.search.scheduler.grace_period == 5


def test_apply_trial_params_validates(tmp_path):
    cfg = load_experiment(write(tmp_path, BASE))
    with pytest.raises(Exception, match="prompt_length < budget_prompt_length"):
        apply_trial_params(cfg, {"method.prompt_length": 10})


# ----------------------------------------------------------------------------- shipped files


def _shipped_yaml_files() -> list[Path]:
    return sorted(SEARCH_SPACES.glob("**/*.yaml"))


def _trial_variants(cfg: ExperimentConfig) -> list[dict]:
    """Every grid point, and each non-grid candidate (choices, range ends) on the first point."""

    points = cfg.grid_points() or [{}]  # a space without grid keys: the file's own values
    variants = list(points)
    for key, param in cfg.space.items():
        if not isinstance(param, GridParam):
            variants += [dict(points[0], **{key: v}) for v in param.candidates()]
    return variants


_DIMS: dict = {}


def _dims(model):
    from raypeft.modeling.backbones import backbone_dims, load_config

    key = (model.name, model.revision, model.max_length)
    if key not in _DIMS:
        _DIMS[key] = backbone_dims(load_config(model, 2, "classification"), model.max_length)
    return _DIMS[key]


@pytest.mark.parametrize(
    "path",
    _shipped_yaml_files() or [None],
    ids=lambda p: str(p.relative_to(SEARCH_SPACES)) if p else "none",
)
def test_shipped_search_space_validates(path):
    from raypeft.data.tasks import resolve_task_spec

    assert path is not None, f"no shipped search spaces: {SEARCH_SPACES} has no **/*.yaml files"
    cfg = load_experiment(path)  # raises a ConfigError naming the file
    resolve_task_spec(cfg.task)  # a registered task (or a complete files mapping)
    if not isinstance(cfg.method, DePTConfig) or cfg.model.name not in ("minilm", "tiny-bert"):
        return
    for params in _trial_variants(cfg):
        trial = apply_trial_params(cfg, params)
        dims = _dims(trial.model)
        resolved = trial.method.resolve(dims)  # ValueError when the budget leaves r < 1
        assert resolved.rank >= 1, (path.name, params)
        if trial.method.budget_prompt_length is not None:
            slack = trial.method.budget_prompt_length * dims.hidden_size - resolved.num_params(dims)
            # within budget, and the floored rank is the largest that fits
            assert 0 <= slack < dims.max_length + dims.hidden_size, (path.name, params, slack)
