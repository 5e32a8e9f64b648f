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
adds zero products, a padded prompt row sits at a masked position, and their gradients are
exactly zero, so AdamW keeps them zero. Fusing covers encoders and methods whose inputs are
a prepended prompt (with DePT's update of the input embeddings), and deep prompts' layer
prompts (each row's own prompt positions replaced at every layer by one ``torch.where``);
other packs step member by member (:func:`fused_refusal` says why).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from raypeft.methods.base import PromptMethod
from raypeft.modeling.backbones import backbone_arguments
from raypeft.modeling.head_pooling import input_mean, pooled_logits
from raypeft.modeling.packed import PackedBackbone, PackShape
from raypeft.modeling.precision import autocast
from raypeft.modeling.prompted import PromptedModel

# The batch keys a fused pass reads (features and targets belong to methods that do not fuse)
FUSED_KEYS = ("input_ids", "attention_mask", "token_type_ids", "labels")


def fused_refusal(backbone: PackedBackbone, models: Sequence[PromptedModel]) -> str | None:
    """Why these members cannot step fused (None: they can)."""
    if backbone.kind != "encoder":
        return f"fused packs run on encoders (this backbone is a {backbone.kind})"
    methods = {type(m.method) for m in models}
    if len(methods) > 1:
        return "its members use different methods"
    method = methods.pop()
    layered = method.uses_layer_prompts and method.fused_layer_prompts is None
    if method.fused_parts is None or layered:
        return f"method {models[0].method.config.name!r} has no fused form"
    for model in models:
        if model.method.config.prefix_length() or model.method.config.feature_specs():
            return f"method {model.method.config.name!r} has no fused form for this config"
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


@dataclass(frozen=True)
class SlotRows:
    """Where a fused batch's rows come from: ``slot`` ``(rows,)`` each row's slot; ``padded``
    ``(rows,)`` its row in the slot-major layout heads compute in (``slot · per_slot`` plus
    its place among its slot's rows); ``inverse_counts`` ``(K,)`` one over each slot's rows
    (1 for a slot without rows)."""

    slot: torch.Tensor
    padded: torch.Tensor
    inverse_counts: torch.Tensor
    per_slot: int
    capacity: int
    # static rows (a compiled pack): every slot has ``per_slot`` rows, those of a slot that
    # does not step (or beyond its batch) are blanks of weight 0; ``real`` says where the
    # stepping members' rows go among them
    weights: torch.Tensor | None = None
    real: torch.Tensor | None = None

    @classmethod
    def of(cls, counts: dict[int, int], capacity: int, device: torch.device) -> SlotRows:
        """The layout of batches of ``counts[slot]`` rows each, concatenated in slot order."""
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
            weights.to(device),
            torch.tensor(real, device=device),
        )

    def spread(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Static rows: the stepping members' rows placed among blanks (zeros) in every
        slot's rows; otherwise ``batch`` as it is."""
        if self.real is None:
            return batch
        rows = self.capacity * self.per_slot
        return {
            k: v.new_zeros((rows, *v.shape[1:])).index_copy(0, self.real, v)
            for k, v in batch.items()
        }


@dataclass(frozen=True)
class FusedLayout:
    """A pack's layout of its members' sequences (:class:`PackedBackbone`'s, for encoders):
    a row is its slot's prompt, its input (``length`` tokens), then zeros up to the longest
    prompt, masked. ``order`` ``(K, M + length)`` takes a row's positions from
    ``[prompt padded to M, input]``; ``prompt_mask`` ``(K, M)`` marks each slot's prompt;
    ``inputs`` ``(K, length)`` where each slot's input lands."""

    order: torch.Tensor
    prompt_mask: torch.Tensor
    inputs: torch.Tensor
    prompts: tuple[int, ...]  # each slot's prompt length (0: an empty slot)

    @classmethod
    def of(
        cls, prompts: Sequence[int], length: int, device: torch.device, longest: int = 0
    ) -> FusedLayout:
        """``longest``: pad prompts to at least this many positions (a compiled pack's
        bucket), else to the longest of ``prompts``."""
        longest = max(longest, *prompts)
        order, mask, inputs = [], [], []
        for m in prompts:
            prompt, pad = list(range(m)), list(range(m, longest))
            order.append(prompt + list(range(longest, longest + length)) + pad)
            mask.append([1] * m + [0] * (longest - m))
            inputs.append(list(range(m, m + length)))
        return cls(
            torch.tensor(order, device=device),
            torch.tensor(mask, device=device),
            torch.tensor(inputs, device=device),
            tuple(prompts),
        )

    @property
    def longest(self) -> int:
        """The prompt positions every row has (its prompt and padding)."""
        return self.prompt_mask.shape[1]

    def shape(self, slots: Sequence[int]) -> PackShape:
        """How much of a fused batch whose rows come from ``slots`` is padding."""
        longest, length = self.longest, self.order.shape[1] - self.longest
        rows = len(slots)
        prompts = sum(self.prompts[s] for s in slots)
        padded = rows * longest - prompts
        return PackShape(rows, rows * (longest + length), padded, prompts)


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
        k, out_features, in_features = weight.shape
        middle = x.shape[1:-1]
        flat = x.reshape(x.shape[0], -1)
        padded = flat.new_zeros(k * rows.per_slot, flat.shape[1]).index_copy(0, rows.padded, flat)
        padded = padded.view(k, -1, in_features)
        if self.bias is None:
            y = torch.bmm(padded, weight.transpose(1, 2))
        else:
            bias = stacks[self.bias].to(x.dtype).unsqueeze(1)
            y = torch.baddbmm(bias, padded, weight.transpose(1, 2))
        y = y.reshape(k * rows.per_slot, *middle, out_features)
        return y.index_select(0, rows.padded)


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
        self.method_cls: type[PromptMethod] = type(seated[0].method)
        methods = [None if m is None else m.method for m in members]
        device = next(iter(stacks.values())).device
        self.constants = {
            k: v.to(device) for k, v in self.method_cls.fused_constants(methods).items()
        }
        self.prompts = [0 if m is None else m.method.config.prompt_positions() for m in members]
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
            device = next(iter(self.stacks.values())).device
            self._layouts[length] = FusedLayout.of(self.prompts, length, device, self.longest)
        return self._layouts[length]

    def logits(self, rows: SlotRows, batch: dict) -> torch.Tensor:
        """The head's outputs ``(rows, labels)``, float32, for the fused batch's rows: as
        each row's member computes them alone."""
        ids, input_mask = batch["input_ids"], batch["attention_mask"]
        layout = self.layout(ids.shape[1])
        embed = self.backbone.backbone.get_input_embeddings()
        prompts, embeds = self.method_cls.fused_parts(
            self.method_stacks, self.constants, rows.slot, ids, embed
        )
        if prompts.shape[1] < layout.longest:  # a bucket longer than the longest prompt
            prompts = F.pad(prompts, (0, 0, 0, layout.longest - prompts.shape[1]))
        order = layout.order[rows.slot]
        prompt_mask = layout.prompt_mask[rows.slot].to(input_mask.dtype)
        inputs = {
            "inputs_embeds": torch.cat([prompts, embeds], 1).gather(
                1, order.unsqueeze(-1).expand(-1, -1, embeds.shape[-1])
            ),
            "attention_mask": torch.cat([prompt_mask, input_mask], 1).gather(1, order),
        }
        if "token_type_ids" in batch:
            segments = batch["token_type_ids"]
            zeros = segments.new_zeros(prompt_mask.shape)
            inputs["token_type_ids"] = torch.cat([zeros, segments], 1).gather(1, order)
        for head in self.heads.values():
            head.train(self.backbone.training and self.backbone.backbone.training)
        layers = None
        if self.method_cls.uses_layer_prompts:
            shown = layout.prompt_mask[rows.slot].bool().unsqueeze(-1)  # a row's own prompt
            layers = functools.partial(self._layer_prompts, rows.slot, shown)
        self.rows = rows
        try:
            with self.backbone.fused_pass(self.heads, layers):
                return self._head_logits(inputs, layout.inputs[rows.slot], input_mask)
        finally:
            self.rows = None

    def _layer_prompts(
        self, slot: torch.Tensor, shown: torch.Tensor, index: int, hidden: torch.Tensor
    ) -> torch.Tensor:
        """``hidden`` at the input of layer ``index`` with each row's first positions (its
        own prompt's, ``shown``: ``(rows, M, 1)``) replaced by its slot's prompt of that
        layer, as the member's own hook replaces them alone; the rest as it is."""
        prompts = self.method_cls.fused_layer_prompts(self.method_stacks, index)
        if prompts is None:
            return hidden
        longest = shown.shape[1]
        rows = prompts.to(hidden.dtype)[slot]
        if rows.shape[1] < longest:  # a bucket longer than the longest prompt
            rows = F.pad(rows, (0, 0, 0, longest - rows.shape[1]))
        front = torch.where(shown, rows, hidden[:, :longest])
        return torch.cat([front, hidden[:, longest:]], 1)

    def _head_logits(
        self, inputs: dict, input_positions: torch.Tensor, input_mask: torch.Tensor
    ) -> torch.Tensor:
        model = self.backbone.backbone
        with autocast(self.backbone.precision, input_mask.device):
            arguments = backbone_arguments(model, inputs)
            if self.backbone.head_style is None:
                return model(**arguments).logits.float()
            # mean: each row pools its own input tokens (where its layout put them)
            hidden = model.base_model(**arguments)[0]
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
