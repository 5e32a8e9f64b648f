"""Bad input: what one trial asks of the machines that will run it.

Each case runs ``raypeft tune`` and then ``raypeft validate`` (conftest.py): exit code 2,
exactly one line ``error: ...`` naming the key or file and what must hold, the same line from
both, nothing created in the working directory, and Ray, MLflow and Optuna never reached.
"""

from __future__ import annotations

import pytest
import yaml
from click.testing import CliRunner

from raypeft.cli.main import main

from .helpers import CPUS, Case, exp, ids, run_in_process

CASES: list[Case] = [
    # ---- resources
    Case(
        "in-process-runner-with-two-workers",
        exp(resources={"trial_runner": "in_process", "workers_per_trial": 2}),
        ("resources.workers_per_trial", "`workers_per_trial == 1` must hold", "in_process"),
    ),
    Case(
        "gpu-on-a-machine-without-one",
        exp(resources={"use_gpu": True}),
        ("resources.use_gpu", "this machine has none", "must hold"),
        needs_no_gpu=True,
    ),
    Case(
        "gpu-fraction-on-a-machine-without-one",
        exp(resources={"gpus_per_worker": 0.25}),
        ("resources.gpus_per_worker", "0.25 needs a GPU", "this machine has none", "must hold"),
        needs_no_gpu=True,
    ),
    Case(
        "gpu-amount-ray-cannot-place",
        exp(resources={"gpus_per_worker": 1.5}),
        ("resources.gpus_per_worker", "`0 < gpus_per_worker <= 1`", "whole number", "1.5"),
    ),
    Case(
        "use-gpu-false-beside-a-gpu-fraction",
        exp(resources={"gpus_per_worker": 0.5, "use_gpu": False}),
        ("resources.use_gpu", "contradicts gpus_per_worker=0.5"),
    ),
    Case(
        "gpu-fraction-for-ddp-workers",
        exp(train__batch_size=8, resources={"workers_per_trial": 2, "gpus_per_worker": 0.5}),
        ("resources.gpus_per_worker", "`gpus_per_worker >= 1` must hold", "workers_per_trial=2"),
    ),
    Case(
        "fp16-with-auto-on-a-machine-without-a-gpu",  # the schema cannot know: auto may find one
        exp(train__precision="fp16"),
        ("train.precision", "fp16 needs a GPU", "use_gpu: auto found none on this machine"),
        needs_no_gpu=True,
    ),
    Case(
        "address-that-is-not-one",
        exp(),
        ("--address 'not an address'", "not a Ray cluster's address", "must be", "host:port"),
        args=("--address", "not an address"),
        in_process=True,
    ),
    Case(
        "worker-needs-more-cpus-than-the-machine",
        exp(resources={"cpus_per_worker": CPUS + 1}),
        ("resources.cpus_per_worker", f"`cpus_per_worker <= {CPUS}` must hold"),
        in_process=True,
    ),
    Case(
        "trial-needs-more-cpus-than-the-machine",
        exp(
            train__batch_size=4 * (CPUS + 1),
            resources={"workers_per_trial": CPUS + 1, "cpus_per_worker": 1},
        ),
        ("resources.workers_per_trial", f"<= {CPUS}` must hold", f"{CPUS + 1} × 1"),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_bad_input_is_one_line_exit_2_and_touches_nothing(case, run_case):
    run_case(case)


IN_PROCESS = [c for c in CASES if c.in_process]


@pytest.mark.parametrize("case", IN_PROCESS, ids=ids(IN_PROCESS))
@pytest.mark.slow
def test_bad_input_in_a_real_process(case, tmp_path):
    run_in_process(case, tmp_path)


def test_validate_checks_resources_only_for_a_local_tune(tmp_path, monkeypatch, guarded):
    """`validate --address` (a cluster file on a laptop) does not hold it to this machine."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(exp(resources={"cpus_per_worker": CPUS + 1})))
    runner = CliRunner()
    local = runner.invoke(main, ["validate", "exp.yaml"])
    assert local.exit_code == 2 and "resources.cpus_per_worker" in local.stderr
    remote = runner.invoke(main, ["validate", "exp.yaml", "--address", "ray://head:10001"])
    assert remote.exit_code == 0, remote.output
    assert "resources not checked" in remote.stdout


# ----------------------------------------------------------------------------- check_fits


def _cfg(**resources):
    from raypeft.config.schema import ExperimentConfig

    return ExperimentConfig.model_validate(exp(resources=resources, train__batch_size=12))


@pytest.mark.parametrize(
    "resources,nodes,expect",
    [
        ({"use_gpu": True}, [{"CPU": 8, "GPU": 0}], "resources.use_gpu"),
        ({"cpus_per_worker": 4}, [{"CPU": 2}, {"CPU": 3}], "`cpus_per_worker <= 3` must hold"),
        # 3 workers of 2 CPUs: 5 CPUs in all would not do, and 2 + 3 CPU nodes hold only 2
        (
            {"workers_per_trial": 3, "cpus_per_worker": 2},
            [{"CPU": 3}, {"CPU": 3}],
            "each worker on one node",
        ),
        (
            {"workers_per_trial": 2, "use_gpu": True},
            [{"CPU": 8, "GPU": 1}],
            "`workers_per_trial <= 1` must hold",
        ),
        (
            {"workers_per_trial": 2, "use_gpu": True},
            [{"CPU": 8, "GPU": 0}, {"CPU": 0.5, "GPU": 2}],
            "no node of the cluster has both",
        ),
        # fractional and multi-GPU workers: the GPUs of each node are named
        (
            {"gpus_per_worker": 0.25},
            [{"CPU": 8, "GPU": 0}, {"CPU": 4}],
            "resources.gpus_per_worker: 0.25 needs a GPU per worker, but the "
            "cluster has none (2 nodes with no GPU); `gpus_per_worker: 0` must hold here",
        ),
        (
            {"gpus_per_worker": 2},
            [{"CPU": 8, "GPU": 1}, {"CPU": 8, "GPU": 1}, {"CPU": 8}],
            "`gpus_per_worker <= 1` must hold (the most GPUs of a node of the cluster: 2 nodes "
            "with 1 GPU, 1 node with no GPU), but got 2",
        ),
        (
            {"workers_per_trial": 3, "gpus_per_worker": 1},
            [{"CPU": 8, "GPU": 1}, {"CPU": 8, "GPU": 1}],
            "each worker takes 1 GPU, so `workers_per_trial <= 2` must hold",
        ),
        (
            {"gpus_per_worker": 0.5, "cpus_per_worker": 4},
            [{"CPU": 8, "GPU": 0}, {"CPU": 2, "GPU": 1}],
            "needs 4 CPUs and 0.5 GPU on one node, but no node of the cluster has both",
        ),
    ],
)
def test_check_fits_rejects(resources, nodes, expect):
    from raypeft.errors import ConfigError
    from raypeft.search.resources import check_fits

    with pytest.raises(ConfigError) as info:
        check_fits(_cfg(**resources), nodes, where="the cluster")
    assert expect in str(info.value) and "\n" not in str(info.value)


def test_check_fits_on_a_cluster_says_joining_nodes_are_not_counted():
    """Right after an on-premise `ray up`, the workers are still being set up."""
    from raypeft.errors import ConfigError
    from raypeft.search.resources import check_fits

    with pytest.raises(ConfigError) as info:
        check_fits(_cfg(), [{"CPU": 0.0}], where="the cluster at auto")
    assert str(info.value).endswith("not counted (see `ray status`)"), str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "resources,nodes",
    [
        ({}, [{"CPU": 1}]),
        ({"workers_per_trial": 4, "cpus_per_worker": 2}, [{"CPU": 4}, {"CPU": 4}]),
        ({"workers_per_trial": 2, "use_gpu": True}, [{"CPU": 2, "GPU": 1}, {"CPU": 2, "GPU": 1}]),
        ({"cpus_per_worker": 0.5, "workers_per_trial": 3}, [{"CPU": 1.5}]),
        ({"gpus_per_worker": 0.25}, [{"CPU": 1, "GPU": 1}]),
        ({"gpus_per_worker": 2, "workers_per_trial": 2}, [{"CPU": 2, "GPU": 2}] * 2),
    ],
)
def test_check_fits_accepts(resources, nodes):
    from raypeft.search.resources import check_fits

    check_fits(_cfg(**resources), nodes)


def test_local_nodes_describe_this_machine():
    from raypeft.search.resources import local_nodes

    (node,) = local_nodes()
    assert node["CPU"] == CPUS and node["GPU"] >= 0


def test_cluster_nodes_count_what_the_autoscaler_can_launch(tmp_path, monkeypatch):
    """On a `ray up` head, GPU workers may not exist yet: the launcher file's node types
    (~/ray_bootstrap_config.yaml) count as nodes the cluster can provide."""
    import ray

    from raypeft.search.resources import check_fits, cluster_nodes

    head = {"NodeID": "h", "Alive": True, "Resources": {"CPU": 0.0, "memory": 1e9}}
    gone = {"NodeID": "x", "Alive": False, "Resources": {"CPU": 64.0, "GPU": 8.0}}
    monkeypatch.setattr(ray, "nodes", lambda: [head, gone])
    missing = tmp_path / "none.yaml"
    assert cluster_nodes(str(missing)) == [{"CPU": 0.0, "memory": 1e9}]
    with pytest.raises(Exception, match="resources.use_gpu"):
        check_fits(_cfg(use_gpu=True), cluster_nodes(str(missing)), where="the cluster")

    launcher = tmp_path / "ray_bootstrap_config.yaml"
    launcher.write_text(
        yaml.safe_dump(
            {
                "available_node_types": {
                    "head": {"resources": {"CPU": 0, "GPU": 0}, "max_workers": 0},
                    "gpu_1x": {"resources": {"CPU": 4, "GPU": 1}, "max_workers": 2},
                }
            }
        )
    )
    nodes = cluster_nodes(str(launcher))
    assert nodes.count({"CPU": 4.0, "GPU": 1.0}) == 2
    check_fits(_cfg(use_gpu=True, workers_per_trial=2), nodes, where="the cluster")
    with pytest.raises(Exception, match="workers_per_trial"):
        check_fits(_cfg(use_gpu=True, workers_per_trial=3), nodes, where="the cluster")


def test_validate_says_how_many_trials_run_at_once(tmp_path, monkeypatch, guarded):
    """The plan line: trials at once on this machine, from each trial's request."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(exp(resources={"cpus_per_worker": 0.5})))
    result = CliRunner().invoke(main, ["validate", "exp.yaml"])
    assert result.exit_code == 0, result.output
    assert f"; {2 * CPUS} at a time here (each 0.5 CPU))" in result.stdout
