"""Which token states an encoder's task head reads (``model.head_pooling``).

transformers' sequence-classification heads read one position: BERT's pooler and RoBERTa's
head the first (``[CLS]``, ``<s>``), decoders' heads the last. A prompt method prepends its
prompt, so on an encoder that first position is a prompt slot (peft's prompt tuning does the
same). On a sentence encoder trained to be mean-pooled, such as the packaged
all-MiniLM-L6-v2, the first position carries little of the sentence either way: with 100
prompt slots in front, PT on SST-2 still answered one class after 200 steps, and a linear
probe of a frozen MiniLM without prompts reaches 71% on SST-2 from its pooler output against
82% from its token states' mean (``docs/fidelity.md``).

- ``first``: the head as transformers builds it (what peft's export reproduces);
- ``mean``: the final states averaged over the input's own tokens (prompt slots and padding
  left out), fed to the head's classifier in place of the first position's state, as
  sentence-transformers pools such a model (encoders only);
- ``auto``: ``mean`` for an encoder whose sentence-transformers config declares mean pooling,
  else ``first``.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn
from transformers import PreTrainedModel

from raypeft.errors import ConfigError
from raypeft.methods.base import BackboneDims

HeadPooling = Literal["auto", "first", "mean"]
# How a head takes a pooled vector: BERT-style heads are dropout + a linear classifier (over
# their pooler, which ``mean`` skips); RoBERTa-style heads are a module that reads
# ``features[:, 0]`` and holds its own dense layer, dropout and output projection.
HeadStyle = Literal["linear", "first_token"]


def resolve_head_pooling(setting: str, dims: BackboneDims) -> Literal["first", "mean"]:
    """``first`` or ``mean`` for ``model.head_pooling`` on this backbone; raises ConfigError
    when ``mean`` is asked of a backbone that is not an encoder."""
    if setting == "auto":
        return "mean" if dims.kind == "encoder" and dims.sentence_pooling == "mean" else "first"
    if setting == "mean" and dims.kind != "encoder":
        raise ConfigError(
            f"model.head_pooling: mean averages an encoder's token states for its head; "
            f"{dims.model_name or 'this model'} is a {dims.kind} (use first or auto)"
        )
    return setting  # type: ignore[return-value]


def head_style(model: PreTrainedModel) -> HeadStyle:
    """How ``model``'s classification head takes a pooled vector; raises ConfigError for a
    head ``mean`` cannot feed (one with layers of its own before the classifier that read a
    position, e.g. DistilBERT's ``pre_classifier``)."""
    classifier = getattr(model, "classifier", None)
    if isinstance(classifier, nn.Linear) and isinstance(
        getattr(model, "dropout", None), nn.Dropout
    ):
        if not hasattr(model, "pre_classifier"):
            return "linear"
    if classifier is not None and hasattr(classifier, "out_proj"):
        return "first_token"
    raise ConfigError(
        f"model.head_pooling: mean cannot feed the head of {type(model).__name__} "
        "(BERT- and RoBERTa-style heads only); use first"
    )


def input_mean(hidden: torch.Tensor, input_mask: torch.Tensor) -> torch.Tensor:
    """``(batch, d)``: the mean of ``hidden``'s last ``input_mask.shape[1]`` positions (the
    input's own tokens, after any prompt slots) over the tokens ``input_mask`` marks."""
    tokens = hidden[:, hidden.shape[1] - input_mask.shape[1] :]
    weights = input_mask.to(tokens.dtype).unsqueeze(-1)
    return (tokens * weights).sum(1) / weights.sum(1).clamp(min=1)


def pooled_logits(model: PreTrainedModel, style: HeadStyle, pooled: torch.Tensor) -> torch.Tensor:
    """The head's outputs for a pooled ``(batch, d)`` vector, through the head's own dropout
    and layers."""
    if style == "linear":
        return model.classifier(model.dropout(pooled))
    return model.classifier(pooled.unsqueeze(1))  # the head reads features[:, 0]
