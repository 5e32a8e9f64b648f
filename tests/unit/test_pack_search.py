"""Packed trials in the search language (``resources.trials_per_worker``), without Ray: what
each trial asks Ray for, how many run at once, and what `raypeft validate` refuses (one line
naming the key)."""

from __future__ import annotations

import pytest
import yaml
from click.testing import CliRunner

from raypeft.cli.main import main
from raypeft.config.schema import ExperimentConfig
from raypeft.methods.dept import DePTConfig
from raypeft.search import packs
from raypeft.search.resources import describe_placement, trial_request, trials_at_once

BASE = {
    "name": "packed",
    "model": {"name": "tiny-bert", "max_length": 16},
    "task": {"name": "tweet_sentiment", "max_train_examples": 32, "max_eval_examples": 16},
    "method": {"name": "dept", "budget_prompt_length": 10, "prompt_length": 4},
    "train": {"batch_size": 8, "max_steps": 4, "eval_every": 2},
    "space": {"method.lr_prompt": {"grid": [0.3, 0.5]}},
    "search": {"num_samples": 2, "sampler": "grid"},
}


def cfg(**resources) -> ExperimentConfig:
    return ExperimentConfig.model_validate({**BASE, "resources": resources})


def validate(tmp_path, **resources):
    path = tmp_path / "packed.yaml"
    path.write_text(yaml.safe_dump({**BASE, "resources": resources}))
    return path, CliRunner().invoke(main, ["validate", str(path)])


def test_a_packed_trial_asks_for_its_share_of_a_worker():
    one = cfg(cpus_per_worker=2)
    assert trial_request(one) == {"CPU": 2.0, "GPU": 0.0}  # unpacked: a worker's request
    four = cfg(cpus_per_worker=2, gpus_per_worker=1, trials_per_worker=4)
    assert trial_request(four) == {"CPU": 0.5, "GPU": 0.25}
    nodes = [{"CPU": 5.0, "GPU": 1.0}]
    # one worker of 2 CPUs and a GPU fits: one pack of four trials (a remainder holds none)
    assert trials_at_once(four, nodes) == 4
    assert trials_at_once(one, nodes) == 2
    assert describe_placement(four, 4) == (
        "4 at a time (packs of 4 trials on one backbone, each pack 2 CPU and 1 GPU)"
    )


def test_the_packed_trainable_asks_tune_for_the_share(monkeypatch):
    monkeypatch.setattr(packs.tune, "with_parameters", lambda fn, **_: fn)
    trainable = packs.packed_trainable(cfg(cpus_per_worker=2, trials_per_worker=2), None, None)
    assert [dict(b) for b in trainable._resources.bundles] == [{"CPU": 1.0}]


@pytest.mark.parametrize(
    "resources,says",
    [
        (
            {"trials_per_worker": 2, "workers_per_trial": 2},
            "resources.trials_per_worker: Value error, a pack is one process on one device, so "
            "`trials_per_worker == 1` must hold with workers_per_trial=2 (DDP trials do not "
            "pack), but got 2",
        ),
        (
            {"trials_per_worker": 2, "trial_runner": "ray_train"},
            "resources.trials_per_worker: Value error, packed trials train in their worker's "
            "process",
        ),
        (
            {"trials_per_worker": 2, "gpus_per_worker": 2},
            "resources.trials_per_worker: Value error, a pack trains on one device, so "
            "`gpus_per_worker <= 1` must hold",
        ),
    ],
)
def test_what_cannot_pack_is_one_line_naming_the_key(tmp_path, resources, says):
    path, result = validate(tmp_path, **resources)
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith(f"error: {path}: ") and says.replace("Value error, ", "") in line


def test_validate_names_a_method_that_cannot_pack(tmp_path, monkeypatch):
    why = "it hooks into the backbone's attention"
    monkeypatch.setattr(DePTConfig, "pack_limitation", lambda self, kind: why)
    path, result = validate(tmp_path, trials_per_worker=2)
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert "resources.trials_per_worker: method 'dept' cannot train in a pack on a encoder" in line
    assert why in line and "set trials_per_worker: 1" in line
    _, unpacked = validate(tmp_path, trials_per_worker=1)  # alone it runs
    assert unpacked.exit_code == 0, unpacked.output


def test_a_packable_search_validates(tmp_path):
    _, result = validate(tmp_path, trials_per_worker=2, cpus_per_worker=2)
    assert result.exit_code == 0, result.output
