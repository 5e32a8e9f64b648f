"""A fused pack's step: its members' trainable tensors, AdamW moments, gradient clipping and
update held and done as stacks over the members' slots, not member by member.

:class:`FusedPack` is built from a pack's seated members (their learners, in slot order) and
lives while the membership holds. The stacks are then the truth: each step updates them, and
:meth:`FusedPack.write_back` copies them into the members' own tensors and optimizer state
before anything reads those (an evaluation, a checkpoint, a member leaving). A step does:

- one forward pass for every stepping member (:class:`~raypeft.modeling.fused.FusedModel`),
  each member's loss the mean over its own rows, and one backward pass of their sum;
- each member's gradient clipping with its own ``train.max_grad_norm``: per-slot norms over
  all its tensors, one coefficient per slot;
- AdamW as :class:`torch.optim.AdamW` computes it (decoupled weight decay, bias-corrected
  moments), with every member's own learning rates (per group, read from its optimizer after
  its schedule), betas, epsilon, weight decay and step count as per-slot tensors; a slot that
  does not step this time gets the identity (its tensors and moments stay as they are);
- each stepping member's schedule (``scheduler.step()``, Python only).

Fused packs need an encoder, a method with a fused form (PT, DePT, deep prompts, IDPG, IPT's
table strategies: :func:`~raypeft.modeling.fused.fused_refusal`), linear heads, fp32 or bf16
(fp16's loss scaler is per member) and AdamW without amsgrad; other packs step member by
member (:func:`raypeft.training.pack.packed_step`).
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Sequence

import torch

from raypeft.modeling.fused import (
    FUSED_KEYS,
    FusedModel,
    SlotRows,
    fused_refusal,
    slot_losses,
    trainable_tensors,
)
from raypeft.modeling.packed import PackedBackbone
from raypeft.training.pack_step import Learner, StepOutcome

# torch warns when a schedule steps before its optimizer did: a fused pack steps the
# optimizer's tensors itself, then the schedule, in the same order as a trial alone
_SCHEDULE_ORDER = r"Detected call of `lr_scheduler\.step\(\)` before `optimizer\.step\(\)`"
# The per-slot scalars of one AdamW update, in the order of the table :meth:`_scalars` builds
_SCALARS = ("decay", "keep1", "beta2", "keep2", "correction2", "eps", "step_size")
# A compiled pack pads its prompts to a multiple of this many positions, so that members of
# nearby lengths coming and going keep its shapes (and its compiled graph)
PROMPT_BUCKET = 16


def fusing_refusal(backbone: PackedBackbone, learners: Sequence[Learner]) -> str | None:
    """Why these learners cannot step as a fused pack (None: they can)."""
    why = fused_refusal(backbone, [x.model for x in learners])
    if why is not None:
        return why
    for learner in learners:
        if learner.scaler.is_enabled():
            return "fp16's loss scaler is per member"
        if not isinstance(learner.optimizer, torch.optim.AdamW):
            return f"its optimizer is a {type(learner.optimizer).__name__}, not AdamW"
        for group in learner.optimizer.param_groups:
            if group["amsgrad"] or group["maximize"] or group["differentiable"]:
                return "AdamW with amsgrad, maximize or differentiable"
    shapes = [{k: p.dim() for k, p in trainable_tensors(x.model).items()} for x in learners]
    if any(s != shapes[0] for s in shapes):
        return "its members' trainable tensors differ in names or ranks"
    return None


class FusedPack:
    """The stacked state of a pack's members (``learners[slot]``, None: an empty slot)."""

    def __init__(
        self,
        backbone: PackedBackbone,
        learners: Sequence[Learner | None],
        *,
        compile_rows: int | None = None,
    ):
        """``compile_rows``: compile the step's forward pass and losses (``torch.compile``,
        static shapes) with every slot holding this many rows (the members' largest batch);
        None: eager, each member's own rows only."""
        self.backbone = backbone
        self.learners = list(learners)
        seated = [(s, x) for s, x in enumerate(self.learners) if x is not None]
        self.tensors = {s: trainable_tensors(x.model) for s, x in seated}
        self.group_of = _groups(self.tensors, self.learners)  # each stack's group name
        self.group_names = sorted(set(self.group_of.values()))
        keys = next(iter(self.tensors.values()))
        device = next(iter(keys.values())).device
        self.device = device
        self.params, self.exp_avg, self.exp_avg_sq = {}, {}, {}
        self._scratch: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # _scratch_for
        for key in keys:
            shapes = [t[key].shape for t in self.tensors.values()]
            shape = (len(self.learners), *(max(n) for n in zip(*shapes, strict=True)))
            self.params[key] = torch.zeros(shape, device=device)
            self.exp_avg[key] = torch.zeros(shape, device=device)
            self.exp_avg_sq[key] = torch.zeros(shape, device=device)
        self.steps = [0] * len(self.learners)
        for slot, _ in seated:
            self._read(slot)
        for stack in self.params.values():
            stack.requires_grad_(True)
        members = [None if x is None else x.model for x in self.learners]
        bucket = 1 if compile_rows is None else PROMPT_BUCKET
        self.model = FusedModel(backbone, members, self.params, bucket)
        self._rows: dict[tuple[tuple[int, ...], tuple[int, ...]], SlotRows] = {}
        self.compile_rows = compile_rows
        self._losses = self._slot_losses
        if compile_rows is not None:
            self._losses = torch.compile(self._slot_losses, dynamic=False)

    # ------------------------------------------------------------------ members' own state

    def _read(self, slot: int) -> None:
        """Copy a member's tensors and AdamW state into its slot of the stacks."""
        optimizer = self.learners[slot].optimizer
        steps = set()
        for key, param in self.tensors[slot].items():
            region = (slot, *(slice(0, n) for n in param.shape))
            self.params[key][region] = param.detach()
            state = optimizer.state.get(param)
            if state:
                self.exp_avg[key][region] = state["exp_avg"]
                self.exp_avg_sq[key][region] = state["exp_avg_sq"]
                steps.add(int(state["step"]))
        if len(steps) > 1:
            raise ValueError(f"a member's tensors have taken different steps: {sorted(steps)}")
        self.steps[slot] = steps.pop() if steps else 0

    @torch.no_grad()
    def write_back(self) -> None:
        """Copy the stacks into every member's own tensors and AdamW state (what its
        checkpoint, its evaluation and a pack that steps it member by member read)."""
        for slot, tensors in self.tensors.items():
            optimizer = self.learners[slot].optimizer
            for key, param in tensors.items():
                region = (slot, *(slice(0, n) for n in param.shape))
                param.copy_(self.params[key][region])
                if self.steps[slot] == 0:
                    continue
                state = optimizer.state[param]
                if not state:  # as AdamW builds it at its first step
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(param)
                    state["exp_avg_sq"] = torch.zeros_like(param)
                state["step"].fill_(self.steps[slot])
                state["exp_avg"].copy_(self.exp_avg[key][region])
                state["exp_avg_sq"].copy_(self.exp_avg_sq[key][region])

    # ------------------------------------------------------------------ a step

    def step(self, slots: Sequence[int], batches: Sequence[dict]) -> StepOutcome:
        """One training step of the members in ``slots``, each on its batch: as
        :func:`~raypeft.training.pack_step.packed_step` steps them. A member whose loss is not
        finite takes no step."""
        start = time.perf_counter()
        for stack in self.params.values():
            stack.grad = None
        rows = self._rows_of(slots, [len(b["labels"]) for b in batches])
        batch = _concatenated(batches)
        layout = self.model.layout(batch["input_ids"].shape[1])  # built here, not compiled
        losses = self._losses(rows.spread(batch), rows)[rows.stepping]
        values = losses.detach().tolist()  # one device sync for all members
        finite = [math.isfinite(v) for v in values]
        stepped = [s for s, ok in zip(slots, finite, strict=True) if ok]
        if stepped:
            if len(stepped) == len(slots):
                losses.sum().backward()
            else:  # a diverged member's rows get no gradient from the others' losses
                torch.where(torch.isfinite(losses), losses, 0.0).sum().backward()
            self._update(stepped, diverged=len(stepped) < len(slots))
        shape = layout.shape([s for s, b in zip(slots, batches, strict=True) for _ in b["labels"]])
        return StepOutcome(values, finite, shape, time.perf_counter() - start)

    def _slot_losses(self, batch: dict[str, torch.Tensor], rows: SlotRows) -> torch.Tensor:
        """Every slot's loss on its rows of ``batch`` (what a compiled pack compiles)."""
        return slot_losses(self.model.logits(rows, batch), batch["labels"], rows)

    def _rows_of(self, slots: Sequence[int], counts: Sequence[int]) -> SlotRows:
        key = (tuple(slots), tuple(counts))
        if key not in self._rows:
            by_slot = dict(zip(slots, counts, strict=True))
            capacity = len(self.learners)
            if self.compile_rows is None:
                self._rows[key] = SlotRows.of(by_slot, capacity, self.device)
            else:
                self._rows[key] = SlotRows.static(by_slot, capacity, self.compile_rows, self.device)
        return self._rows[key]

    @torch.no_grad()
    def _update(self, stepped: Sequence[int], diverged: bool) -> None:
        """Clip each stepped member's gradients, then AdamW over the stacks. A slot that does
        not step (waiting, empty, or ``diverged``) gets the identity's scalars: its
        gradient is zero (a diverged member's, which may hold NaN, is zeroed first)."""
        grads = {k: p.grad for k, p in self.params.items()}
        if diverged:
            keep = torch.zeros(len(self.steps), dtype=torch.bool)
            keep[list(stepped)] = True
            keep = keep.to(self.device)
            grads = {k: torch.where(_per_slot(keep, g), g, 0.0) for k, g in grads.items()}
        self._clip(grads, stepped)
        for slot in stepped:
            self.steps[slot] += 1
        table = self._scalars(stepped)
        shaped: dict[tuple[str, int], dict[str, torch.Tensor]] = {}  # by group and rank
        for key, param in self.params.items():
            where = (self.group_of[key], param.dim())
            if where not in shaped:  # one view per group and rank, not per tensor
                row = table[self.group_names.index(where[0])]
                values = row.view(*row.shape, *[1] * (param.dim() - 1)).unbind(0)
                shaped[where] = dict(zip(_SCALARS, values, strict=True))
            s = shaped[where]
            grad, exp_avg, exp_avg_sq = grads[key], self.exp_avg[key], self.exp_avg_sq[key]
            param.mul_(s["decay"])
            exp_avg.lerp_(grad, s["keep1"])
            # AdamW's arithmetic in torch.optim.AdamW's order, its temporaries written into
            # two scratch stacks kept across steps: allocating stack-sized temporaries each
            # step made IPT's tables (8 × 30,522 × 384) step slower fused than one by one
            term, denom = self._scratch_for(key)
            exp_avg_sq.mul_(s["beta2"]).addcmul_(grad, torch.mul(grad, s["keep2"], out=term))
            torch.sqrt(exp_avg_sq, out=denom).div_(s["correction2"]).add_(s["eps"])
            param.sub_(torch.div(exp_avg, denom, out=term).mul_(s["step_size"]))
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_SCHEDULE_ORDER, category=UserWarning)
            for slot in stepped:
                self.learners[slot].scheduler.step()

    def _scratch_for(self, key: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Two stacks shaped as ``key``'s for the AdamW update's temporaries (made at the
        first step that needs them)."""
        if key not in self._scratch:
            like = self.params[key]
            self._scratch[key] = (torch.empty_like(like), torch.empty_like(like))
        return self._scratch[key]

    def _clip(self, grads: dict[str, torch.Tensor], stepped: Sequence[int]) -> None:
        """Each stepped member's gradients scaled as ``clip_grad_norm_`` scales them alone:
        by ``max_norm / (norm + 1e-6)`` when below 1, its norm over all its tensors."""
        limits = [math.inf] * len(self.steps)
        for slot in stepped:
            limits[slot] = self.learners[slot].max_grad_norm or math.inf
        if all(math.isinf(x) for x in limits):
            return
        norms = torch.stack(
            [torch.linalg.vector_norm(g, dim=tuple(range(1, g.dim()))) for g in grads.values()]
        )
        total = torch.linalg.vector_norm(norms, dim=0)
        limit = torch.tensor(limits, device=self.device)
        coefficient = (limit / (total + 1e-6)).clamp(max=1.0)
        for grad in grads.values():
            grad.mul_(_per_slot(coefficient, grad))

    def _scalars(self, stepped: Sequence[int]) -> torch.Tensor:
        """``(groups, len(_SCALARS), K)``: AdamW's per-slot scalars of this step, for each
        parameter group, computed as :class:`torch.optim.AdamW` computes them (in Python's
        floats); the identity's for a slot that does not step."""
        identity = (1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0)  # _SCALARS' values that change nothing
        table = [[[v] * len(self.steps) for v in identity] for _ in self.group_names]
        for slot in stepped:
            step = self.steps[slot]
            by_name = {g["name"]: g for g in self.learners[slot].optimizer.param_groups}
            for gi, name in enumerate(self.group_names):
                group = by_name[name]
                lr, (beta1, beta2) = group["lr"], group["betas"]
                values = (
                    1 - lr * group["weight_decay"],
                    1 - beta1,
                    beta2,
                    1 - beta2,
                    (1 - beta2**step) ** 0.5,
                    group["eps"],
                    lr / (1 - beta1**step),
                )
                for i, value in enumerate(values):
                    table[gi][i][slot] = value
        return torch.tensor(table, device=self.device)


def _concatenated(batches: Sequence[dict]) -> dict:
    """The members' batches as one (their rows in order; ``features``: each feature's)."""
    batch = {}
    for key in FUSED_KEYS:
        if key not in batches[0]:
            continue
        if key == "features":
            names = batches[0][key]
            batch[key] = {n: torch.cat([b[key][n] for b in batches]) for n in names}
        else:
            batch[key] = torch.cat([b[key] for b in batches])
    return batch


def _groups(tensors: dict[int, dict[str, torch.Tensor]], learners) -> dict[str, str]:
    """Each stack's parameter group name (its members' optimizers must agree)."""
    by_slot = []
    for slot, named in tensors.items():
        optimizer = learners[slot].optimizer
        group = {id(p): g["name"] for g in optimizer.param_groups for p in g["params"]}
        by_slot.append({key: group[id(p)] for key, p in named.items()})
    if any(g != by_slot[0] for g in by_slot):
        raise ValueError("a fused pack's members group their tensors differently")
    return by_slot[0]


def _per_slot(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``(K,)`` values shaped to broadcast over a ``(K, ...)`` stack."""
    return values.view(-1, *[1] * (like.dim() - 1))
