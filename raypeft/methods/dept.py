"""DePT (Shi & Lipani, ICLR 2024): a shorter soft prompt plus a low-rank update of the input
word embeddings, ``W' = W + A·B`` with ``A ∈ R^{s×r}``, ``B ∈ R^{r×d}``.

The offset is per input position, so inputs must be padded to exactly ``s`` tokens. Unlike the
official code, the update is applied for every head type (classification included).

How ``A`` starts and how the offset is scaled (``lowrank_init``):

- ``official`` (DePT's code, ``peft/tuners/prompt_tuning_lora.py``): ``A`` drawn by
  ``kaiming_uniform_(A, a=√5)`` on its ``(s, r)`` tensor, i.e. ``U(±1/√r)`` (fan-in ``r``),
  ``B = 0``, and the offset ``(lora_alpha/√r)·A·B`` with ``lora_alpha = 8``. The paper's α2
  grid was tuned with this scale.
- ``paper``: ``A ~ N(0, 1/r)``, ``B = 0``, offset ``A·B`` unscaled (the paper's text says
  only "A random, B zero").

Either way ``B = 0``, so training starts exactly at PT.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import torch
from pydantic import Field, model_validator
from torch import nn

from raypeft.methods.base import (
    BackboneDims,
    BudgetOption,
    FigureHints,
    MethodConfig,
    PromptMethod,
    no_peft_equivalent,
    prepend_prompt,
    register_method,
)
from raypeft.methods.fusing import FusedBatch, FusedInputs
from raypeft.methods.prompt_init import InitText, PromptInit, init_prompt
from raypeft.methods.sizing import soft_prompt_params

# DePT's code scales the offset by lora_alpha/√r with its config's default lora_alpha, 8
# (train.py never sets it)
OFFICIAL_LORA_ALPHA = 8


def dept_params(prompt_length: int, rank: int, max_length: int, hidden_size: int) -> int:
    """DePT: soft prompt ``m·d`` plus ``A ∈ R^{s×r}``, ``B ∈ R^{r×d}``: ``m·d + (s+d)·r``."""
    return soft_prompt_params(prompt_length, hidden_size) + (max_length + hidden_size) * rank


def dept_rank_for_params(budget: int, prompt_length: int, max_length: int, hidden_size: int) -> int:
    """Largest rank ``r`` with ``m·d + (s+d)·r <= budget`` (may be < 1: does not fit)."""
    return (budget - prompt_length * hidden_size) // (max_length + hidden_size)


class DePTConfig(MethodConfig):
    """Decomposed prompt: ``m`` prompt tokens and rank-``r`` embedding offset.

    Give ``rank`` or ``budget_prompt_length``; with a budget, ``r`` is derived as the largest
    rank whose count ``m·d + (s+d)·r`` stays within PT's ``l·d`` (a resolved config records
    it in ``rank`` too, and resolving checks the two agree).
    """

    name: Literal["dept"] = "dept"
    # the report's α1 × α2 heat map per m, and the score vs (m, r) at a fixed budget
    figure_hints: ClassVar[FigureHints | None] = FigureHints(
        label="DePT",
        learning_rates=("lr_prompt", "lr_lowrank"),
        lr_symbols=("α1", "α2"),
        length="prompt_length",
        length_symbol="m",
        rank="rank",
        rank_symbol="r",
        budget_length="budget_prompt_length",
    )
    prompt_length: int = Field(40, ge=1, description="m: number of soft-prompt tokens")
    rank: int | None = Field(None, ge=1, description="r: rank of A·B (derived when budgeted)")
    budget_prompt_length: int | None = Field(
        None, ge=2, description="l: match the trainable parameters of PT with this length"
    )
    lr_prompt: float = Field(0.3, gt=0, description="α1: learning rate of the soft prompt")
    lr_lowrank: float = Field(1e-4, gt=0, description="α2: learning rate of A and B")
    lowrank_init: Literal["official", "paper"] = Field(
        "official",
        description="official (DePT's code): A ~ U(±1/√r), offset scaled by 8/√r; "
        "paper: A ~ N(0, 1/r), offset unscaled. B = 0 either way",
    )
    init: PromptInit = Field(
        "vocab",
        description="the soft prompt's start: vocab (rows of the backbone's most frequent "
        "real tokens), text (init_text's token rows, repeated to length), normal (random) or "
        "vocab_uniform (any row of the upper 90% of the table: the earlier rule, for ablations)",
    )
    init_text: InitText = Field(
        None, validate_default=True, description="init: text: the text the prompt starts from"
    )
    init_seed: int = 0

    @model_validator(mode="after")
    def _rank_or_budget(self) -> DePTConfig:
        if self.rank is None and self.budget_prompt_length is None and self.budget_params is None:
            raise ValueError(
                "one of `rank`, `budget_prompt_length` and `budget_params` must be set"
            )
        if self.budget_prompt_length is not None and self.budget_params is not None:
            raise ValueError(
                "set `budget_prompt_length` (a PT length) or `budget_params` (a count), not both"
            )
        if (
            self.budget_prompt_length is not None
            and self.prompt_length >= self.budget_prompt_length
        ):
            raise ValueError(
                "`prompt_length < budget_prompt_length` must hold, but got "
                f"(prompt_length={self.prompt_length}, "
                f"budget_prompt_length={self.budget_prompt_length})"
            )
        return self

    @classmethod
    def examples(cls) -> dict[str, DePTConfig]:
        return {
            "rank": cls(prompt_length=4, rank=2, lr_prompt=0.05, lr_lowrank=0.01),
            "budget": cls(prompt_length=4, budget_params=400, lr_prompt=0.05, lr_lowrank=0.01),
        }

    def budget(self, dims: BackboneDims) -> int | None:
        """The trainable-parameter budget, if one is set (``l·d`` for a PT length)."""
        if self.budget_prompt_length is not None:
            return soft_prompt_params(self.budget_prompt_length, dims.hidden_size)
        return self.budget_params

    def resolve(self, dims: BackboneDims) -> DePTConfig:
        budget = self.budget(dims)
        if budget is None:
            return self
        r = dept_rank_for_params(budget, self.prompt_length, dims.max_length, dims.hidden_size)
        what = (
            f"PT with l={self.budget_prompt_length}"
            if self.budget_prompt_length is not None
            else f"budget_params={budget}"
        )
        if r < 1:
            raise ValueError(
                f"the budget of {what} leaves rank r={r} for "
                f"m={self.prompt_length} (d={dims.hidden_size}, s={dims.max_length}); "
                "`r >= 1` must hold: lower prompt_length or raise budget_prompt_length"
            )
        if self.rank is not None and self.rank != r:
            # a resolved config records the derived rank; a different one is a contradiction
            raise ValueError(
                f"rank={self.rank} contradicts the budget of {what}, which gives r={r} for "
                f"m={self.prompt_length} (d={dims.hidden_size}, s={dims.max_length}); "
                "set rank or a budget, not both"
            )
        return self.model_copy(update={"rank": r})

    def learning_rates(self) -> dict[str, float]:
        return {"prompt": self.lr_prompt, "lowrank": self.lr_lowrank}

    def num_params(self, dims: BackboneDims) -> int:
        rank = self.resolve(dims).rank
        return dept_params(self.prompt_length, rank, dims.max_length, dims.hidden_size)

    def derived(self) -> dict[str, Any]:
        budgeted = self.budget_prompt_length is not None or self.budget_params is not None
        return {"rank": self.rank} if budgeted else {}

    def prompt_positions(self) -> int:
        return self.prompt_length

    def budget_options(self, budget: int, dims: BackboneDims) -> list[BudgetOption]:
        """Every ``m`` (multiples of a tenth of PT's length at this budget, and this config's
        own ``m``) with its derived ``r``, by ``m``."""
        d, s = dims.hidden_size, dims.max_length
        pt_length = budget // d
        step = max(1, pt_length // 10)
        lengths = sorted({self.prompt_length, *range(step, pt_length, step)})
        options = []
        for m in lengths:
            r = dept_rank_for_params(budget, m, s, d)
            if r >= 1:
                params = dept_params(m, r, s, d)
                options.append(
                    BudgetOption(self.name, {"prompt_length": m, "rank": r}, params, budget)
                )
        return options

    def budget_length(self) -> int | None:
        return self.budget_prompt_length

    def budget_options_at(
        self, budget: int, dims: BackboneDims, prompt_lengths: list[int]
    ) -> list[BudgetOption]:
        """Each given ``m`` with its derived ``r``; an ``m`` leaving no rank is left out."""
        if max(prompt_lengths) * dims.hidden_size >= budget:
            raise ValueError(
                f"every DePT m must leave room for a rank (m·d < {budget:,}), "
                f"got m={max(prompt_lengths)}"
            )
        options = []
        for m in prompt_lengths:
            fits = self.model_copy(update={"prompt_length": m}).budget_options(budget, dims)
            options.extend(o for o in fits if o.settings["prompt_length"] == m)
        return options

    def peft_type(self) -> str:
        why = "its low-rank update of the input embeddings"
        raise ValueError(no_peft_equivalent(self.name, why))


@register_method
class DePT(PromptMethod):
    config_cls = DePTConfig

    def __init__(
        self,
        config: DePTConfig,
        dims: BackboneDims,
        word_embeddings: nn.Embedding,
        tokenizer: Any | None = None,
    ):
        super().__init__(config, dims, word_embeddings, tokenizer)
        config = config.resolve(dims)
        r, s, d = config.rank, dims.max_length, dims.hidden_size
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
        self.lora_a = nn.Parameter(lowrank_a(s, r, config.lowrank_init, config.init_seed + 1))
        self.lora_b = nn.Parameter(torch.zeros(r, d))  # zero B: training starts exactly at PT
        # what A·B is multiplied by (a plain float: checkpoints hold A and B only)
        self.scaling = (
            OFFICIAL_LORA_ALPHA / math.sqrt(r) if config.lowrank_init == "official" else 1.0
        )

    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        return {"prompt": [self.prompt], "lowrank": [self.lora_a, self.lora_b]}

    def prepare_inputs(self, input_ids, attention_mask, token_type_ids, embed, features=None):
        if input_ids.shape[1] != self.dims.max_length:
            raise ValueError(
                f"DePT needs inputs padded to exactly s={self.dims.max_length} tokens, "
                f"got {input_ids.shape[1]}"
            )
        inputs_embeds = embed(input_ids)
        offset = self.offset().to(inputs_embeds.dtype)
        prompt = self.prompt.to(inputs_embeds.dtype)
        return prepend_prompt(prompt, inputs_embeds + offset, attention_mask, token_type_ids)

    @staticmethod
    def fused_constants(members: Sequence[PromptMethod | None]) -> dict:
        """``scaling``: each slot's multiplier of ``A·B``, ``(K, 1, 1)`` (0 for an empty slot)."""
        scaling = [0.0 if m is None else m.scaling for m in members]
        return {"scaling": torch.tensor(scaling).reshape(-1, 1, 1)}

    @staticmethod
    def fused_parts(batch: FusedBatch) -> FusedInputs:
        """Each row's prompt and its input's word embeddings plus its slot's low-rank update:
        the ``(K, s, d)`` updates of every slot in one batched product (a rank zero-padded to
        the largest adds exact zeros)."""
        stacks, input_ids = batch.stacks, batch.input_ids
        inputs_embeds = batch.embed(input_ids)
        if input_ids.shape[1] != stacks["lora_a"].shape[1]:
            raise ValueError(
                f"DePT needs inputs padded to exactly s={stacks['lora_a'].shape[1]} tokens, "
                f"got {input_ids.shape[1]}"
            )
        lowrank = torch.bmm(stacks["lora_a"], stacks["lora_b"])
        offsets = (batch.constants["scaling"] * lowrank).to(inputs_embeds.dtype)
        prompts = stacks["prompt"].to(inputs_embeds.dtype)
        return FusedInputs(prompts[batch.slot], inputs_embeds + offsets[batch.slot])

    def offset(self) -> torch.Tensor:
        """The ``(s, d)`` update of the input word embeddings, one row per position."""
        return self.scaling * (self.lora_a @ self.lora_b)


def lowrank_a(max_length: int, rank: int, how: str, seed: int) -> torch.Tensor:
    """``A ∈ R^{s×r}`` at its start: ``official`` as DePT's code draws it
    (``kaiming_uniform_(A, a=√5)``: ``U(±1/√r)``, the fan-in of an ``(s, r)`` tensor being
    ``r``), ``paper`` Gaussian ``N(0, 1/r)``."""
    gen = torch.Generator().manual_seed(seed)
    if how == "official":
        return nn.init.kaiming_uniform_(
            torch.empty(max_length, rank), a=math.sqrt(5), generator=gen
        )
    return torch.randn(max_length, rank, generator=gen) / math.sqrt(rank)
