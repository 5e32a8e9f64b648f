"""Pins of the private behaviours of Ray that raypeft still relies on (each with its reason):
an upgrade that moves one fails here, by name, before a search fails in a stranger way.
raypeft's own searcher uses Ray's and Optuna's public APIs only (``search/searcher.py``)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

RAYPEFT = Path(__file__).resolve().parents[2] / "raypeft"


def test_a_restored_tuner_takes_this_processes_callbacks(tmp_path):
    """Reason: Ray 2.60's Tuner.restore brings back the callbacks pickled at the search's
    start and takes no new ones; a resumed search sets its own tracker on the restored run
    config (search/tuner.py)."""
    from ray import tune

    # a storage path of the test's own: a Tuner made its ~/ray_results/lambda_<time> folder
    results = str(tmp_path / "results")
    tuner = tune.Tuner(
        lambda config: None, run_config=tune.RunConfig(callbacks=[], storage_path=results)
    )
    run_config = tuner._local_tuner.get_run_config()
    assert isinstance(run_config, tune.RunConfig) and run_config.callbacks == []


def _node_address(script: str, env: dict) -> str:
    """The node address Ray resolves in a fresh Python process running ``script`` (no Ray
    started there: a started node's own address would be answered instead)."""
    child = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert child.returncode == 0, child.stderr[-2000:]
    return child.stdout.strip().splitlines()[-1]


@pytest.mark.slow
def test_with_the_cluster_flag_lowered_ray_takes_loopback_as_the_nodes_address():
    """Reason: ray.init() has no public switch to bind a one-machine Ray to 127.0.0.1;
    search/ray_session.py lowers Ray's private ENABLE_RAY_CLUSTER in its process (and sets
    its environment variable for the processes Ray starts) while it starts one, and Ray binds
    every server of a node to the node's address. Pinned by what Ray does with them: the
    address it resolves for a new node (what ray.init asks when it starts one) is loopback
    under raypeft's context, and in a Python process started with the variable. That every
    socket of the Ray that raypeft starts listens on loopback, measured with psutil:
    tests/unit/test_security.py::test_local_ray_listens_on_loopback_only."""
    from raypeft.search.ray_session import _SINGLE_MACHINE_RAY

    env = {k: v for k, v in os.environ.items() if k != _SINGLE_MACHINE_RAY}
    under_raypeft = (
        "from ray._private import services\n"
        "from raypeft.search.ray_session import _loopback_node\n"
        "with _loopback_node():\n"
        "    print(services.get_node_ip_address())\n"
    )
    assert _node_address(under_raypeft, env) == "127.0.0.1"
    started_by_ray = "from ray._private import services; print(services.get_node_ip_address())"
    assert _node_address(started_by_ray, {**env, _SINGLE_MACHINE_RAY: "0"}) == "127.0.0.1"


def test_the_token_auth_notice_comes_from_the_logger_raypeft_quiets():
    """Reason: Ray >= 2.59 logs, at every local start, that it turned token authentication
    on; search/run.py quiets that one logger by name, which is its module's name (a moved
    module brings the notice back into every search's output)."""
    import importlib
    import logging

    module = importlib.import_module("ray._private.authentication.authentication_token_setup")
    assert module.logger is logging.getLogger(
        "ray._private.authentication.authentication_token_setup"
    )
    assert module.logger.name.startswith("ray._private.authentication.")


def _note(log: Path, line: str) -> None:
    with log.open("a") as out:
        out.write(line + "\n")


def _trainable_noting_its_reports():
    """A function trainable that notes each report, its return, and a stop (SystemExit).
    Made here: Ray's workers cannot import a test module, and a closure travels by value."""

    def report_four_times(config: dict) -> None:
        from ray import tune

        log = Path(config["log_dir"]) / config["name"]

        def note(line: str) -> None:
            with log.open("a") as out:
                out.write(line + "\n")

        for i in range(4):
            note(f"report {i}")
            try:
                tune.report({"i": i})
            except SystemExit:
                note(f"stopped in report {i}")
                raise
            note(f"returned {i}")

    return report_four_times


def _judge(log_dir: Path):
    """Tune's scheduler hook, noting for each result whether its report had returned (it is
    given a second to), and stopping each trial at its result 1."""
    from ray.tune.schedulers import FIFOScheduler, TrialScheduler

    class Judge(FIFOScheduler):
        def on_trial_result(self, tune_controller, trial, result):
            log, i = log_dir / trial.config["name"], result["i"]
            deadline = time.monotonic() + 1.0
            while f"returned {i}" not in log.read_text() and time.monotonic() < deadline:
                time.sleep(0.05)
            returned = f"returned {i}" in log.read_text()
            _note(log, f"judged {i}" + (" after its report returned" if returned else ""))
            return TrialScheduler.STOP if i == 1 else TrialScheduler.CONTINUE

    return Judge()


@pytest.mark.slow
def test_a_function_trainables_report_returns_only_when_tune_goes_on(tmp_path, local_ray):
    """Reason: a packed trial steps again only after tune.report returned (search/packs.py):
    a function trainable's tune.report waits until Tune asks for the trial's next result,
    which Tune does after its scheduler let the trial go on, and raises SystemExit in a
    trial Tune stopped, here when Tune reuses its actor for the next trial (Ray 2.60's
    ``_TrainSession._report_training_result``). Pinned by behaviour in a real Tune run: the
    scheduler, judging each result, finds the trainable still inside that report; the trial
    stopped at its result 1 leaves that report by SystemExit, before the next trial starts."""
    from ray import tune

    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    tuner = tune.Tuner(
        _trainable_noting_its_reports(),
        param_space={"name": tune.grid_search(["a", "b"]), "log_dir": str(log_dir)},
        tune_config=tune.TuneConfig(
            scheduler=_judge(log_dir), max_concurrent_trials=1, reuse_actors=True
        ),
        run_config=tune.RunConfig(storage_path=str(tmp_path / "results"), verbose=0),
    )
    grid = tuner.fit()
    assert not grid.errors
    assert (log_dir / "a").read_text().splitlines() == [
        "report 0",
        "judged 0",
        "returned 0",
        "report 1",
        "judged 1",
        "stopped in report 1",
    ]
    assert (log_dir / "b").read_text().splitlines()[:5] == (log_dir / "a").read_text().splitlines()[
        :5
    ]


def test_the_searcher_and_study_modules_touch_no_private_attribute_of_ray_or_optuna():
    """search/searcher.py and search/study.py use both libraries' public APIs only: no
    attribute or module whose name starts with an underscore, except on their own objects."""
    for name in ("searcher.py", "study.py", "objectives.py"):
        tree = ast.parse((RAYPEFT / "search" / name).read_text())
        private = [
            f"{name}:{node.lineno} .{node.attr}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
        ]
        modules = [
            f"{name}:{node.lineno} {node.module}"
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
            and node.module
            and node.module != "__future__"
            and any(part.startswith("_") for part in node.module.split("."))
        ]
        assert private == [] and modules == []


def test_ray_up_resolves_an_aws_cluster_file_through_one_private_function():
    """Reason: tests/unit/test_aws_security_group.py runs what `ray up` runs on
    cluster/aws.yaml before launching anything, through Ray 2.60's _bootstrap_config (no
    public function resolves a cluster file), and empties the lru_caches in which Ray's AWS
    code keeps boto3 clients and subnet look-ups, so that no test reuses another's."""
    import inspect

    from ray.autoscaler._private import commands
    from ray.autoscaler._private.aws import config, utils
    from ray.autoscaler._private.aws.node_provider import AWSNodeProvider

    assert list(inspect.signature(commands._bootstrap_config).parameters) == [
        "config",
        "no_config_cache",
    ]
    assert "_bootstrap_config(config, no_config_cache=no_config_cache)" in inspect.getsource(
        commands.create_or_update_cluster
    )
    assert "bootstrap_aws(cluster_config)" in inspect.getsource(AWSNodeProvider.bootstrap_config)
    for cached in (utils.resource_cache, utils.client_cache, config._get_subnets_or_die):
        assert callable(cached.cache_clear)


def test_a_changed_head_node_config_means_a_new_head():
    """Reason: docs/cluster.md and cluster/aws.yaml warn that changing the head's node_config
    makes the next `ray up` launch a new head (whose disk lacks the old sqlite stores): Ray
    2.60's get_or_create_head_node hashes the head's node_config with `auth`
    (hash_launch_conf) and relaunches when the running head's tag differs."""
    import inspect

    from ray.autoscaler._private import commands
    from ray.autoscaler._private.util import hash_launch_conf
    from ray.autoscaler.tags import TAG_RAY_LAUNCH_CONFIG, TAG_RAY_USER_NODE_TYPE

    auth = {"ssh_user": "ubuntu"}
    running = {"InstanceType": "m5.2xlarge", "ImageId": "ami-1"}

    class Provider:
        @staticmethod
        def node_tags(node_id):
            return {
                TAG_RAY_LAUNCH_CONFIG: hash_launch_conf(running, auth),
                TAG_RAY_USER_NODE_TYPE: "ray.head.cpu",
            }

    def new_head(node_config):
        launch_hash = hash_launch_conf(node_config, auth)
        return commands._should_create_new_head("i-1", launch_hash, "ray.head.cpu", Provider())

    assert not new_head(dict(running))
    assert new_head(running | {"InstanceType": "m5.4xlarge"})
    source = inspect.getsource(commands.get_or_create_head_node)
    assert 'hash_launch_conf(head_node_config, config["auth"])' in source
    assert "provider.terminate_node(head_node)" in source
