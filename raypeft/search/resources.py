"""Does one trial's resource request fit the machines that will run it, and how many trials
run at once?

A trial asks for ``resources.workers_per_trial`` workers of ``resources.cpus_per_worker`` CPUs
and ``resources.gpus_per_worker`` GPUs (``use_gpu: true`` is 1; ``use_gpu: auto`` counts as the
CPU here until the search resolves it on the cluster, :mod:`raypeft.search.gpu_plan`). A
fraction of a GPU is Ray's fractional GPU: Ray places requests of 0.25 on one GPU until it is
full, so four trials share it (compute and memory alike: Ray does not partition the GPU's
memory). Ray places each worker
on one node, so every worker must fit a single node, and together they must fit the cluster
(workers of a Ray Train trial may spread over nodes). A request that can never be placed would
leave Ray waiting forever; :func:`check_fits` rejects it before anything starts.

Pure functions: ``nodes`` describe machines as Ray resource mappings (``{"CPU": 16, "GPU": 2}``),
either this machine (:func:`local_nodes`, what ``raypeft tune`` starts without ``--address``)
or a cluster's alive nodes (``ray.nodes()`` resources).
"""

from __future__ import annotations

import math
import os
from collections import Counter
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
    """What one worker of a trial asks Ray for (an in-process trial is one such worker)."""
    res = cfg.resources
    return {"CPU": float(res.cpus_per_worker), "GPU": res.gpus}


def trial_request(cfg: Any) -> dict[str, float]:
    """What one in-process trial asks Ray for: a worker's request, or, in packs of
    ``resources.trials_per_worker`` = K, its 1/K share (the pack's K trials hold the worker's
    resources together; :mod:`raypeft.search.packs`)."""
    request = worker_request(cfg)
    packed = cfg.resources.trials_per_worker
    if packed == 1:
        return request
    return {name: amount / packed for name, amount in request.items()}


def trials_on(node: dict[str, float], cfg: Any) -> int:
    """How many single-worker trials of ``cfg`` (packed ones: their shares) one node holds."""
    return _workers_on(node, trial_request(cfg))


def ray_train_scaling(cfg: Any) -> dict[str, Any]:
    """``ray.train.ScalingConfig`` arguments of a Ray Train trial: each worker's CPUs and
    (fractional) GPUs; Ray Train wants ``use_gpu`` to agree with a ``GPU`` amount."""
    request = worker_request(cfg)
    per_worker = {k: v for k, v in request.items() if k == "CPU" or v > 0}
    return {
        "num_workers": cfg.resources.workers_per_trial,
        "use_gpu": request["GPU"] > 0,
        "resources_per_worker": per_worker,
    }


def _workers_on(node: dict[str, float], request: dict[str, float]) -> int:
    """How many workers of ``request`` one node can hold at once."""
    fits = math.inf
    for name, amount in request.items():
        if amount > 0:
            fits = min(fits, math.floor(node.get(name, 0.0) / amount + _EPS))
    return 0 if fits is math.inf else int(fits)


def trials_at_once(cfg: Any, nodes: list[dict[str, float]]) -> int:
    """How many trials ``nodes`` run at the same time (0: not even one); at most
    ``search.max_concurrent`` when that is set."""
    slots = sum(_workers_on(n, worker_request(cfg)) for n in nodes)
    # packs of K: K trials per worker (a remainder too small for a worker holds no pack)
    fits = slots // cfg.resources.workers_per_trial * cfg.resources.trials_per_worker
    limit = cfg.search.max_concurrent
    return min(fits, limit) if limit else fits


def describe_placement(cfg: Any, at_once: int, where: str = "") -> str:
    """``"4 at a time (each 0.5 CPU and 0.25 GPU: 4 trials share a GPU)"``: the plan line;
    ``where`` follows "at a time" (``" here"``)."""
    res = cfg.resources
    request = worker_request(cfg)
    each = f"{_num(request['CPU'])} CPU" + (f" and {_num(request['GPU'])} GPU" if res.gpus else "")
    if res.workers_per_trial > 1:
        each = f"{res.workers_per_trial} workers of {each}"
    sharing = ""
    if 0 < res.gpus < 1:
        sharing = f": {math.floor(1 / res.gpus + _EPS)} trials share a GPU"
    if res.trials_per_worker > 1:  # a pack holds a worker's resources; each trial 1/K of them
        packs = f"packs of {res.trials_per_worker} trials on one backbone"
        return f"{at_once} at a time{where} ({packs}, each pack {each}" + (
            sharing.replace("trials", "packs") + ")"
        )
    return f"{at_once} at a time{where} (each {each}{sharing})"


def describe_gpus(nodes: list[dict[str, float]]) -> str:
    """GPUs per node, grouped: ``"2 nodes with 1 GPU, 1 node with no GPU"``."""
    counts = Counter(n.get("GPU", 0.0) for n in nodes)
    parts = []
    for gpus, count in sorted(counts.items(), reverse=True):
        what = f"{_num(gpus)} GPU{'s' if gpus > 1 else ''}" if gpus else "no GPU"
        parts.append(f"{count} node{'s' if count > 1 else ''} with {what}")
    return ", ".join(parts)


def auto_gpu_line(cfg: Any, nodes: list[dict[str, float]] | None, address: str | None) -> str:
    """What ``resources.use_gpu: auto`` will do, said before a search (``raypeft validate``):
    on a cluster (``address``) it is decided when the search starts, from the GPUs Ray sees;
    on this machine (``nodes``) the CPU, or the GPU with a sharing decided when it starts."""
    if address:
        return (
            f"resources: use_gpu auto → decided at the start of the search from the GPUs Ray "
            f"sees on the cluster at {address} (none: the CPU)"
        )
    gpus = sum(n.get("GPU", 0.0) for n in nodes or [])
    if not gpus:
        return "resources: use_gpu auto → no GPU on this machine: the CPU"
    return (
        f"resources: use_gpu auto → {_num(gpus)} GPU{'s' if gpus > 1 else ''} on this machine: "
        "the GPU; how many trials share one is decided at the start of the search (a short "
        "probe of step time and memory, cached per backbone, method and GPU type)"
    )


def check_fits(cfg: Any, nodes: list[dict[str, float]], where: str = "this machine") -> None:
    """Raise :class:`ConfigError` (one line, naming the key and the rule) when one trial of
    ``cfg`` cannot be placed on ``nodes``; ``where`` names them in the message."""
    # On a cluster, nodes still being set up (right after `ray up` on premise, whose launcher
    # file declares no node resources to count instead) are not among ``nodes`` yet.
    hint = (
        " (a cluster: pass --address)"
        if where == "this machine"
        else "; nodes that have not joined yet are not counted (see `ray status`)"
    )
    check_precision(cfg, nodes, where)
    _check_gpus(cfg, nodes, where, hint)
    _check_cpus(cfg, nodes, where, hint)
    _check_workers(cfg, nodes, where, hint)


def check_precision(cfg: Any, nodes: list[dict[str, float]], where: str = "this machine") -> None:
    """``train.precision: fp16`` with ``use_gpu: auto`` needs a GPU among ``nodes``: auto would
    resolve to the CPU, where fp16 cannot train. (A file that asks for the CPU itself is
    refused by its schema.) One rule for ``validate`` and for the search's start."""
    if cfg.train.precision != "fp16" or not cfg.resources.gpu_auto:
        return
    if not any(n.get("GPU", 0.0) > 0 for n in nodes):
        raise ConfigError(
            f"train.precision: fp16 needs a GPU, and resources.use_gpu: auto found none on "
            f"{where} ({describe_gpus(nodes)}); use bf16 or auto"
        )


def _gpu_key(cfg: Any) -> str:
    """The key a GPU message names: ``use_gpu`` where the file asked for a GPU with it."""
    return "gpus_per_worker" if cfg.resources.gpus_per_worker > 0 else "use_gpu"


def _check_gpus(cfg: Any, nodes: list[dict[str, float]], where: str, hint: str) -> None:
    """A GPU request needs a node with that many GPUs (a worker's GPUs are on one node)."""
    gpus = worker_request(cfg)["GPU"]
    if gpus <= 0:
        return
    key = _gpu_key(cfg)
    asked = _num(gpus) if key == "gpus_per_worker" else "true"  # the value, after the key
    largest = max((n.get("GPU", 0.0) for n in nodes), default=0.0)
    if largest <= 0:
        undo = "`gpus_per_worker: 0`" if key == "gpus_per_worker" else "`use_gpu: false`"
        raise ConfigError(
            f"resources.{key}: {asked} needs a GPU per worker, but {where} has none "
            f"({describe_gpus(nodes)}); {undo} must hold here{hint}"
        )
    if gpus > largest + _EPS:
        raise ConfigError(
            f"resources.{key}: each worker runs on one node, so `gpus_per_worker <= "
            f"{_num(largest)}` must hold (the most GPUs of a node of {where}: "
            f"{describe_gpus(nodes)}), but got {_num(gpus)}{hint}"
        )


def _check_cpus(cfg: Any, nodes: list[dict[str, float]], where: str, hint: str) -> None:
    """A worker's CPUs fit one node, beside its GPUs."""
    request = worker_request(cfg)
    largest_cpu = max((n.get("CPU", 0.0) for n in nodes), default=0.0)
    if request["CPU"] > largest_cpu + _EPS:
        raise ConfigError(
            f"resources.cpus_per_worker: each worker runs on one node, so `cpus_per_worker <= "
            f"{_num(largest_cpu)}` must hold (the most CPUs of a node of {where}), but got "
            f"cpus_per_worker={_num(request['CPU'])}{hint}"
        )
    if request["GPU"] > 0 and not any(_workers_on(n, request) for n in nodes):
        raise ConfigError(
            f"resources.cpus_per_worker: a worker needs {_num(request['CPU'])} CPUs and "
            f"{_num(request['GPU'])} GPU on one node, but no node of {where} has both{hint}"
        )


def _check_workers(cfg: Any, nodes: list[dict[str, float]], where: str, hint: str) -> None:
    """All workers of one trial fit the nodes together."""
    request = worker_request(cfg)
    workers = cfg.resources.workers_per_trial
    total_cpu = sum(n.get("CPU", 0.0) for n in nodes)
    total_gpu = sum(n.get("GPU", 0.0) for n in nodes)
    if request["GPU"] > 0 and workers * request["GPU"] > total_gpu + _EPS:
        most = math.floor(total_gpu / request["GPU"] + _EPS)
        raise ConfigError(
            f"resources.workers_per_trial: each worker takes {_num(request['GPU'])} GPU, so "
            f"`workers_per_trial <= {most}` must hold (the {_num(total_gpu)} GPUs of {where}), "
            f"but got workers_per_trial={workers}{hint}"
        )
    if workers * request["CPU"] > total_cpu + _EPS:
        raise ConfigError(
            f"resources.workers_per_trial: `workers_per_trial × cpus_per_worker <= "
            f"{_num(total_cpu)}` must hold (the CPUs of {where}), but got {workers} × "
            f"{_num(request['CPU'])} = {_num(workers * request['CPU'])}{hint}"
        )
    placed = sum(_workers_on(n, request) for n in nodes)
    if placed < workers:
        gpu = f" and {_num(request['GPU'])} GPU" if request["GPU"] > 0 else ""
        raise ConfigError(
            f"resources.workers_per_trial: {workers} workers of {_num(request['CPU'])} CPUs"
            f"{gpu} each must fit on the nodes of {where} (each worker on one node), but at "
            f"most {placed} do{hint}"
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
