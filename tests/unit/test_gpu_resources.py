"""Several trials per GPU (issue 12, item 3): what a trial asks Ray for, which runner trains
it, on which device, and how many trials run at once. No GPU needed: the requests are read
back from the objects Tune and Ray Train receive, and Ray's GPU assignment is simulated."""

from __future__ import annotations

import pytest
import torch

from raypeft.config.schema import ExperimentConfig
from raypeft.search import trial_runners
from raypeft.search.resources import (
    describe_placement,
    ray_train_scaling,
    trials_at_once,
    worker_request,
)

BASE = {
    "name": "gpu",
    "model": {"name": "tiny-bert", "max_length": 16},
    "method": {"name": "pt", "prompt_length": 4},
    "train": {"batch_size": 8},
}


def cfg(**resources) -> ExperimentConfig:
    return ExperimentConfig.model_validate({**BASE, "resources": resources})


@pytest.mark.parametrize(
    "resources,gpus,use_gpu",
    [
        # the default: the search resolves it (raypeft.search.gpu_plan); until then the CPU
        ({}, 0.0, "auto"),
        ({"use_gpu": False}, 0.0, False),
        ({"use_gpu": True}, 1.0, True),  # the shorthand
        ({"gpus_per_worker": 0.25}, 0.25, True),
        ({"gpus_per_worker": 0.25, "use_gpu": True}, 0.25, True),  # both: the amount wins
        ({"gpus_per_worker": 0, "use_gpu": True}, 1.0, True),  # 0 is "not given"
        ({"gpus_per_worker": 2}, 2.0, True),
    ],
)
def test_gpus_per_worker_and_the_use_gpu_shorthand(resources, gpus, use_gpu):
    config = cfg(**resources)
    assert config.resources.gpus == gpus
    # a trial validates the dumped config again (its workers receive it as JSON)
    again = ExperimentConfig.model_validate(config.model_dump(mode="json"))
    assert again.resources.gpus == gpus and again.resources.use_gpu == use_gpu


def _trainable_request(config: ExperimentConfig, monkeypatch):
    """The resource request of the trainable :func:`trainable_for` hands to Tune (without
    Ray running: ``with_parameters`` would put the data into Ray's object store)."""
    monkeypatch.setattr(trial_runners.tune, "with_parameters", lambda fn, **_: fn)
    trainable = trial_runners.trainable_for(config, data_ref=None)
    return trainable, trainable._resources.bundles


def test_an_in_process_trial_asks_tune_for_a_gpu_fraction(monkeypatch):
    config = cfg(gpus_per_worker=0.25, cpus_per_worker=0.5)
    assert not trial_runners.use_ray_train(config)  # a GPU no longer forces Ray Train
    trainable, bundles = _trainable_request(config, monkeypatch)
    assert trainable.__name__ == "trial_in_process"
    assert bundles == [{"CPU": 0.5, "GPU": 0.25}]


def test_a_cpu_trial_asks_for_no_gpu(monkeypatch):
    _, bundles = _trainable_request(cfg(cpus_per_worker=2), monkeypatch)
    assert bundles == [{"CPU": 2.0}]  # Tune drops the zero GPU amount


def test_a_ray_train_trial_asks_each_worker_for_its_gpus(monkeypatch):
    from ray.train import ScalingConfig

    config = cfg(trial_runner="ray_train", gpus_per_worker=0.5, cpus_per_worker=1)
    assert trial_runners.use_ray_train(config)
    trainable, bundles = _trainable_request(config, monkeypatch)
    assert trainable.__name__ == "trial_with_ray_train"
    assert bundles == [{"memory": 64 * 1024**2}]  # the driver: no CPU, no GPU
    scaling = ScalingConfig(**ray_train_scaling(config))
    assert scaling.use_gpu and scaling.num_gpus_per_worker == 0.5
    assert scaling.as_placement_group_factory().bundles == [{"CPU": 1.0, "GPU": 0.5}]
    ddp = ScalingConfig(**ray_train_scaling(cfg(workers_per_trial=2, use_gpu=True)))
    assert ddp.as_placement_group_factory().bundles == [{"CPU": 1.0, "GPU": 1.0}] * 2
    cpu = ray_train_scaling(cfg(workers_per_trial=2))
    assert cpu == {"num_workers": 2, "use_gpu": False, "resources_per_worker": {"CPU": 1.0}}


@pytest.mark.parametrize(
    "gpu_ids,visible,cuda,device",
    [
        ([], "", True, "cpu"),  # no GPU asked for
        (["0"], "0", False, "cpu"),  # GPUs declared to Ray for scheduling only
        (["2"], "2", True, "cuda:0"),  # Ray narrowed CUDA_VISIBLE_DEVICES to the GPU
        (["3"], "1,3", True, "cuda:1"),  # a position in CUDA_VISIBLE_DEVICES
        (["3"], "", True, "cuda:3"),  # RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES
    ],
)
def test_an_in_process_trial_trains_on_the_gpu_ray_assigned(
    monkeypatch, gpu_ids, visible, cuda, device
):
    monkeypatch.setattr(trial_runners.ray, "get_gpu_ids", lambda: gpu_ids)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert trial_runners.assigned_device() == torch.device(device)


@pytest.mark.parametrize(
    "resources,nodes,at_once",
    [
        ({"gpus_per_worker": 0.25, "cpus_per_worker": 0.5}, [{"CPU": 2, "GPU": 1}], 4),
        ({"gpus_per_worker": 0.25, "cpus_per_worker": 1}, [{"CPU": 2, "GPU": 1}], 2),  # CPUs
        ({"gpus_per_worker": 1 / 3}, [{"CPU": 8, "GPU": 2}], 6),  # Ray's 0.0001 rounding
        ({"use_gpu": True}, [{"CPU": 8, "GPU": 1}, {"CPU": 8, "GPU": 2}], 3),
        ({"workers_per_trial": 2, "use_gpu": True}, [{"CPU": 8, "GPU": 3}], 1),
        ({"cpus_per_worker": 2}, [{"CPU": 5}, {"CPU": 3}], 3),  # per node, not in sum
        ({"gpus_per_worker": 0.5}, [{"CPU": 8}], 0),
    ],
)
def test_trials_at_once(resources, nodes, at_once):
    assert trials_at_once(cfg(**resources), nodes) == at_once


def test_max_concurrent_caps_trials_at_once_and_the_plan_line_says_it():
    config = ExperimentConfig.model_validate(
        {**BASE, "resources": {"gpus_per_worker": 0.25}, "search": {"max_concurrent": 2}}
    )
    assert trials_at_once(config, [{"CPU": 16, "GPU": 1}]) == 2
    shared = cfg(gpus_per_worker=0.25, cpus_per_worker=0.5)
    assert (
        describe_placement(shared, 4)
        == "4 at a time (each 0.5 CPU and 0.25 GPU: 4 trials share a GPU)"
    )
    ddp = cfg(workers_per_trial=2, use_gpu=True)
    assert (
        describe_placement(ddp, 1, " here")
        == "1 at a time here (each 2 workers of 1 CPU and 1 GPU)"
    )
    assert worker_request(cfg()) == {"CPU": 1.0, "GPU": 0.0}
