"""IDPG in a fused pack (:mod:`raypeft.methods.fusing`): every member's generator at once.

The members' generator tensors are stacked by slot; a layer's prompts come from each row's
generator input laid out slot-major (``(K, rows per slot, width)``), so each of the
generator's layers is one batched product over the slots (``bmm`` for dense layers, an
``einsum`` over the Kronecker factors for PHM ones), its norms one ``layer_norm`` with
per-slot affine maps. Dense members may differ in ``m`` and ``t``: a zero-padded hidden unit
is ``act(0) = 0`` and meets a zero column of the second layer, a padded prompt position sits
at a masked position. PHM members must have one shape (a padded PHM block would interleave
its zeros with the real rows, while the biases pad at the end), and every member's
generator the same structure (:func:`fusing_limitation`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from raypeft.methods.fusing import FusedBatch, FusedInputs, slot_layer_norm, slot_linear
from raypeft.methods.idpg.sentence_encoders import pool

if TYPE_CHECKING:
    from raypeft.methods.idpg.method import IDPG, IDPGConfig

# what members of one fused pack must share: the generator's structure and its input
SHARED = ("generator", "layers", "encoder", "glove_path", "pooling", "activation", "residual",
          "layer_norm")  # fmt: skip
SHARED_MULTI = ("version", "generator_input")  # M-IDPG's
SHARED_PHM = ("phm_n", "generator_hidden", "prompt_length")  # PHM's shapes


def structure(config: IDPGConfig) -> dict:
    """The knobs of ``config`` that members of one fused pack must agree on."""
    knobs = SHARED + (SHARED_MULTI if config.multi else ())
    shared = {k: getattr(config, k) for k in knobs}
    if config.generator == "phm":
        shared.update({k: getattr(config, k) for k in SHARED_PHM})
        shared["phm_shared_a"] = config.shares_a()
    return shared


def fusing_limitation(members: Sequence[IDPG]) -> str | None:
    """Members whose generators differ in structure (or PHM members in shape) step one by
    one: a stack holds one structure."""
    first = structure(members[0].config)
    for member in members[1:]:
        other = structure(member.config)
        differ = [k for k in first if first[k] != other.get(k)] + sorted(set(other) - set(first))
        if differ:
            return f"its IDPG members' generators differ in {', '.join(differ)}"
    return None


def fused_parts(batch: FusedBatch) -> FusedInputs:
    """Each row's prompt generated from its ``M(x)`` by its slot's generator, and its input's
    word embeddings."""
    embeds = batch.embed(batch.input_ids)
    prompts = generate(batch, 0, batch.features["sentence"])
    return FusedInputs(prompts.to(embeds.dtype), embeds)


def fused_layer_prompts(batch: FusedBatch, layer: int, hidden: torch.Tensor):
    """M-IDPG: each row's prompt of ``layer``, from its ``M(x)`` or its previous layer's
    output pooled over its input tokens (as the member's own hook reads them)."""
    first = batch.first
    if not first.uses_layer_prompts:  # S-IDPG
        return None
    if first.config.generator_input == "previous_layer":
        x = pool(batch.input_states(hidden), batch.attention_mask, first.config.pooling)
    else:
        x = batch.features["sentence"]
    return generate(batch, layer, x)


def generate(batch: FusedBatch, layer: int, x: torch.Tensor) -> torch.Tensor:
    """``(rows, t, d)``: each row's prompt for ``layer`` from its generator input ``x``
    ``(rows, w)``, as :meth:`IDPG.generate` computes it with the row's own generator."""
    first, stacks = batch.first, batch.stacks
    down, up, bias, norm = first.parts_of(layer)
    xs = batch.rows.by_slot(x.to(stacks["prompt_bias"].dtype))  # (K, P, w)
    hidden = first.activation(_linear(stacks, f"down.{down}", xs, bias=True))
    out = _linear(stacks, f"up.{up}", hidden, bias=False)
    out = out + stacks["prompt_bias"][:, bias].to(out.dtype).unsqueeze(1)
    prompt = out.view(*out.shape[:2], -1, first.dims.hidden_size)  # (K, P, t, d)
    config = first.config
    if config.residual:
        if config.layer_norm:  # normalise both parts, then their sum (A.5)
            eps = first.norm_out[0].eps
            summed = slot_layer_norm(stacks, f"norm_gen.{norm}", prompt, eps)
            summed = summed + slot_layer_norm(stacks, f"norm_sentence.{norm}", xs, eps)[:, :, None]
            prompt = slot_layer_norm(stacks, f"norm_out.{norm}", summed, eps)
        else:
            prompt = prompt + xs.unsqueeze(2)
    elif config.layer_norm:
        prompt = slot_layer_norm(stacks, f"norm_out.{norm}", prompt, first.norm_out[0].eps)
    return batch.rows.by_row(prompt)


def _linear(
    stacks: dict[str, torch.Tensor], name: str, x: torch.Tensor, bias: bool
) -> torch.Tensor:
    """Every slot's generator layer ``name`` on its own rows ``x`` ``(K, P, in)``: dense, or
    PHM (``W = Σ_i A_i ⊗ B_i``, contracted with the factors as :class:`PHMLinear` does)."""
    if f"{name}.weight" in stacks:
        return slot_linear(stacks, name, x, bias)
    b = stacks[f"{name}.phm_b"].to(x.dtype)  # (K, n, out/n, in/n)
    a = stacks.get(f"{name}.own_a", stacks.get("phm_a")).to(x.dtype)  # (K, n, n, n)
    k, n, out_block, in_block = b.shape
    xs = x.reshape(k, x.shape[1], n, in_block)
    if in_block <= out_block:  # mix blocks where the vectors are short, as PHMLinear
        mixed = torch.einsum("kipq,kbqs->kbips", a, xs)
        y = torch.einsum("kirs,kbips->kbpr", b, mixed)
    else:
        partial = torch.einsum("kirs,kbqs->kbiqr", b, xs)
        y = torch.einsum("kipq,kbiqr->kbpr", a, partial)
    y = y.reshape(k, x.shape[1], n * out_block)
    return y + stacks[f"{name}.bias"].to(x.dtype).unsqueeze(1) if bias else y
