"""Does one trial's resource request fit the machines that will run it?

A trial asks for ``resources.workers_per_trial`` workers of ``resources.cpus_per_worker`` CPUs
(and one GPU each with ``resources.use_gpu``). Ray places each worker on one node, so every
worker must fit a single node, and together they must fit the cluster (workers of a Ray Train
trial may spread over nodes). A request that can never be placed would leave Ray waiting
forever; :func:`check_fits` rejects it before anything starts.

Pure functions: ``nodes`` describe machines as Ray resource mappings (``{"CPU": 16, "GPU": 2}``),
either this machine (:func:`local_nodes`, what ``raypeft tune`` starts without ``--address``)
or a cluster's alive nodes (``ray.nodes()`` resources).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import yaml

from raypeft.errors import ConfigError

# Ray rounds resource requests to 1/10000 of a unit
_EPS = 1e-4


def local_nodes() -> list[dict[str, float]]:
    """This machine as one node: the CPUs a local Ray gets (``os.cpu_count()``, as
    ``raypeft tune`` starts it) and its CUDA GPUs (torch imported only here)."""
    cpus = float(os.cpu_count() or 1)
    try:
        import torch  # why: inside the try: a missing or broken torch means no usable GPU

        gpus = float(torch.cuda.device_count()) if torch.cuda.is_available() else 0.0
    except Exception:  # no torch, or a broken CUDA set-up: no usable GPU
        gpus = 0.0
    return [{"CPU": cpus, "GPU": gpus}]


def worker_request(cfg: Any) -> dict[str, float]:
    """What one worker of a trial asks Ray for."""
    res = cfg.resources
    return {"CPU": float(res.cpus_per_worker), "GPU": 1.0 if res.use_gpu else 0.0}


def _workers_on(node: dict[str, float], request: dict[str, float]) -> int:
    """How many workers of ``request`` one node can hold at once."""
    fits = math.inf
    for name, amount in request.items():
        if amount > 0:
            fits = min(fits, math.floor(node.get(name, 0.0) / amount + _EPS))
    return 0 if fits is math.inf else int(fits)


def check_fits(cfg: Any, nodes: list[dict[str, float]], where: str = "this machine") -> None:
    """Raise :class:`ConfigError` (one line, naming the key and the rule) when one trial of
    ``cfg`` cannot be placed on ``nodes``; ``where`` names them in the message."""
    res = cfg.resources
    request = worker_request(cfg)
    workers = res.workers_per_trial
    total_cpu = sum(n.get("CPU", 0.0) for n in nodes)
    total_gpu = sum(n.get("GPU", 0.0) for n in nodes)
    largest_cpu = max((n.get("CPU", 0.0) for n in nodes), default=0.0)
    hint = "" if where != "this machine" else " (a cluster: pass --address)"
    if res.use_gpu and total_gpu < 1:
        raise ConfigError(
            f"resources.use_gpu: true needs a GPU per worker, but {where} has none; "
            f"`use_gpu: false` must hold here{hint}"
        )
    if request["CPU"] > largest_cpu + _EPS:
        raise ConfigError(
            f"resources.cpus_per_worker: each worker runs on one node, so `cpus_per_worker <= "
            f"{_num(largest_cpu)}` must hold (the most CPUs of a node of {where}), but got "
            f"cpus_per_worker={_num(request['CPU'])}{hint}"
        )
    if res.use_gpu and not any(_workers_on(n, request) for n in nodes):
        raise ConfigError(
            f"resources.cpus_per_worker: a worker needs {_num(request['CPU'])} CPUs and a GPU "
            f"on one node, but no node of {where} has both{hint}"
        )
    if res.use_gpu and workers > total_gpu + _EPS:
        raise ConfigError(
            f"resources.workers_per_trial: each worker takes a GPU, so `workers_per_trial <= "
            f"{_num(total_gpu)}` must hold (the GPUs of {where}), but got "
            f"workers_per_trial={workers}{hint}"
        )
    if workers * request["CPU"] > total_cpu + _EPS:
        raise ConfigError(
            f"resources.workers_per_trial: `workers_per_trial × cpus_per_worker <= "
            f"{_num(total_cpu)}` must hold (the CPUs of {where}), but got {workers} × "
            f"{_num(request['CPU'])} = {_num(workers * request['CPU'])}{hint}"
        )
    if sum(_workers_on(n, request) for n in nodes) < workers:
        raise ConfigError(
            f"resources.workers_per_trial: {workers} workers of {_num(request['CPU'])} CPUs"
            + (" and a GPU" if res.use_gpu else "")
            + f" each must fit on the nodes of {where} (each worker on one node), but at most "
            f"{sum(_workers_on(n, request) for n in nodes)} do{hint}"
        )


def _num(value: float) -> str:
    return f"{value:g}"


# Written by `ray up` on the head node: the node types the autoscaler may still launch.
BOOTSTRAP_CONFIG = "~/ray_bootstrap_config.yaml"


def cluster_nodes(bootstrap_config: str = BOOTSTRAP_CONFIG) -> list[dict[str, float]]:
    """The connected cluster's alive nodes, plus the nodes its autoscaler can still launch.

    An autoscaling cluster (``ray up cluster/aws.yaml``) may have no GPU worker yet; the node
    types of its launcher file (each up to its ``max_workers``) count as nodes it can provide.
    Needs ``ray.init(address=...)`` first.
    """
    import ray  # why: the CLI imports this module for its local check, without Ray

    nodes = [
        {k: float(v) for k, v in n["Resources"].items()} for n in ray.nodes() if n.get("Alive")
    ]
    path = Path(bootstrap_config).expanduser()
    if path.is_file():
        try:
            launcher = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError):
            launcher = {}
        for node_type in (launcher.get("available_node_types") or {}).values():
            resources = {k: float(v) for k, v in (node_type.get("resources") or {}).items()}
            count = min(int(node_type.get("max_workers", 0) or 0), 64)
            nodes += [dict(resources) for _ in range(count)]
    return nodes
