"""Several trials training together on one frozen backbone: a pack.

Each member is still a trial of its own: its own method tensors, head, AdamW state with its
own learning rates, schedule, gradient clipping, random state and data order (the batches its
``train.seed`` and ``train.batch_size`` give it alone), evaluations, reports and checkpoints,
as :func:`raypeft.training.loop.train` trains it alone. Only the frozen backbone's forward and
backward passes are shared: each step concatenates the members' batches along the batch axis
(:class:`raypeft.modeling.packed.PackedBackbone`) and back-propagates the sum of the members'
losses once, which gives each member exactly its own gradients.

A driver keeps a pack busy: it adds members between steps (:meth:`Pack.add`, into a free
slot), steps (:meth:`Pack.step`), evaluates the members due (:meth:`Pack.evaluate`), writes
their checkpoints (:meth:`Pack.write_checkpoint`), reports, and removes the members that
finished, were stopped or diverged (:meth:`Pack.remove`); a freed slot takes the next
configuration. :func:`train_pack` is that loop, fed from an iterable of configurations (a
searcher's suggestions, one at a time).

A pack is one process on one device: its members share the frozen backbone bit for bit (same
model, revision, label count, precision and device; for a randomly initialised test model
also the same ``train.seed``); DDP trials do not pack.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

from raypeft.config.schema import ExperimentConfig
from raypeft.data import TokenizedTask
from raypeft.modeling.build import build_model
from raypeft.modeling.cache import cached_backbone
from raypeft.modeling.head_pooling import resolve_head_pooling
from raypeft.modeling.packed import MemberRNG, PackedBackbone, PackEntry, PackShape, packable
from raypeft.modeling.precision import resolve_precision
from raypeft.modeling.prompted import PromptedModel
from raypeft.training.checkpoints import restore_trial, write_trial_checkpoint
from raypeft.training.datasets import ArrayDataset, ensure_features, split_dataset, to_device
from raypeft.training.efficiency import PeakMemory, TrialMeter
from raypeft.training.evaluation import TargetMetric, split_metrics
from raypeft.training.fused import FusedPack, fusing_refusal
from raypeft.training.loop import (
    batches_from,
    diverged_result,
    evaluation_result,
)
from raypeft.training.pack_step import Learner, packed_step
from raypeft.training.result_keys import (
    PACK_ID_KEY,
    PACK_PADDING_KEY,
    PACK_SIZE_KEY,
)
from raypeft.training.resume import LoopState
from raypeft.training.sampler import GlobalBatchSampler, training_batches


@dataclass(frozen=True)
class MemberSpec:
    """A configuration to train in a pack: ``key`` names it in reports (its trial's id);
    ``resume_from``, a checkpoint folder its trial reported, continues it from there."""

    key: str
    cfg: ExperimentConfig
    resume_from: Path | None = None


@dataclass
class Member:
    """One trial in a pack: its configuration, learner, loop state and data."""

    spec: MemberSpec
    slot: int  # its place in the pack (the order of rows in a fused batch)
    learner: Learner
    loop: LoopState
    sampler: GlobalBatchSampler
    batches: Iterator[dict]
    val_set: ArrayDataset
    target: TargetMetric
    meter: TrialMeter
    precision: str
    losses: list[float] = field(default_factory=list)  # training losses since the last report
    evaluated_at: int = 0  # the step of its last evaluation (or the step it resumed from)

    @property
    def key(self) -> str:
        return self.spec.key

    @property
    def cfg(self) -> ExperimentConfig:
        return self.spec.cfg

    @property
    def model(self) -> PromptedModel:
        return self.learner.model

    @property
    def finished(self) -> bool:
        """Whether it has taken all of its ``train.max_steps``."""
        return self.loop.step >= self.cfg.train.max_steps

    @property
    def due(self) -> bool:
        """Whether its trial would evaluate now (every ``train.eval_every`` steps and at the
        last one), and has not yet."""
        step, train = self.loop.step, self.cfg.train
        return step > self.evaluated_at and (
            step % train.eval_every == 0 or step == train.max_steps
        )


class Pack:
    """Up to ``capacity`` trials of one task training together on one frozen backbone.

    Members join (:meth:`add`) and leave (:meth:`remove`) between steps; the backbone is built
    with the first member and stays while the pack lives. Every member reports what it would
    report alone (:meth:`evaluate`), plus the pack's id, size and padding waste
    (:mod:`raypeft.training.result_keys`).
    """

    def __init__(
        self,
        task: TokenizedTask,
        *,
        capacity: int,
        device: torch.device | str | None = None,
        pack_id: str = "pack",
        fuse: bool = True,
    ):
        if capacity < 1:
            raise ValueError(f"`capacity >= 1` must hold, but got (capacity={capacity})")
        self.task, self.capacity, self.pack_id = task, capacity, pack_id
        self.device = torch.device(device or "cpu")
        self.slots: list[Member | None] = [None] * capacity
        self.backbone: PackedBackbone | None = None
        self.memory = PeakMemory(self.device)  # one process: one peak for every member
        self.shape = PackShape()  # summed over the steps so far
        # fuse: step the members as stacks (raypeft.training.fused) where they can; the
        # stacks live while the membership holds (``_fused_for``: each slot's key)
        self.fuse = fuse
        self._fused: FusedPack | None = None
        self._fused_for: tuple[str | None, ...] = ()
        self.not_fused: str | None = None  # why the members step one by one (None: fused)

    @property
    def members(self) -> list[Member]:
        """The members, in slot order."""
        return [m for m in self.slots if m is not None]

    @property
    def free(self) -> int:
        return self.slots.count(None)

    def member(self, key: str) -> Member:
        for member in self.members:
            if member.key == key:
                return member
        raise KeyError(f"no member {key!r} in the pack")

    def add(self, spec: MemberSpec) -> Member:
        """Build the trial ``spec`` describes (resumed from ``spec.resume_from`` if given) as
        :func:`~raypeft.training.loop.train` builds it, into the first free slot. Raises
        ``ValueError`` when the pack is full, the key is taken, or the trial cannot share the
        pack's backbone."""
        if not self.free:
            raise ValueError(f"the pack is full ({self.capacity} members)")
        if any(m.key == spec.key for m in self.members):
            raise ValueError(f"a member {spec.key!r} is already in the pack")
        meter = TrialMeter(self.device, self.memory)
        learner, loop, precision = self._learner(spec)
        model = learner.model
        problem = packable(model.method.config, model.kind)
        if problem is not None:
            raise ValueError(f"method {model.method.config.name!r} cannot pack: {problem}")
        if self.backbone is None:
            self.backbone = self._packed_backbone(spec.cfg, precision)
        self.backbone.check_member(model)
        cfg, task = spec.cfg, self.task
        train_set, val_set = (
            split_dataset(task, cfg, "train"),
            split_dataset(task, cfg, "validation"),
        )
        sampler, loader = training_batches(train_set, cfg.train)
        batches = batches_from(loop, sampler, loader, cfg.train.max_steps)
        slot = self.slots.index(None)
        target = TargetMetric.of(cfg, task.spec.primary_metric)
        member = Member(
            spec, slot, learner, loop, sampler, batches, val_set, target,
            meter, precision, evaluated_at=loop.step,
        )  # fmt: skip
        model.train()
        self.slots[slot] = member
        return member

    def remove(self, key: str) -> Member:
        """Take a member out (finished, stopped or diverged); its slot is free again."""
        member = self.member(key)
        self.write_back()
        self.slots[member.slot] = None
        return member

    def step(self, keys: Collection[str] | None = None) -> dict[str, dict]:
        """One training step of every member with steps left, in one pass through the backbone.
        Returns the failure result of each member whose loss became NaN or infinite (it took no
        step): report it and remove the member, its trial has ended as it ends alone.
        ``keys``: only these members step (the others wait, e.g. for their trial's scheduler
        to accept their last report: :mod:`raypeft.training.pack_host`)."""
        members = [m for m in self.members if not m.finished and (keys is None or m.key in keys)]
        if not members:
            return {}
        batches = [to_device(next(m.batches), self.device) for m in members]
        fused = self._fused_members()
        if fused is not None:
            outcome = fused.step([m.slot for m in members], batches)
        else:
            outcome = packed_step(self.backbone, [m.learner for m in members], batches)
        self.shape += outcome.shape
        failures = {}
        for member, batch, loss, ok in zip(
            members, batches, outcome.losses, outcome.finite, strict=True
        ):
            if not ok:  # its trial ends as alone, tagged with the pack it trained in
                failure = diverged_result(torch.tensor(loss), member.loop.step)
                failures[member.key] = {**failure, PACK_ID_KEY: self.pack_id}
                continue
            member.loop.count_step(len(batch["labels"]), outcome.seconds)
            member.losses.append(loss)
        self.memory.sample()
        return failures

    def _fused_members(self) -> FusedPack | None:
        """The members' stacks for this membership (built after a member joined or left), or
        None where they step one by one (:attr:`not_fused` says why)."""
        if not self.fuse:
            self.not_fused = "fusing is off"
            return None
        seated = tuple(None if m is None else m.key for m in self.slots)
        if seated == self._fused_for:
            return self._fused
        self.write_back()
        self._fused, self._fused_for = None, seated
        learners = [None if m is None else m.learner for m in self.slots]
        self.not_fused = fusing_refusal(self.backbone, [x for x in learners if x is not None])
        if self.not_fused is None:
            seated = self.members
            compiled = seated[0].cfg.resources.compile_packs
            rows = max(m.cfg.train.batch_size for m in seated) if compiled else None
            self._fused = FusedPack(self.backbone, learners, compile_rows=rows)
        return self._fused

    def write_back(self) -> None:
        """Bring every member's own tensors and optimizer state up to date with the fused
        stacks (a no-op when the members step one by one)."""
        if self._fused is not None:
            self._fused.write_back()

    def due(self) -> list[str]:
        """The keys of the members whose trials would evaluate after this step."""
        return [m.key for m in self.members if m.due]

    def evaluate(self, keys: Sequence[str]) -> dict[str, dict]:
        """Evaluate these members (due ones: each has trained since its last report) in one
        pass over their validation batches, and return what each reports, by key: what its
        trial reports alone after an evaluation, plus the pack's keys."""
        members = [self.member(k) for k in keys]
        if not members:
            return {}
        self.write_back()
        vals = evaluate_members(self.backbone, members, self.task.spec.metrics, self.device)
        pack = {
            PACK_ID_KEY: self.pack_id,
            PACK_SIZE_KEY: len(self.members),
            PACK_PADDING_KEY: self.shape.padding_waste,
        }
        results = {}
        for m, val in zip(members, vals, strict=True):
            loss, per_epoch = float(np.mean(m.losses)), m.sampler.per_epoch
            metrics = evaluation_result(
                val,
                loss,
                m.loop,
                m.target,
                per_epoch,
                m.meter,
                m.model,
                m.precision,
                m.spec.cfg.train,
            )
            results[m.key] = {**metrics, **pack}
            m.losses, m.evaluated_at = [], m.loop.step
        return results

    def write_checkpoint(self, key: str, folder: Path) -> None:
        """The member's checkpoint, as its trial writes it alone (the best model so far and
        ``resume/``, with the member's own random state)."""
        m = self.member(key)
        self.write_back()
        with m.learner.rng.active():
            write_trial_checkpoint(
                folder, m.model, m.cfg, self.task, m.learner.optimizer, m.learner.scheduler, m.loop
            )

    # ------------------------------------------------------------------ building

    def _rng_devices(self) -> list[torch.device]:
        return [self.device] if self.device.type == "cuda" else []

    def _learner(self, spec: MemberSpec) -> tuple[Learner, LoopState, str]:
        """What :func:`~raypeft.training.loop.train` builds before its first step, in the
        random state a process of the trial's own would have, which the member keeps."""
        cfg = spec.cfg
        precision = resolve_precision(cfg.train.precision, self.device)
        with torch.random.fork_rng(devices=self._rng_devices()):
            torch.manual_seed(cfg.train.seed)
            ensure_features(self.task, cfg)
            model = build_model(cfg, self.task, device=self.device, precision=precision)
            learner = Learner.of(model.to(self.device), cfg, self.device)
            loop = restore_trial(spec.resume_from, model, learner.optimizer, learner.scheduler)
            learner.rng = MemberRNG(self.device)
        return learner, loop, precision

    def _packed_backbone(self, cfg: ExperimentConfig, precision: str) -> PackedBackbone:
        """The pack's own copy of the backbone its first member was built on."""
        with torch.random.fork_rng(devices=self._rng_devices()):  # the cache reseeds
            backbone = cached_backbone(
                cfg.model,
                self.task.num_labels,
                self.task.spec.problem,
                seed=cfg.train.seed,
                precision=precision,
                device=self.device,
            )
        return PackedBackbone(
            backbone.model,
            backbone.dims.kind,
            precision,
            cfg.train.backbone_dropout,
            resolve_head_pooling(cfg.model.head_pooling, backbone.dims),
        )


@torch.no_grad()
def evaluate_members(
    backbone: PackedBackbone,
    members: Sequence[Member],
    metric_names: tuple[str, ...],
    device: torch.device,
) -> list[dict[str, float]]:
    """Each member's validation metrics, as :func:`~raypeft.training.evaluation.evaluate`
    gives them alone, from one pass over all members' batches (each of its own
    ``train.eval_batch_size``); the time, and so ``samples_per_s``, is the pass's."""
    loaders = []
    backbone.eval()  # no dropout while evaluating
    for m in members:
        m.model.eval()
        with m.learner.rng.active():  # a DataLoader draws its seed from the global generator
            loaders.append(iter(DataLoader(m.val_set, batch_size=m.cfg.train.eval_batch_size)))
    outputs: list[list[np.ndarray]] = [[] for _ in members]
    labels: list[list[np.ndarray]] = [[] for _ in members]
    loss_sums = [0.0] * len(members)
    start = time.perf_counter()
    for batches in zip_longest(*loaders):
        present = [(i, to_device(b, device)) for i, b in enumerate(batches) if b is not None]
        entries = [PackEntry(members[i].model, b, members[i].learner.rng) for i, b in present]
        results, _ = backbone(entries)
        # a head's logits are its predictions; seq2seq models generate
        predictions = (
            backbone.predict(entries)
            if backbone.kind == "seq2seq"
            else [out.logits.float().cpu().numpy() for out in results]
        )
        for (i, batch), out, pred in zip(present, results, predictions, strict=True):
            y = batch["labels"]
            loss_sums[i] += out.loss.item() * len(y)
            outputs[i].append(pred)
            labels[i].append(y.cpu().numpy())
    elapsed = time.perf_counter() - start
    backbone.train()
    for m in members:
        m.model.train()
    return [
        split_metrics(metric_names, outputs[i], labels[i], loss_sums[i], elapsed)
        for i in range(len(members))
    ]
