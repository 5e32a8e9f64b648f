"""Deep prompts (P-tuning v2 / prefix tuning): a trainable prompt at every transformer layer.

Two styles (IDPG §3.2.2 and A.1.2 count both):

- ``hidden``: ``t`` prompt positions are prepended at the input, and their hidden states are
  replaced at the input of every later layer by that layer's trainable vectors: ``t·N·d``.
- ``kv``: trainable key and value prefixes per layer (Li & Liang), handed to the backbone as
  ``past_key_values``; the input sequence itself is unchanged: ``2·t·N·d`` (``d`` is the
  width of one layer's keys: smaller than the hidden size with grouped-query attention).

Seq2seq backbones take the ``hidden`` style on their encoder; their encoder's attention
reads no ``past_key_values``, so the ``kv`` style needs an encoder or decoder backbone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import torch
from pydantic import Field
from torch import nn
from transformers import DynamicCache

from raypeft.methods.base import (
    PREFIX_CACHE,
    BackboneDims,
    BudgetOption,
    MethodConfig,
    PeftAdapter,
    PromptMethod,
    prepend_prompt,
    register_method,
)
from raypeft.methods.fusing import FusedBatch, FusedInputs
from raypeft.methods.prompt_init import init_prompt


def deep_prompt_params(
    prompt_length: int, num_layers: int, hidden_size: int, style: str, kv_size: int | None = None
) -> int:
    """Deep prompts: ``t·N·d`` (hidden states) or ``2·t·N·d_kv`` (key/value prefixes).

    ``d_kv`` is one layer's key width (``d`` unless grouped-query attention shrinks it).
    """
    if style == "hidden":
        return prompt_length * num_layers * hidden_size
    return 2 * prompt_length * num_layers * (kv_size or hidden_size)


class DeepPromptConfig(MethodConfig):
    """A prompt of ``t`` vectors at every layer; with ``budget_params``, ``t`` is derived."""

    name: Literal["prefix"] = "prefix"
    peft_export_note: ClassVar[str | None] = "with style: kv (PREFIX_TUNING)"
    style: Literal["hidden", "kv"] = Field(
        "hidden", description="hidden: replace t hidden states per layer; kv: key/value prefixes"
    )
    prompt_length: int = Field(10, ge=1, description="t: prompt vectors per layer")
    lr: float = Field(5e-3, gt=0, description="learning rate of the prompts")
    init: Literal["vocab", "normal"] = Field(
        "vocab", description="hidden style: vocabulary rows or random; kv: always random"
    )
    init_seed: int = 0

    @classmethod
    def examples(cls) -> dict[str, DeepPromptConfig]:
        return {style: cls(style=style, prompt_length=3, lr=0.01) for style in ("hidden", "kv")}

    def per_token(self, dims: BackboneDims) -> int:
        """Parameters one prompt position costs over all layers."""
        return deep_prompt_params(1, dims.num_layers, dims.hidden_size, self.style, dims.kv_size)

    def resolve(self, dims: BackboneDims) -> DeepPromptConfig:
        if self.budget_params is None:
            return self
        length = self.budget_params // self.per_token(dims)
        if length < 1:
            raise ValueError(
                f"budget_params={self.budget_params} is below one {self.style} prompt position "
                f"over {dims.num_layers} layers ({self.per_token(dims)} parameters)"
            )
        return self.model_copy(update={"prompt_length": length})

    def learning_rates(self) -> dict[str, float]:
        return {"prompt": self.lr}

    def num_params(self, dims: BackboneDims) -> int:
        length = self.resolve(dims).prompt_length
        return deep_prompt_params(
            length, dims.num_layers, dims.hidden_size, self.style, dims.kv_size
        )

    def derived(self) -> dict[str, Any]:
        return {"prompt_length": self.prompt_length} if self.budget_params is not None else {}

    def prompt_positions(self) -> int:
        return 0 if self.style == "kv" else self.prompt_length  # kv: keys only, no positions

    def prefix_length(self) -> int:
        return self.prompt_length if self.style == "kv" else 0

    def check_backbone(self, dims: BackboneDims) -> None:
        if self.style == "kv" and dims.kind == "seq2seq":
            raise ValueError(
                "method.style: kv prefixes need an encoder or decoder backbone (a seq2seq "
                "encoder reads no past_key_values); use style: hidden"
            )

    def budget_options(self, budget: int, dims: BackboneDims) -> list[BudgetOption]:
        """The longest prompt that fits, in this config's style first, then the other style."""
        options = []
        for style in dict.fromkeys([self.style, "hidden", "kv"]):
            styled = self.model_copy(update={"style": style})
            length = budget // styled.per_token(dims)
            if length >= 1 and not (style == "kv" and dims.kind == "seq2seq"):
                settings = {"style": style, "prompt_length": length}
                params = length * styled.per_token(dims)
                options.append(BudgetOption(self.name, settings, params, budget))
        return options

    def peft_type(self) -> str:
        if self.style == "kv":
            return "PREFIX_TUNING"
        raise ValueError(
            "method prefix with style: hidden has no peft equivalent (it replaces hidden "
            "states at every layer; peft's PREFIX_TUNING and P_TUNING do not); only "
            "style: kv maps onto peft's PREFIX_TUNING"
        )


@register_method
class DeepPrompt(PromptMethod):
    config_cls = DeepPromptConfig
    uses_layer_prompts = True

    def __init__(
        self,
        config: DeepPromptConfig,
        dims: BackboneDims,
        word_embeddings: nn.Embedding,
        tokenizer: Any | None = None,
    ):
        super().__init__(config, dims, word_embeddings, tokenizer)
        config = config.resolve(dims)
        self.style = config.style
        t, layers = config.prompt_length, dims.num_layers
        if config.style == "hidden":
            # one (t, d) prompt per layer; layer 0's is prepended to the input embeddings
            prompts = [
                init_prompt(
                    t, word_embeddings, config.init, config.init_seed + i, tokenizer=tokenizer
                )
                for i in range(layers)
            ]
            self.prompts = nn.Parameter(torch.stack(prompts))  # (N, t, d)
        else:
            # keys and values per layer, head-shaped as the attention caches them
            heads = dims.kv_heads or dims.num_heads
            gen = torch.Generator().manual_seed(config.init_seed)
            std = word_embeddings.weight.detach().float().std().item()
            shape = (layers, 2, heads, t, dims.head_dim)
            self.prompts = nn.Parameter(torch.randn(shape, generator=gen) * std)

    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        return {"prompt": [self.prompts]}

    def prepare_inputs(self, input_ids, attention_mask, token_type_ids, embed, features=None):
        inputs_embeds = embed(input_ids)
        if self.style == "hidden":
            return prepend_prompt(self.prompts[0], inputs_embeds, attention_mask, token_type_ids)
        batch, t = input_ids.shape[0], self.prompts.shape[3]
        cache = DynamicCache()
        for layer, (keys, values) in enumerate(self.prompts.to(inputs_embeds.dtype)):
            shape = (batch, *keys.shape)
            cache.update(keys.unsqueeze(0).expand(shape), values.unsqueeze(0).expand(shape), layer)
        out = {
            "inputs_embeds": inputs_embeds,
            # the prefix positions are attended to by every token
            "attention_mask": torch.cat([attention_mask.new_ones(batch, t), attention_mask], 1),
            PREFIX_CACHE: cache,
        }
        if token_type_ids is not None:
            out["token_type_ids"] = token_type_ids
        return out

    @staticmethod
    def fused_constants(members: Sequence[PromptMethod | None]) -> dict:
        return {}

    @staticmethod
    def fused_parts(batch: FusedBatch) -> FusedInputs:
        """Each row's layer-0 prompt (its slot's; the key/value style prepends none) and its
        input's embeddings."""
        inputs_embeds = batch.embed(batch.input_ids)
        if batch.first.style == "kv":
            rows, d = inputs_embeds.shape[0], inputs_embeds.shape[2]
            return FusedInputs(inputs_embeds.new_zeros(rows, 0, d), inputs_embeds)
        prompts = batch.stacks["prompts"][:, 0].to(inputs_embeds.dtype)[batch.slot]
        return FusedInputs(prompts, inputs_embeds)

    @staticmethod
    def fused_layer_prompts(batch: FusedBatch, layer: int, hidden: torch.Tensor):
        """Hidden style: each row's prompt at the input of ``layer`` (its slot's)."""
        if batch.first.style == "kv":
            return None  # the key/value prefixes are in every layer's cache
        return batch.stacks["prompts"][:, layer].to(hidden.dtype)[batch.slot]

    @staticmethod
    def fused_prefix(batch: FusedBatch) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Key/value style: every layer's keys and values of each row (its slot's prefix,
        zero-padded after it to the longest), gathered from the stack at once."""
        dtype = batch.embed.weight.dtype
        per_row = batch.stacks["prompts"].to(dtype)[batch.slot]  # (rows, N, 2, heads, P, hd)
        return [(layer[:, 0], layer[:, 1]) for layer in per_row.unbind(1)]

    def layer_prompt(self, layer: int, hidden_states: torch.Tensor) -> torch.Tensor | None:
        if self.style != "hidden":
            return None  # the key/value prefixes are already in every layer's cache
        return self.prompts[layer].unsqueeze(0)

    def peft_adapter(self) -> PeftAdapter:
        """kv style: peft's ``PREFIX_TUNING`` without projection. peft's prefix embedding row
        ``i`` holds token ``i``'s keys and values of every layer, laid out ``(layer,
        key|value, head, head_dim)``; this method's tensor is ``(layer, key|value, head,
        token, head_dim)``, a transpose of the same numbers."""
        self.config.peft_type()  # the hidden style has no peft equivalent: ValueError
        prompts = self.prompts.detach().cpu().float()
        t, kv_size = prompts.shape[3], self.dims.kv_size
        rows = prompts.permute(3, 0, 1, 2, 4).reshape(t, -1).contiguous()
        settings = {
            "num_virtual_tokens": t,
            "token_dim": kv_size,  # one layer's key width (grouped-query: kv heads only)
            "num_attention_heads": self.dims.kv_heads or self.dims.num_heads,
            "encoder_hidden_size": kv_size,
            "prefix_projection": False,
        }
        return PeftAdapter(rows, settings, "key/value prefixes")
