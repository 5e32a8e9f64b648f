"""A fused pack's forward pass: its members' prompts and heads as batched operations.

In a pack (:mod:`raypeft.modeling.packed`) every member prepares its own batch and runs its
own head, so a step's operators grow with the number of members K. A fused pack holds the
members' trainable tensors stacked along a leading slot axis (``(K, ...)``, each member's
zero-padded to the largest: DePT's ranks, prompt lengths) and computes all members at once:

- the method's batched preparation (:attr:`~raypeft.methods.base.PromptMethod.fused_parts`):
  each row's prompt and input embeddings from the stacks, indexed by the row's slot;
- the same layout as a pack's (:class:`FusedLayout`): a row is its member's prompt, its
  input, then padding up to the longest prompt (masked), by one gather per tensor;
- the heads: each head module's ``nn.Linear`` layers become :class:`StackedLinear`, one
  batched matrix product over the slots (rows laid out slot-major, padded to the largest
  member's batch);
- the per-member loss: each row's loss, averaged per slot by one scatter-add.

So a step dispatches the same operators whatever K is. Zero padding is exact: a padded rank
or generator width adds zero products, a padded prompt row or key/value prefix slot sits at a
masked position, and their gradients are exactly zero, so AdamW keeps them zero. Fusing covers
encoders and methods whose inputs are a prepended prompt (PT; DePT's update of the input
embeddings; IDPG's generated prompts; IPT's table rows), prompts at every layer (deep prompts,
M-IDPG, IPT's deep placement: each row's own prompt positions replaced at every layer by one
``torch.where``) and key/value prefixes (deep prompts' ``kv`` style: one cache of every row's
prefix); other packs step member by member (:func:`fused_refusal` says why).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DynamicCache

from raypeft.methods.base import PromptMethod
from raypeft.methods.fusing import FusedBatch
from raypeft.modeling.backbones import cache_argument
from raypeft.modeling.head_pooling import input_mean, pooled_logits
from raypeft.modeling.packed import PackedBackbone, PackShape
from raypeft.modeling.precision import autocast
from raypeft.modeling.prompted import PromptedModel

# The batch keys a fused pass reads ("features": a dict of per-example tensors, IDPG's M(x);
# seq2seq targets belong to backbones that do not fuse)
FUSED_KEYS = ("input_ids", "attention_mask", "token_type_ids", "labels", "features")


def fused_refusal(backbone: PackedBackbone, models: Sequence[PromptedModel]) -> str | None:
    """Why these members cannot step fused (None: they can)."""
    if backbone.kind != "encoder":
        return f"fused packs run on encoders (this backbone is a {backbone.kind})"
    methods = {type(m.method) for m in models}
    if len(methods) > 1:
        return "its members use different methods"
    method, called = models[0].method, models[0].method.config.name
    if method.fused_parts is None:
        return f"method {called!r} has no fused form"
    if method.uses_layer_prompts and method.fused_layer_prompts is None:
        return f"method {called!r} has no fused form of its layer prompts"
    prefixed = any(m.method.config.prefix_length() for m in models)
    if prefixed and method.fused_prefix is None:
        return f"method {called!r} has no fused form of its key/value prefixes"
    why = method.fusing_limitation([m.method for m in models])
    if why is not None:
        return why
    for path in backbone.head_paths:
        module = models[0].backbone.get_submodule(path)
        for name, sub in module.named_modules():
            if not isinstance(sub, nn.Linear) and any(sub.parameters(recurse=False)):
                return f"its head's {path}.{name} is a {type(sub).__name__}, not a linear layer"
    return None


def trainable_tensors(model: PromptedModel) -> dict[str, nn.Parameter]:
    """The member's trainable tensors under their checkpoint names (``method.*``, ``head.*``)."""
    named = {f"method.{n}": p for n, p in model.method.named_parameters() if p.requires_grad}
    for name, p in model.backbone.named_parameters():
        if p.requires_grad:
            named[f"head.{name}"] = p
    return named


@dataclasses.dataclass(frozen=True)
class SlotRows:
    """Where a fused batch's rows come from: ``slot`` ``(rows,)`` each row's slot; ``padded``
    ``(rows,)`` its row in the slot-major layout heads compute in (``slot · per_slot`` plus
    its place among its slot's rows); ``inverse_counts`` ``(K,)`` one over each slot's rows
    (1 for a slot without rows); ``stepping`` the slots whose batches these are, in order
    (where their losses are among the ``(K,)``)."""

    slot: torch.Tensor
    padded: torch.Tensor
    inverse_counts: torch.Tensor
    per_slot: int
    capacity: int
    stepping: torch.Tensor
    # static rows (a compiled pack): every slot has ``per_slot`` rows, those of a slot that
    # does not step (or beyond its batch) are blanks of weight 0; ``real`` says where the
    # stepping members' rows go among them
    weights: torch.Tensor | None = None
    real: torch.Tensor | None = None

    @classmethod
    def of(cls, counts: dict[int, int], capacity: int, device: torch.device) -> SlotRows:
        """The layout of batches of ``counts[slot]`` rows each, concatenated in slot order
        (``counts`` in the order the slots step)."""
        per_slot = max(counts.values())
        slots, padded = [], []
        for slot, n in sorted(counts.items()):
            slots += [slot] * n
            padded += [slot * per_slot + i for i in range(n)]
        inverse = [1.0 / counts.get(s, 1) for s in range(capacity)]
        return cls(
            torch.tensor(slots, device=device),
            torch.tensor(padded, device=device),
            torch.tensor(inverse, device=device),
            per_slot,
            capacity,
            torch.tensor(list(counts), device=device),
        )

    @classmethod
    def static(
        cls, counts: dict[int, int], capacity: int, per_slot: int, device: torch.device
    ) -> SlotRows:
        """Every slot's ``per_slot`` rows, whoever steps: the shapes of a compiled pack's
        step do not change while its membership holds."""
        if max(counts.values()) > per_slot:
            raise ValueError(f"a batch of {max(counts.values())} rows in slots of {per_slot}")
        real = [slot * per_slot + i for slot, n in sorted(counts.items()) for i in range(n)]
        weights = torch.zeros(capacity * per_slot)
        weights[real] = 1.0
        inverse = [1.0 / counts.get(s, 1) for s in range(capacity)]
        return cls(
            torch.arange(capacity, device=device).repeat_interleave(per_slot),
            torch.arange(capacity * per_slot, device=device),
            torch.tensor(inverse, device=device),
            per_slot,
            capacity,
            torch.tensor(list(counts), device=device),
            weights.to(device),
            torch.tensor(real, device=device),
        )

    def spread(self, batch: dict) -> dict:
        """Static rows: the stepping members' rows placed among blanks (zeros) in every
        slot's rows (``features``, a dict of tensors, alike); otherwise ``batch`` as it is."""
        if self.real is None:
            return batch
        rows = self.capacity * self.per_slot

        def blanks(v: torch.Tensor) -> torch.Tensor:
            return v.new_zeros((rows, *v.shape[1:])).index_copy(0, self.real, v)

        return {
            k: {n: blanks(f) for n, f in v.items()} if isinstance(v, dict) else blanks(v)
            for k, v in batch.items()
        }

    def by_slot(self, x: torch.Tensor) -> torch.Tensor:
        """``(rows, ...)`` as ``(K, per_slot, ...)``: each slot's rows in its own block,
        zeros where it has fewer (:class:`~raypeft.methods.fusing.SlotLayout`)."""
        flat = x.reshape(x.shape[0], -1)
        blocks = flat.new_zeros(self.capacity * self.per_slot, flat.shape[1])
        blocks = blocks.index_copy(0, self.padded, flat)
        return blocks.view(self.capacity, self.per_slot, *x.shape[1:])

    def by_row(self, y: torch.Tensor) -> torch.Tensor:
        """``(K, per_slot, ...)`` back to the rows, ``(rows, ...)``."""
        return y.reshape(self.capacity * self.per_slot, *y.shape[2:]).index_select(0, self.padded)


@dataclasses.dataclass(frozen=True)
class FusedLayout:
    """A pack's layout of its members' sequences (:class:`PackedBackbone`'s, for encoders):
    a row is its slot's prompt, its input (``length`` tokens), then zeros up to the longest
    prompt, masked. ``order`` ``(K, M + length)`` takes a row's positions from
    ``[prompt padded to M, input]``; ``prompt_mask`` ``(K, M)`` marks each slot's prompt;
    ``inputs`` ``(K, length)`` where each slot's input lands. Key/value prefixes (deep
    prompts' ``kv`` style) sit before every layer's keys: ``prefix_mask`` ``(K, P)`` marks
    each slot's, padded after it to the longest; ``positions`` ``(K, length)``, where the
    slots' prefixes differ, the position ids each slot's encoder gives its input alone."""

    order: torch.Tensor
    prompt_mask: torch.Tensor
    inputs: torch.Tensor
    prompts: tuple[int, ...]  # each slot's prompt length (0: an empty slot)
    prefix_mask: torch.Tensor
    prefixes: tuple[int, ...]  # each slot's key/value prefix
    positions: torch.Tensor | None = None

    @classmethod
    def of(
        cls,
        prompts: Sequence[int],
        length: int,
        device: torch.device,
        longest: int = 0,
        prefixes: Sequence[int] | None = None,
    ) -> FusedLayout:
        """``longest``: pad prompts to at least this many positions (a compiled pack's
        bucket), else to the longest of ``prompts``."""
        longest = max(longest, *prompts)
        prefixes = prefixes or [0] * len(prompts)
        order, mask, inputs = [], [], []
        for m in prompts:
            prompt, pad = list(range(m)), list(range(m, longest))
            order.append(prompt + list(range(longest, longest + length)) + pad)
            mask.append([1] * m + [0] * (longest - m))
            inputs.append(list(range(m, m + length)))
        past = max(prefixes)
        prefix_mask = [[1] * p + [0] * (past - p) for p in prefixes]
        return cls(
            torch.tensor(order, device=device),
            torch.tensor(mask, device=device),
            torch.tensor(inputs, device=device),
            tuple(prompts),
            torch.tensor(prefix_mask, device=device).reshape(len(prefixes), past),
            tuple(prefixes),
        )

    @property
    def longest(self) -> int:
        """The prompt positions every row has (its prompt and padding)."""
        return self.prompt_mask.shape[1]

    def shape(self, slots: Sequence[int]) -> PackShape:
        """How much of a fused batch whose rows come from ``slots`` is padding."""
        longest, length = self.longest, self.order.shape[1] - self.longest
        past = self.prefix_mask.shape[1]
        rows = len(slots)
        prompts = sum(self.prompts[s] + self.prefixes[s] for s in slots)
        padded = rows * (past + longest) - prompts
        return PackShape(rows, rows * (past + longest + length), padded, prompts)


class StackedLinear(nn.Module):
    """Stands in for one head ``nn.Linear`` of every member: the members' weights and biases
    stacked by slot, applied to each row with its own slot's in one batched product."""

    def __init__(self, model: FusedModel, weight: str, bias: str | None):
        super().__init__()
        self._model, self.weight, self.bias = (model,), weight, bias  # a tuple: no submodule

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        model = self._model[0]
        rows, stacks = model.rows, model.stacks
        weight = stacks[self.weight].to(x.dtype)  # (K, out, in)
        middle = x.shape[1:-1]
        blocks = rows.by_slot(x.reshape(x.shape[0], -1, x.shape[-1]))  # (K, P, middle, in)
        blocks = blocks.view(rows.capacity, -1, x.shape[-1])
        if self.bias is None:
            y = torch.bmm(blocks, weight.transpose(1, 2))
        else:
            bias = stacks[self.bias].to(x.dtype).unsqueeze(1)
            y = torch.baddbmm(bias, blocks, weight.transpose(1, 2))
        y = y.view(rows.capacity, rows.per_slot, *middle, -1)
        return rows.by_row(y)


class FusedModel:
    """The forward pass of a fused pack's members (one per slot, None for an empty one) from
    their trainable tensors stacked by slot (``stacks``, :func:`trainable_tensors`' names)."""

    def __init__(
        self,
        backbone: PackedBackbone,
        members: Sequence[PromptedModel | None],
        stacks: dict[str, torch.Tensor],
        bucket: int = 1,
    ):
        seated = [m for m in members if m is not None]
        self.backbone, self.stacks = backbone, stacks
        # the method's stacks under its own parameter names
        self.method_stacks = {
            k.removeprefix("method."): v for k, v in stacks.items() if k.startswith("method.")
        }
        self.first: PromptMethod = seated[0].method  # what every member's method shares
        methods = [None if m is None else m.method for m in members]
        self.device = next(iter(stacks.values())).device
        self.constants = {
            k: v.to(self.device) for k, v in self.first.fused_constants(methods).items()
        }
        self.prompts = [0 if m is None else m.method.config.prompt_positions() for m in members]
        self.prefixes = [0 if m is None else m.method.config.prefix_length() for m in members]
        # prefixes of different lengths: each row's positions as its encoder counts them
        # after its own prefix (not after the longest)
        self.explicit_positions = len({m.method.config.prefix_length() for m in seated}) > 1
        # the argument the backbone takes key/value prefixes under, read here: a compiled
        # pass would trace through its lookup (an lru_cache over the class's signature)
        self.cache_name = cache_argument(backbone.backbone) if any(self.prefixes) else None
        if any(self.prefixes) and self.cache_name is None:
            called = type(backbone.backbone).__name__
            raise ValueError(f"{called} takes no key/value cache for a prefix")
        # prompts padded to a multiple of ``bucket`` positions: a compiled pack's shapes
        # then change less often as members come and go
        self.longest = bucket * -(-max(self.prompts) // bucket)
        self.heads = {p: self._stacked_head(seated[0], p) for p in backbone.head_paths}
        self.head_pooling = seated[0].head_pooling
        self.rows: SlotRows | None = None  # the rows of the pass under way
        self._layouts: dict[int, FusedLayout] = {}

    def _stacked_head(self, model: PromptedModel, path: str) -> nn.Module:
        """A copy of the member's head module at ``path`` whose linear layers read the
        stacks."""
        head = copy.deepcopy(model.backbone.get_submodule(path))
        linears = [(n, m) for n, m in head.named_modules() if isinstance(m, nn.Linear)]
        for name, linear in linears:
            prefix = f"head.{path}" + (f".{name}" if name else "")
            bias = f"{prefix}.bias" if linear.bias is not None else None
            stacked = StackedLinear(self, f"{prefix}.weight", bias)
            if not name:
                return stacked
            parent, _, attr = name.rpartition(".")
            setattr(head.get_submodule(parent) if parent else head, attr, stacked)
        return head

    def layout(self, length: int) -> FusedLayout:
        """The layout of rows whose inputs have ``length`` tokens (built once per length)."""
        if length not in self._layouts:
            layout = FusedLayout.of(self.prompts, length, self.device, self.longest, self.prefixes)
            if self.explicit_positions:
                # as a pack member by member: each slot's encoder positions after its prefix
                positions = [self.backbone.alone_positions(length, p) for p in self.prefixes]
                layout = dataclasses.replace(layout, positions=torch.cat(positions))
            self._layouts[length] = layout
        return self._layouts[length]

    def logits(self, rows: SlotRows, batch: dict) -> torch.Tensor:
        """The head's outputs ``(rows, labels)``, float32, for the fused batch's rows: as
        each row's member computes them alone."""
        ids, input_mask = batch["input_ids"], batch["attention_mask"]
        layout = self.layout(ids.shape[1])
        fused = FusedBatch(
            self.method_stacks,
            self.constants,
            self.first,
            rows,
            ids,
            input_mask,
            self.backbone.backbone.get_input_embeddings(),
            batch.get("features", {}),
            layout.prompts,
            layout.inputs[rows.slot],
        )
        inputs = self._inputs(fused, layout, batch)
        for head in self.heads.values():
            head.train(self.backbone.training and self.backbone.backbone.training)
        layers = None
        if self.first.uses_layer_prompts:
            shown = layout.prompt_mask[rows.slot].bool().unsqueeze(-1)  # a row's own prompt
            layers = functools.partial(self._layer_prompts, fused, shown)
        self.rows = rows
        try:
            with self.backbone.fused_pass(self.heads, layers):
                return self._head_logits(inputs, fused.input_positions, input_mask)
        finally:
            self.rows = None

    def _inputs(self, fused: FusedBatch, layout: FusedLayout, batch: dict) -> dict:
        """The backbone's keyword inputs for the fused batch: every row's prompt, input and
        padding where the layout puts them (and its key/value prefix)."""
        parts = self.first.fused_parts(fused)
        prompts, slot, input_mask = parts.prompts, fused.slot, fused.attention_mask
        if prompts.shape[1] < layout.longest:  # a shorter prompt, or a compiled pack's bucket
            prompts = F.pad(prompts, (0, 0, 0, layout.longest - prompts.shape[1]))
        order = layout.order[slot]
        prompt_mask = layout.prompt_mask[slot].to(input_mask.dtype)
        if parts.prompt_mask is not None:  # rows that attend to fewer of their prompt's
            own = parts.prompt_mask.to(input_mask.dtype)
            prompt_mask = prompt_mask * F.pad(own, (0, layout.longest - own.shape[1]))
        inputs = {
            "inputs_embeds": torch.cat([prompts, parts.embeds], 1).gather(
                1, order.unsqueeze(-1).expand(-1, -1, parts.embeds.shape[-1])
            ),
            "attention_mask": torch.cat([prompt_mask, input_mask], 1).gather(1, order),
        }
        if "token_type_ids" in batch:
            segments = batch["token_type_ids"]
            zeros = segments.new_zeros(prompt_mask.shape)
            inputs["token_type_ids"] = torch.cat([zeros, segments], 1).gather(1, order)
        if layout.prefix_mask.shape[1]:  # every row's prefix, padded after it, masked
            cache = DynamicCache()
            for index, (keys, values) in enumerate(self.first.fused_prefix(fused)):
                cache.update(keys, values, index)
            inputs[self.cache_name] = cache
            prefix_mask = layout.prefix_mask[slot].to(input_mask.dtype)
            inputs["attention_mask"] = torch.cat([prefix_mask, inputs["attention_mask"]], 1)
        if layout.positions is not None:
            inputs["position_ids"] = layout.positions[slot]
        return inputs

    def _layer_prompts(
        self, fused: FusedBatch, shown: torch.Tensor, index: int, hidden: torch.Tensor
    ) -> torch.Tensor:
        """``hidden`` at the input of layer ``index`` with each row's first positions (its
        own prompt's, ``shown``: ``(rows, M, 1)``) replaced by its prompt of that layer, as
        the member's own hook replaces them alone; the rest as it is."""
        prompts = self.first.fused_layer_prompts(fused, index, hidden)
        if prompts is None:
            return hidden
        longest = shown.shape[1]
        rows = prompts.to(hidden.dtype)
        if rows.shape[1] < longest:  # a bucket longer than the longest prompt
            rows = F.pad(rows, (0, 0, 0, longest - rows.shape[1]))
        front = torch.where(shown, rows, hidden[:, :longest])
        return torch.cat([front, hidden[:, longest:]], 1)

    def _head_logits(
        self, inputs: dict, input_positions: torch.Tensor, input_mask: torch.Tensor
    ) -> torch.Tensor:
        model = self.backbone.backbone
        with autocast(self.backbone.precision, input_mask.device):
            if self.backbone.head_style is None:
                return model(**inputs).logits.float()
            # mean: each row pools its own input tokens (where its layout put them)
            hidden = model.base_model(**inputs)[0]
            tokens = hidden.gather(
                1, input_positions.unsqueeze(-1).expand(-1, -1, hidden.shape[-1])
            )
            pooled = input_mean(tokens, input_mask)
            return pooled_logits(model, self.backbone.head_style, pooled).float()


def slot_losses(logits: torch.Tensor, labels: torch.Tensor, rows: SlotRows) -> torch.Tensor:
    """``(K,)``: each slot's loss over its rows, as :func:`~raypeft.modeling.prompted.head_loss`
    gives it alone (cross-entropy; mean squared error for a regression head); 0 for a slot
    without rows."""
    if logits.shape[-1] == 1:
        per_row = F.mse_loss(logits.squeeze(-1), labels.float(), reduction="none")
    else:
        per_row = F.cross_entropy(logits, labels, reduction="none")
    if rows.weights is not None:  # blanks count for nothing (and get no gradient)
        per_row = per_row * rows.weights
    sums = per_row.new_zeros(rows.capacity).index_add(0, rows.slot, per_row)
    return sums * rows.inverse_counts
