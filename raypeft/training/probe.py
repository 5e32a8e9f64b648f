"""A short probe of one experiment's training step on a GPU: what ``resources.use_gpu: auto``
chooses how many trials share a GPU from (:mod:`raypeft.search.gpu_plan` runs it as Ray tasks
on a GPU node and chooses).

Two kinds of measurement, each a few steps of the experiment's own backbone, method, batch size
and input length on a full-length random batch (a step's time and memory do not depend on the
tokens):

- :func:`probe_alone`: one trial stepping as :func:`raypeft.training.loop.train` steps it
  (forward, then :func:`~raypeft.training.optimizer.optimizer_step`); K processes run it
  together to measure K trials sharing the GPU through Ray's fractional GPUs;
- :func:`probe_pack`: a pack of K members on one backbone stepping as a pack server steps
  them: fused where they can be (:mod:`raypeft.training.fused`), else with
  :func:`raypeft.training.pack_step.packed_step` (docs/packing.md).

Each returns the median step, the span (``start``/``end``, comparable between processes), the
samples trained in it and the peak memory (CUDA's most allocated, ``peak_mib``) with the
device's name and size. Only torch and the training core: no Ray.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from raypeft.config.schema import ExperimentConfig
from raypeft.modeling.build import build_model
from raypeft.modeling.cache import cached_backbone
from raypeft.modeling.head_pooling import resolve_head_pooling
from raypeft.modeling.packed import PackedBackbone
from raypeft.modeling.precision import resolve_precision
from raypeft.training.fused import FusedPack, fusing_refusal
from raypeft.training.optimizer import optimizer_step
from raypeft.training.pack_step import Learner, packed_step
from raypeft.training.step_timing import MiB, random_batch, time_steps

STEPS, WARMUP = 8, 3  # timed steps (median reported), after warm-up steps (kernels, allocator)


@dataclass(frozen=True)
class _Spec:
    problem: str = "single_label_classification"


@dataclass(frozen=True)
class ProbeTask:
    """The task labels a probe's model is built for: two classes (a seq2seq model's two
    verbalizers); the step's cost does not depend on the label count."""

    spec: _Spec = _Spec()
    num_labels: int = 2
    verbalizers: tuple[str, ...] = ("negative", "positive")


def device_facts(device: torch.device) -> dict:
    """The GPU's name and memory (MiB); on a CPU, its type only."""
    if device.type != "cuda":
        return {"gpu_name": None, "total_mib": None}
    props = torch.cuda.get_device_properties(device)
    return {"gpu_name": props.name, "total_mib": props.total_memory / MiB}


def _learner(cfg: ExperimentConfig, device: torch.device) -> Learner:
    """One trial's model and optimizer, built as the training loop builds them."""
    precision = resolve_precision(cfg.train.precision, device)
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg, ProbeTask(), device=device, precision=precision)
    model.train()
    return Learner.of(model, cfg, device)


def probe_alone(
    cfg: ExperimentConfig, device: torch.device, *, steps: int = STEPS, wait=None
) -> dict:
    """One trial's steps (after ``wait()``: the other processes of a shared GPU are ready)."""
    learner = _learner(cfg, device)
    model = learner.model
    batch = random_batch(model, cfg.train.batch_size, cfg.model.max_length, device)

    def step() -> None:
        loss = model(**batch).loss
        optimizer_step(
            loss,
            model,
            learner.optimizer,
            learner.scheduler,
            learner.max_grad_norm,
            learner.scaler,
        )

    for _ in range(WARMUP):
        step()
    timed = time_steps(step, steps, device, wait)
    return timed | device_facts(device) | {"samples": steps * cfg.train.batch_size}


def probe_pack(cfg: ExperimentConfig, k: int, device: torch.device, *, steps: int = STEPS) -> dict:
    """A pack of ``k`` members of ``cfg`` on one backbone: its steps, as a pack server steps."""
    learners = [_learner(cfg, device) for _ in range(k)]
    precision = learners[0].model.precision
    backbone = cached_backbone(
        cfg.model, 2, ProbeTask.spec.problem, seed=cfg.train.seed, precision=precision,
        device=device,
    )  # fmt: skip
    pack = PackedBackbone(
        backbone.model,
        backbone.dims.kind,
        precision,
        cfg.train.backbone_dropout,
        resolve_head_pooling(cfg.model.head_pooling, backbone.dims),
    )
    for learner in learners:
        pack.check_member(learner.model)
    batches = [
        random_batch(x.model, cfg.train.batch_size, cfg.model.max_length, device) for x in learners
    ]
    fused = None if fusing_refusal(pack, learners) else FusedPack(pack, learners)

    def step() -> None:  # as a pack server steps: fused where the members can be
        if fused is None:
            packed_step(pack, learners, batches)
        else:
            fused.step(range(k), batches)

    for _ in range(WARMUP):
        step()
    timed = time_steps(step, steps, device)
    facts = {"samples": steps * cfg.train.batch_size * k, "fused": fused is not None}
    return timed | device_facts(device) | facts
