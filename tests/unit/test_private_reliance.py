"""Pins of the private behaviours of Ray that raypeft still relies on (each with its reason):
an upgrade that moves one fails here, by name, before a search fails in a stranger way.
raypeft's own searcher uses Ray's and Optuna's public APIs only (``search/searcher.py``)."""

from __future__ import annotations

import ast
from pathlib import Path

RAYPEFT = Path(__file__).resolve().parents[2] / "raypeft"


def test_a_restored_tuner_takes_this_processes_callbacks():
    """Reason: Ray 2.60's Tuner.restore brings back the callbacks pickled at the search's
    start and takes no new ones; a resumed search sets its own tracker on the restored run
    config (search/tuner.py)."""
    from ray import tune

    tuner = tune.Tuner(lambda config: None, run_config=tune.RunConfig(callbacks=[]))
    run_config = tuner._local_tuner.get_run_config()
    assert isinstance(run_config, tune.RunConfig) and run_config.callbacks == []


def test_a_local_ray_can_be_started_on_loopback_only():
    """Reason: ray.init() has no public switch to bind a one-machine Ray to 127.0.0.1;
    search/ray_session.py lowers this flag while it starts one."""
    from ray._private import ray_constants

    assert isinstance(ray_constants.ENABLE_RAY_CLUSTER, bool)


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


def test_a_function_trainables_report_waits_for_tune():
    """Reason: a packed trial steps again only after tune.report returned, which Ray 2.60's
    train session makes wait until Tune asks for the next result (search/packs.py)."""
    from ray.train._internal.session import _TrainSession

    assert callable(_TrainSession._report_training_result)


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
