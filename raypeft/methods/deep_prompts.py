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

from typing import Any, Literal

import torch
from pydantic import Field
from torch import nn
from transformers import DynamicCache

from raypeft.methods.base import (
    BackboneDims,
    BudgetOption,
    MethodConfig,
    PromptMethod,
    init_prompt,
    prepend_prompt,
    register_method,
)
from raypeft.methods.counts import deep_prompt_params


class DeepPromptConfig(MethodConfig):
    """A prompt of ``t`` vectors at every layer; with ``budget_params``, ``t`` is derived."""

    name: Literal["prefix"] = "prefix"
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


@register_method
class DeepPrompt(PromptMethod):
    config_cls = DeepPromptConfig
    uses_layer_prompts = True

    def __init__(self, config: DeepPromptConfig, dims: BackboneDims, word_embeddings: nn.Embedding):
        super().__init__(config, dims, word_embeddings)
        config = config.resolve(dims)
        self.style = config.style
        t, layers = config.prompt_length, dims.num_layers
        if config.style == "hidden":
            # one (t, d) prompt per layer; layer 0's is prepended to the input embeddings
            prompts = [
                init_prompt(t, word_embeddings, config.init, config.init_seed + i)
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
            "past_key_values": cache,
        }
        if token_type_ids is not None:
            out["token_type_ids"] = token_type_ids
        return out

    def layer_prompt(self, layer: int, hidden_states: torch.Tensor) -> torch.Tensor | None:
        if self.style != "hidden":
            return None  # the key/value prefixes are already in every layer's cache
        return self.prompts[layer].unsqueeze(0)
