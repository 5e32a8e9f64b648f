"""What a method's fused hooks see and give (a fused pack: :mod:`raypeft.modeling.fused`).

A fused pack holds its members' trainable tensors stacked along a leading slot axis
(``(K, ...)``, each member's zero-padded to the largest) and computes every stepping member's
rows at once. A method that can be computed that way sets the hooks of
:class:`~raypeft.methods.base.PromptMethod` (``fused_parts``, and as it needs
``fused_layer_prompts``, ``fused_prefix``, ``fusing_limitation``); each reads a
:class:`FusedBatch`. This module holds no modeling: the pack's layout comes in as a
:class:`SlotLayout`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import nn


class SlotLayout(Protocol):
    """Where a fused batch's rows come from (:class:`raypeft.modeling.fused.SlotRows`)."""

    slot: torch.Tensor  # (rows,): each row's slot

    def by_slot(self, x: torch.Tensor) -> torch.Tensor:
        """``(rows, ...)`` laid out slot-major, ``(K, per_slot, ...)`` (zeros where a slot
        has fewer rows): a product with each slot's own stack is then one batched product."""

    def by_row(self, y: torch.Tensor) -> torch.Tensor:
        """The inverse of :meth:`by_slot`: ``(K, per_slot, ...)`` back to ``(rows, ...)``."""


@dataclass
class FusedBatch:
    """A fused batch as a method's fused hooks see it: every stepping member's rows, each to
    be computed with its own slot's tensors."""

    stacks: dict[str, torch.Tensor]  # the method's trainable tensors by name, (K, ...)
    constants: dict[str, torch.Tensor]  # what ``fused_constants`` made, (K, ...)
    # a seated member (a PromptMethod: typed as its base class, since base.py imports this
    # module for its hooks' signatures): what all members share (``fusing_limitation``
    # checked it), e.g. the structure of IDPG's generator, its activation, the backbone's dims
    first: nn.Module
    rows: SlotLayout
    input_ids: torch.Tensor  # (rows, L)
    attention_mask: torch.Tensor  # (rows, L)
    embed: nn.Embedding
    features: dict[str, torch.Tensor]  # the rows' per-example features (IDPG's M(x))
    prompts: Sequence[int]  # each slot's prompt positions (0: an empty slot)
    # (rows, L): where each row's input tokens sit in the fused sequence (after its prompt)
    input_positions: torch.Tensor | None = None
    # what the input layer's preparation leaves for the layer hooks of the same pass
    memo: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def slot(self) -> torch.Tensor:
        """``(rows,)``: each row's slot."""
        return self.rows.slot

    def input_states(self, hidden: torch.Tensor) -> torch.Tensor:
        """``(rows, L, d)``: the hidden states at each row's input tokens (its sequence after
        its own prompt, as a member's layer hook reads them alone)."""
        index = self.input_positions.unsqueeze(-1).expand(-1, -1, hidden.shape[-1])
        return hidden.gather(1, index)


@dataclass(frozen=True)
class FusedInputs:
    """What a method's ``fused_parts`` gives: each row's prompt ``(rows, M, d)`` (its slot's,
    zero-padded to the longest), the rows' input embeddings ``(rows, L, d)``, and optionally
    which prompt positions a row attends to ``(rows, M)`` (IPT's rows shorter than its
    prompt; None: all of its slot's)."""

    prompts: torch.Tensor
    embeds: torch.Tensor
    prompt_mask: torch.Tensor | None = None


def slot_linear(
    stacks: dict[str, torch.Tensor], name: str, x: torch.Tensor, bias: bool = True
) -> torch.Tensor:
    """Every slot's ``nn.Linear`` named ``name`` (``{name}.weight`` ``(K, out, in)``, and
    ``{name}.bias``) on its own rows ``x`` ``(K, P, in)``: one batched product."""
    weight = stacks[f"{name}.weight"].to(x.dtype).transpose(1, 2)
    if not bias:
        return torch.bmm(x, weight)
    return torch.baddbmm(stacks[f"{name}.bias"].to(x.dtype).unsqueeze(1), x, weight)


def slot_layer_norm(
    stacks: dict[str, torch.Tensor], name: str, x: torch.Tensor, eps: float
) -> torch.Tensor:
    """Every slot's ``nn.LayerNorm`` named ``name`` over the last axis of its own rows ``x``
    ``(K, ...)``."""
    shape = (x.shape[0], *[1] * (x.dim() - 2), x.shape[-1])
    normed = nn.functional.layer_norm(x, x.shape[-1:], eps=eps)
    weight = stacks[f"{name}.weight"].to(x.dtype).view(shape)
    return normed * weight + stacks[f"{name}.bias"].to(x.dtype).view(shape)
