"""The frozen backbone's dropout while a method trains (``train.backbone_dropout``).

The seed papers train with the backbone's own dropout on: DePT's code (and Lester et al.'s)
trains T5 with its dropout of 0.1, IDPG RoBERTa with its 0.1. The backbone's weights are
frozen, but its dropout still perturbs every forward pass the prompt is trained through.

- ``config`` (default): training mode reaches the backbone and its task head, so every dropout
  runs at the rate of the backbone's config (hidden states, attention, classifier).
- ``0``: the backbone and its head stay in eval mode while the method trains: no dropout at
  all, and no random numbers drawn for it.
- a rate ``p`` in (0, 1): as ``config``, with every dropout of this model set to ``p``. The
  rate is written on the model's own modules; a cached backbone hands each trial copies with
  modules of their own (:mod:`raypeft.modeling.cache`), so no trial's rate reaches another's.

How transformers (5.x) applies dropout: hidden-state and classifier dropout are ``nn.Dropout``
modules; attention dropout is a probability the attention module passes to its attention
function (eager or SDPA) only while ``self.training``, taken from an ``nn.Dropout``'s ``p``
(BERT, RoBERTa, DistilBERT, GPT-2) or from a float attribute (T5's ``dropout``, LLaMA's
``attention_dropout``). Eval mode switches all of them off; :func:`set_dropout_rate` sets both
kinds. Evaluation, prediction and checkpoints always run in eval mode.
"""

from __future__ import annotations

from torch import nn


def trains_with_dropout(setting: float | str) -> bool:
    """Whether the backbone goes into training mode with the method (``0``: it never does)."""
    return setting != 0


# nn's dropout modules (transformers builds its dropout from these)
_DROPOUT_MODULES = (
    nn.Dropout,
    nn.Dropout1d,
    nn.Dropout2d,
    nn.Dropout3d,
    nn.AlphaDropout,
    nn.FeatureAlphaDropout,
)


def _rate_attributes(module: nn.Module) -> list[str]:
    """The float attributes ``module`` reads a dropout probability from (``dropout``,
    ``attention_dropout``, ``resid_pdrop``...); a dropout module's own ``p`` too."""
    names = [
        key
        for key, value in vars(module).items()
        if isinstance(value, float) and ("dropout" in key or key.endswith("pdrop"))
    ]
    return ["p", *names] if isinstance(module, _DROPOUT_MODULES) else names


def set_dropout_rate(model: nn.Module, rate: float) -> None:
    """Set every dropout probability of ``model`` to ``rate``: the ``p`` of its dropout
    modules, and the float attributes attention modules read theirs from (T5's ``dropout``,
    LLaMA's ``attention_dropout``)."""
    for module in model.modules():
        for name in _rate_attributes(module):
            setattr(module, name, rate)


def dropout_rates(model: nn.Module) -> dict[str, float]:
    """Every dropout probability of ``model`` by ``module.attribute`` (what
    :func:`set_dropout_rate` writes), for checks and tests."""
    return {
        f"{module_name}.{name}": getattr(module, name)
        for module_name, module in model.named_modules()
        for name in _rate_attributes(module)
    }
