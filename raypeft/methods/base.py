"""What every prompt method provides, and the registry methods add themselves to.

A method is one module: a pydantic config (its knobs, learning rates and closed-form count)
and an ``nn.Module`` that turns a batch into the backbone's keyword inputs. Shared code looks
methods up by name in :data:`METHODS`; it never branches on a method's name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from pydantic import BaseModel, ConfigDict
from torch import nn


@dataclass(frozen=True)
class BackboneDims:
    """The backbone facts a method needs: hidden size ``d``, layers ``N``, vocab ``V``, ``s``."""

    hidden_size: int
    num_layers: int
    vocab_size: int
    max_length: int


class MethodConfig(BaseModel):
    """Base of every method's config. Subclasses set ``name: Literal["..."]``."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    name: str

    def resolve(self, dims: BackboneDims) -> MethodConfig:
        """Return a copy with derived knobs filled in (e.g. DePT's rank from its budget)."""
        return self

    def learning_rates(self) -> dict[str, float]:
        """Learning rate of each named parameter group of the method."""
        raise NotImplementedError

    def num_params(self, dims: BackboneDims) -> int:
        """Closed-form trainable-parameter count (see :mod:`raypeft.budget`)."""
        raise NotImplementedError

    def derived(self) -> dict[str, Any]:
        """Knobs computed by :meth:`resolve` rather than chosen (logged as params)."""
        return {}


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
    ) -> dict[str, torch.Tensor]:
        """Keyword arguments for the backbone's forward (``inputs_embeds``, masks...)."""
        raise NotImplementedError

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
    """Prepend a ``(l, d)`` prompt to every sequence; extend the masks with ones/zeros."""
    batch, length = inputs_embeds.shape[0], prompt.shape[0]
    out = {
        "inputs_embeds": torch.cat([prompt.unsqueeze(0).expand(batch, -1, -1), inputs_embeds], 1),
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
