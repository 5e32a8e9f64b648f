"""Prompt Tuning (Lester et al., 2021): a trainable soft prompt before the input embeddings."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from pydantic import Field
from torch import nn

from raypeft.methods.base import (
    BackboneDims,
    BudgetOption,
    MethodConfig,
    PeftAdapter,
    PromptMethod,
    prepend_prompt,
    register_method,
)
from raypeft.methods.fusing import FusedBatch, FusedInputs
from raypeft.methods.prompt_init import InitText, PromptInit, init_prompt
from raypeft.methods.sizing import soft_prompt_params


class PromptTuningConfig(MethodConfig):
    """Soft prompt ``P ∈ R^{l×d}`` prepended to the word embeddings.

    With ``budget_params``, ``l = floor(budget / d)`` replaces ``prompt_length``.
    """

    name: Literal["pt"] = "pt"
    peft_export_note: ClassVar[str | None] = "(PROMPT_TUNING)"
    prompt_length: int = Field(100, ge=1, description="l: number of soft-prompt tokens")
    lr: float = Field(0.3, gt=0, description="learning rate of the soft prompt")
    init: PromptInit = Field(
        "vocab",
        description="vocab: rows of the backbone's 5,000 most frequent real tokens (Lester et "
        "al.); text: the rows of init_text's tokens, repeated to length; normal: random; "
        "vocab_uniform: any row of the upper 90% of the table (the earlier rule, for ablations)",
    )
    init_text: InitText = Field(
        None, validate_default=True, description="init: text: the text the prompt starts from"
    )
    init_seed: int = Field(0, description="seed of the prompt initialisation")

    @classmethod
    def examples(cls) -> dict[str, PromptTuningConfig]:
        return {
            "vocab": cls(prompt_length=4, lr=0.05),
            "normal": cls(prompt_length=4, init="normal", lr=0.05),
        }

    def resolve(self, dims: BackboneDims) -> PromptTuningConfig:
        if self.budget_params is None:
            return self
        length = self.budget_params // dims.hidden_size
        if length < 1:
            raise ValueError(
                f"budget_params={self.budget_params} is below one prompt token "
                f"(d={dims.hidden_size}); `budget_params >= d` must hold"
            )
        return self.model_copy(update={"prompt_length": length})

    def learning_rates(self) -> dict[str, float]:
        return {"prompt": self.lr}

    def num_params(self, dims: BackboneDims) -> int:
        return soft_prompt_params(self.resolve(dims).prompt_length, dims.hidden_size)

    def derived(self) -> dict[str, Any]:
        return {"prompt_length": self.prompt_length} if self.budget_params is not None else {}

    def prompt_positions(self) -> int:
        return self.prompt_length

    def budget_options(self, budget: int, dims: BackboneDims) -> list[BudgetOption]:
        length = budget // dims.hidden_size
        if length < 1:
            return []
        params = soft_prompt_params(length, dims.hidden_size)
        return [BudgetOption(self.name, {"prompt_length": length}, params, budget)]

    def peft_type(self) -> str:
        return "PROMPT_TUNING"


@register_method
class PromptTuning(PromptMethod):
    config_cls = PromptTuningConfig

    def __init__(
        self,
        config: PromptTuningConfig,
        dims: BackboneDims,
        word_embeddings: nn.Embedding,
        tokenizer: Any | None = None,
    ):
        super().__init__(config, dims, word_embeddings, tokenizer)
        config = config.resolve(dims)
        self.prompt = nn.Parameter(
            init_prompt(
                config.prompt_length,
                word_embeddings,
                config.init,
                config.init_seed,
                tokenizer=tokenizer,
                text=config.init_text,
            )
        )

    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        return {"prompt": [self.prompt]}

    def prepare_inputs(self, input_ids, attention_mask, token_type_ids, embed, features=None):
        inputs_embeds = embed(input_ids)
        prompt = self.prompt.to(inputs_embeds.dtype)
        return prepend_prompt(prompt, inputs_embeds, attention_mask, token_type_ids)

    @staticmethod
    def fused_constants(members: Sequence[PromptMethod | None]) -> dict:
        return {}

    @staticmethod
    def fused_parts(batch: FusedBatch) -> FusedInputs:
        """Each row's soft prompt (its slot's) and its input's word embeddings."""
        inputs_embeds = batch.embed(batch.input_ids)
        prompts = batch.stacks["prompt"].to(inputs_embeds.dtype)[batch.slot]
        return FusedInputs(prompts, inputs_embeds)

    def peft_adapter(self) -> PeftAdapter:
        """peft's ``PROMPT_TUNING`` is this method exactly: the prompt prepended to the word
        embeddings, the attention mask extended with ones (segment ids with zeros)."""
        prompt = self.prompt.detach().cpu().float().contiguous()
        settings = {
            "num_virtual_tokens": prompt.shape[0],
            "token_dim": self.dims.hidden_size,
            "num_attention_heads": self.dims.num_heads,
            "prompt_tuning_init": "RANDOM",
        }
        return PeftAdapter(prompt, settings, "prompt")
