"""IPT in a fused pack (:mod:`raypeft.methods.fusing`): every member's prompts at once.

The table strategies (``random``, ``pretrained``) fuse: the members' tables are stacked by
slot (``(K, V, d)``, one trainable row per vocabulary entry each), and each row's prompt is
one lookup in the stack at its slot's rows; a member with a shorter ``L`` masks the rest.
The deep placement's per-layer affine maps are stacked too. The ``encoder`` strategy does not
fuse: its TextCNN, LSTM and MLP encoders (:mod:`raypeft.methods.ipt.text_encoders`) read
each member's own number of tokens through their own modules, and an LSTM's recurrence has no
batched form over members' weights, so such members step one by one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from raypeft.methods.fusing import FusedBatch, FusedInputs
from raypeft.methods.ipt.instance import deep_prompt, first_real_tokens

if TYPE_CHECKING:
    from raypeft.methods.ipt.method import IPT


def fusing_limitation(members: Sequence[IPT]) -> str | None:
    """The encoder strategy steps member by member (see the module's docstring)."""
    if any(m.config.strategy == "encoder" for m in members):
        return "IPT's encoder strategy has no fused form (its encoders run member by member)"
    return None


def fused_constants(members: Sequence[IPT | None]) -> dict:
    """``prompt_length``: each slot's ``L``, ``(K,)`` (0 for an empty slot)."""
    lengths = [0 if m is None else m.config.prompt_length for m in members]
    return {"prompt_length": torch.tensor(lengths)}


def fused_parts(batch: FusedBatch) -> FusedInputs:
    """Each row's prompt: the rows of its slot's table at its first ``L`` real tokens (zeros
    and masked where it has fewer), and its input's word embeddings."""
    embeds = batch.embed(batch.input_ids)
    longest, slot = max(batch.prompts), batch.slot
    ids, valid = first_real_tokens(batch.input_ids, batch.attention_mask, longest)
    positions = torch.arange(longest, device=ids.device)
    valid = valid & (positions < batch.constants["prompt_length"][slot].unsqueeze(1))
    table = batch.stacks["table"]  # (K, V, d)
    k, vocab, d = table.shape
    rows = F.embedding(ids + slot.unsqueeze(1) * vocab, table.view(k * vocab, d))
    prompt = (rows * valid[..., None]).to(embeds.dtype)
    batch.memo["prompt"] = prompt  # what the deep placement's layers rescale
    return FusedInputs(prompt, embeds, valid)


def fused_layer_prompts(batch: FusedBatch, layer: int, hidden: torch.Tensor):
    """Deep placement: each row's input-layer prompt again at ``layer``, on the scale of its
    own input tokens' states there, through its slot's affine map of the layer."""
    if batch.first.config.placement != "deep":
        return None
    slot = batch.slot
    scale = batch.stacks["layer_scale"][:, layer - 1][slot].unsqueeze(1)
    shift = batch.stacks["layer_shift"][:, layer - 1][slot].unsqueeze(1)
    states = batch.input_states(hidden)
    return deep_prompt(batch.memo["prompt"], states, batch.attention_mask, scale, shift)
