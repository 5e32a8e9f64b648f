"""``resources.use_gpu: auto`` resolved at the start of a search, as ``train.precision: auto``
is resolved on each trial's device: trials go to a GPU when Ray's nodes have one, else the
CPU; how many share a GPU (``gpus_per_worker: 1/K``) or train as a pack
(``trials_per_worker: K``) comes from :mod:`raypeft.search.gpu_probe` (a probe, its cache, or
the recorded table's rule). Explicit ``use_gpu: true``/``false`` are kept as they are; so is
sharing the file sets itself (``gpus_per_worker``, ``trials_per_worker > 1``, DDP workers),
``auto`` then only deciding GPU or CPU.

The search uses the resolved experiment (``use_gpu: true``/``false`` with its amounts) for
everything it starts and records: the trials, the parent run's parameters, ``--resume``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raypeft.config.schema import ExperimentConfig
from raypeft.modeling.backbones import backbone_dims, load_config
from raypeft.modeling.packed import packable
from raypeft.search.gpu_probe import (
    KS,
    PROBE_TIMEOUT_S,
    Choice,
    ProbeResult,
    cache_file,
    cached,
    choose,
    probe_key,
    remember,
    rule_choice,
    run_probe,
)
from raypeft.search.resources import check_precision
from raypeft.search.space import candidate_methods

ACCELERATOR_PREFIX = "accelerator_type:"  # Ray's resource naming a node's GPU type ("H100")


@dataclass(frozen=True)
class ResourcePlan:
    """The experiment with its resources resolved, and the line that says what and why
    (None where the file did not ask for ``auto``)."""

    cfg: ExperimentConfig
    line: str | None


def plan_resources(
    cfg: ExperimentConfig,
    nodes: list[dict[str, float]],
    *,
    where: str = "the cluster",
    probe: Callable[..., ProbeResult | str] = run_probe,
    cache: Path | None = None,
    say: Callable[[str], None] = print,
) -> ResourcePlan:
    """Resolve ``use_gpu: auto`` on ``nodes`` (Ray resource mappings of the nodes that will run
    the trials; ``where`` names them). ``probe`` runs on the connected Ray when no cached
    probe (``cache``, default :func:`~raypeft.search.gpu_probe.cache_file`) answers; ``say``
    tells the user it runs, and each of its measurements."""
    res = cfg.resources
    if not res.gpu_auto:
        return ResourcePlan(cfg, None)
    total = sum(n.get("GPU", 0.0) for n in nodes)
    if total <= 0:
        check_precision(cfg, nodes, where)
        plain = resolved(cfg, use_gpu=False, gpus_per_worker=0)
        return ResourcePlan(plain, f"resources: use_gpu auto → no GPU on {where}: the CPU")
    seen = f"{total:g} GPU{'s' if total != 1 else ''} seen by Ray on {where}"
    if res.gpus_per_worker > 0 or res.trials_per_worker > 1 or res.workers_per_trial > 1:
        amount = res.gpus_per_worker or (1.0 if res.trials_per_worker > 1 else 0.0)
        chosen = resolved(cfg, use_gpu=True, gpus_per_worker=amount)
        return ResourcePlan(chosen, f"resources: use_gpu auto → {seen}; {sharing(chosen)} as set")
    choice, source = decide_sharing(cfg, nodes, probe, cache, say)
    chosen = apply_choice(cfg, choice)
    return ResourcePlan(
        chosen, f"resources: use_gpu auto → {seen}; {sharing(chosen)} ({source}: {choice.why})"
    )


def decide_sharing(
    cfg: ExperimentConfig,
    nodes: list[dict[str, float]],
    probe,
    cache: Path | None,
    say: Callable[[str], None],
) -> tuple[Choice, str]:
    """The sharing of one GPU and where it comes from: the cached probe of this backbone,
    method, shape and GPU type, a probe run now (then cached), or the recorded rule."""
    dims = backbone_dims(load_config(cfg.model, 2, "single_label_classification"),
                         cfg.model.max_length, cfg.model.name)  # fmt: skip
    k_max = shares_per_gpu(cfg, nodes)
    packs = packs_allowed(cfg, dims)
    key = probe_key(cfg, accelerator_type(nodes), k_max, packs)
    path = cache or cache_file()
    hit = cached(key, path)
    if hit is not None:
        return choose(hit.measured, hit.total_mib), f"probe on {hit.gpu_name}, cached in {path}"
    ks = [k for k in KS if k <= k_max]
    trials = ", ".join(map(str, ks))
    packed = f", then packs of {', '.join(map(str, ks[1:]))}" if packs and len(ks) > 1 else ""
    say(
        f"resources: use_gpu auto → probing the {accelerator_type(nodes)}: {trials} trials "
        f"sharing it{packed} (at most {PROBE_TIMEOUT_S:.0f} s; once: cached in {path})"
    )
    result = probe(cfg, ks, packs, say=say)
    if isinstance(result, ProbeResult):
        remember(key, result, path)
        return choose(result.measured, result.total_mib), f"probe on {result.gpu_name}"
    return rule_choice(dims.hidden_size, dims.num_layers, dims.kind, k_max), f"no probe: {result}"


def shares_per_gpu(cfg: ExperimentConfig, nodes: list[dict[str, float]]) -> int:
    """The most trials that can share one GPU for CPUs: each holds ``cpus_per_worker`` of the
    CPUs beside that GPU on the node with the most GPUs."""
    node = max(nodes, key=lambda n: n.get("GPU", 0.0))
    per_gpu = node.get("CPU", 0.0) / node["GPU"]
    return max(1, math.floor(per_gpu / cfg.resources.cpus_per_worker + 1e-4))


def packs_allowed(cfg: ExperimentConfig, dims) -> bool:
    """Whether the probe may try packs: single-worker in-process trials whose every method
    setting packs on this backbone, and the file leaves ``trials_per_worker`` to auto."""
    res = cfg.resources
    if "trials_per_worker" in res.model_fields_set or res.trial_runner == "ray_train":
        return False
    try:
        return all(packable(m.resolve(dims), dims.kind) is None for m in candidate_methods(cfg))
    except ValueError:  # a setting that does not resolve fails later, with its own message
        return False


def accelerator_type(nodes: list[dict[str, float]]) -> str:
    """The GPU type Ray reports for the node with the most GPUs (``"GPU"`` if none)."""
    node = max(nodes, key=lambda n: n.get("GPU", 0.0))
    names = sorted(k[len(ACCELERATOR_PREFIX) :] for k in node if k.startswith(ACCELERATOR_PREFIX))
    return names[0] if names else "GPU"


def apply_choice(cfg: ExperimentConfig, choice: Choice) -> ExperimentConfig:
    """The experiment asking Ray for ``choice``: 1/K of a GPU per trial, or packs of K."""
    if choice.mode == "pack":
        return resolved(cfg, use_gpu=True, gpus_per_worker=1.0, trials_per_worker=choice.k)
    return resolved(cfg, use_gpu=True, gpus_per_worker=round(1 / choice.k, 4))


def resolved(cfg: ExperimentConfig, **resources: Any) -> ExperimentConfig:
    """``cfg`` with ``resources`` set, validated again (the file's rules hold for the result)."""
    data = cfg.model_dump(mode="json")
    data["resources"].update(resources)
    return ExperimentConfig.model_validate(data)


def sharing(cfg: ExperimentConfig) -> str:
    """How a resolved experiment's trials hold a GPU, in words."""
    res = cfg.resources
    if res.trials_per_worker > 1:
        k = res.trials_per_worker
        return f"packs of {k} trials per GPU (trials_per_worker: {k})"
    if 0 < res.gpus < 1:
        k = math.floor(1 / res.gpus + 1e-4)
        return f"{k} trials per GPU (gpus_per_worker: {res.gpus:g})"
    per = "worker" if res.workers_per_trial > 1 else "trial"
    return f"{res.gpus:g} GPU per {per}"
