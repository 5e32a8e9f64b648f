"""What every prompt method provides, and the registry methods add themselves to.

A method is one module: a pydantic config (its knobs, learning rates and closed-form count)
and an ``nn.Module`` that turns a batch into the backbone's keyword inputs. Shared code looks
methods up by name in :data:`METHODS`; it never branches on a method's name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

BackboneKind = Literal["encoder", "seq2seq", "decoder"]


@dataclass(frozen=True)
class BackboneDims:
    """The backbone facts a method needs: hidden size ``d``, layers ``N``, vocab ``V``, ``s``.

    ``kind`` says where prompts go: ``encoder`` (BERT/RoBERTa, classification head),
    ``seq2seq`` (T5: prompts on the encoder input, labels as text) or ``decoder``
    (GPT-2/LLaMA, classification head on the last token). ``num_layers`` counts the layers
    prompts can enter (a seq2seq model's encoder layers). ``kv_size`` is the width of one
    layer's keys (``heads_kv · head_dim``; smaller than ``d`` with grouped-query attention).
    """

    hidden_size: int
    num_layers: int
    vocab_size: int
    max_length: int
    kind: BackboneKind = "encoder"
    num_heads: int = 1
    kv_heads: int | None = None
    model_name: str | None = None  # model.name: keys caches tied to the backbone (IPT tables)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def kv_size(self) -> int:
        return (self.kv_heads or self.num_heads) * self.head_dim


class MethodConfig(BaseModel):
    """Base of every method's config. Subclasses set ``name: Literal["..."]``.

    ``budget_params`` (a trainable-parameter budget, task head excluded) makes the method
    derive its size knob in :meth:`resolve`: the largest setting whose count fits the budget
    (PT's ``l``, DePT's ``r``, deep prompts' ``t``, IDPG's generator width, IPT's encoder
    width). :meth:`budget_options` lists the settings that fit, for ``raypeft budget``.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    name: str
    budget_params: int | None = Field(
        None,
        ge=1,
        description="trainable-parameter budget: the method's size knob is derived from it",
    )

    @classmethod
    def examples(cls) -> dict[str, MethodConfig]:
        """Small valid configs, one per variant of the method, by name. The method contract
        tests (tests/contract) run every one on every backbone kind it supports."""
        return {"default": cls()}

    def resolve(self, dims: BackboneDims) -> MethodConfig:
        """Return a copy with derived knobs filled in (e.g. DePT's rank from its budget)."""
        return self

    def learning_rates(self) -> dict[str, float]:
        """Learning rate of each named parameter group of the method."""
        raise NotImplementedError

    def num_params(self, dims: BackboneDims) -> int:
        """Closed-form trainable-parameter count (see :mod:`raypeft.methods.counts`)."""
        raise NotImplementedError

    def derived(self) -> dict[str, Any]:
        """Knobs computed by :meth:`resolve` rather than chosen (logged as params)."""
        return {}

    def feature_specs(self) -> dict[str, FeatureSpec]:
        """Per-example inputs computed once per experiment, before any trial (by name)."""
        return {}

    def check_backbone(self, dims: BackboneDims) -> None:
        """Raise ``ValueError`` (one line) if the method cannot run on this backbone."""

    def budget_options(self, budget: int, dims: BackboneDims) -> list[BudgetOption]:
        """Settings of this method's size knob whose count fits ``budget`` (others as in self).

        :meth:`resolve` with ``budget_params=budget`` picks the option that matches the
        config's fixed knobs (e.g. DePT's ``m``) with the largest size knob.
        """
        raise NotImplementedError

    def warm_up(self, model_cfg: Any) -> None:
        """Build shared artefacts once, on the driver, before trials start (e.g. IPT's
        pretrained prompt table, cached on disk). Most methods need nothing."""


@dataclass(frozen=True)
class BudgetOption:
    """One setting of a method that fits a trainable-parameter budget."""

    method: str
    settings: dict[str, Any]  # the size knobs, e.g. {"prompt_length": 40, "rank": 45}
    params: int
    budget: int

    @property
    def slack(self) -> int:
        """What the setting leaves unused of the budget (>= 0)."""
        return self.budget - self.params


class FeatureSpec(BaseModel):
    """A per-example array that does not depend on trained parameters (IDPG's ``M(x)``).

    ``key`` identifies the computation: trials whose specs share a key share one array,
    computed once on the driver. Subclasses implement :meth:`compute`.
    """

    model_config = ConfigDict(frozen=True)

    @property
    def key(self) -> str:
        return f"{type(self).__name__}:{self.model_dump_json()}"

    def compute(self, texts: list[str], arrays: dict[str, Any], model_cfg: Any) -> Any:
        """A ``(n, width)`` float32 array for one split: its texts and tokenised arrays."""
        raise NotImplementedError


class PromptMethod(nn.Module):
    """A prompt method's trainable tensors and how they enter the frozen backbone."""

    config_cls: ClassVar[type[MethodConfig]]

    def __init__(self, config: MethodConfig, dims: BackboneDims, word_embeddings: nn.Embedding):
        super().__init__()
        self.config = config
        self.dims = dims

    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        """Trainable parameters by group name; names match ``config.learning_rates()``."""
        raise NotImplementedError

    def prepare_inputs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None,
        embed: nn.Embedding,
        features: dict[str, torch.Tensor] | None = None,
    ) -> dict[str, Any]:
        """Keyword arguments for the backbone's forward (``inputs_embeds``, masks...).

        ``features`` holds the per-example tensors the config asked for in
        :meth:`MethodConfig.feature_specs` (e.g. IDPG's cached sentence encodings).
        """
        raise NotImplementedError

    def layer_prompt(self, layer: int, hidden_states: torch.Tensor) -> torch.Tensor | None:
        """Vectors ``(batch or 1, t, d)`` that replace positions ``[0, t)`` at the input of
        transformer layer ``layer`` (1..N-1), or None to leave the layer alone.

        Only called when the class sets ``uses_layer_prompts``; positions ``[0, t)`` hold the
        prompt this method prepended at the input layer. ``hidden_states`` is that layer's
        input, for methods that generate from the previous layer's output.
        """
        return None

    uses_layer_prompts: ClassVar[bool] = False

    def num_trainable(self) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad)


METHODS: dict[str, type[PromptMethod]] = {}


def register_method(method_cls: type[PromptMethod]) -> type[PromptMethod]:
    """Class decorator: make a method available under its config's ``name`` literal."""
    name_field = method_cls.config_cls.model_fields["name"]
    (name,) = name_field.annotation.__args__  # Literal["..."]
    if name in METHODS:
        raise ValueError(f"method {name!r} is registered twice")
    METHODS[name] = method_cls
    return method_cls


def build_method(
    config: MethodConfig, dims: BackboneDims, word_embeddings: nn.Embedding
) -> PromptMethod:
    """Instantiate the registered method for a resolved config."""
    return METHODS[config.name](config, dims, word_embeddings)


def prepend_prompt(
    prompt: torch.Tensor,
    inputs_embeds: torch.Tensor,
    attention_mask: torch.Tensor,
    token_type_ids: torch.Tensor | None,
) -> dict[str, torch.Tensor]:
    """Prepend a prompt to every sequence; extend the masks with ones/zeros.

    ``prompt`` is ``(l, d)`` (one prompt for all, PT) or ``(batch, l, d)`` (one per example,
    IDPG and IPT).
    """
    batch = inputs_embeds.shape[0]
    if prompt.dim() == 2:
        prompt = prompt.unsqueeze(0).expand(batch, -1, -1)
    length = prompt.shape[1]
    out = {
        "inputs_embeds": torch.cat([prompt.to(inputs_embeds.dtype), inputs_embeds], 1),
        "attention_mask": torch.cat([attention_mask.new_ones(batch, length), attention_mask], 1),
    }
    if token_type_ids is not None:
        pad = token_type_ids.new_zeros(batch, length)
        out["token_type_ids"] = torch.cat([pad, token_type_ids], 1)
    return out


def init_prompt(
    length: int, word_embeddings: nn.Embedding, how: Literal["vocab", "normal"], seed: int
) -> torch.Tensor:
    """Initial soft prompt: rows of the vocabulary embedding, or a matching normal draw.

    ``vocab`` samples token ids from the upper 90% of the vocabulary: low ids are mostly
    special and unused tokens whose embeddings never trained (Lester et al. sample from
    frequent tokens; a frequency list is not available for every tokenizer).
    """
    weight = word_embeddings.weight.detach()
    gen = torch.Generator().manual_seed(seed)
    if how == "vocab":
        low = weight.shape[0] // 10
        ids = torch.randint(low, weight.shape[0], (length,), generator=gen)
        return weight[ids].clone().float()
    std = weight.float().std().item()
    return torch.randn(length, weight.shape[1], generator=gen) * std
