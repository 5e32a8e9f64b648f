"""The arithmetic of IPT's instance prompts, shared by its module
(:mod:`raypeft.methods.ipt.method`) and its fused form (:mod:`raypeft.methods.ipt.fused`)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def read_count(utilisation: float, length: int | torch.Tensor):
    """``ceil(ρ·n)``, at least 1; the tiny offset keeps e.g. ``0.3·10`` at 3, not 4."""
    if isinstance(length, torch.Tensor):
        return torch.ceil(length.double() * utilisation - 1e-9).long().clamp(min=1)
    return max(1, math.ceil(length * utilisation - 1e-9))


def first_real_tokens(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, count: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Ids of each row's first ``count`` real tokens and their validity, ``(b, count)`` each;
    rows with fewer real tokens are padded with id 0 / False. Works for left and right padding."""
    # a stable sort on "is padding" moves real tokens to the front, in their order
    order = torch.argsort((attention_mask == 0).to(torch.int8), dim=1, stable=True)
    ids = torch.gather(input_ids, 1, order)[:, :count]
    valid = torch.gather(attention_mask, 1, order)[:, :count].bool()
    if ids.shape[1] < count:
        ids = F.pad(ids, (0, count - ids.shape[1]))
        valid = F.pad(valid, (0, count - valid.shape[1]))
    return ids * valid, valid


def deep_prompt(
    prompt: torch.Tensor,
    states: torch.Tensor,
    mask: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
) -> torch.Tensor:
    """The deep placement's prompt at a layer: ``prompt`` ``(b, L, d)`` (the input layer's)
    with each vector rescaled to unit RMS, through the layer's affine map (``scale``,
    ``shift``), on the RMS of the layer's hidden ``states`` ``(b, n, d)`` over each input's
    real tokens (``mask``)."""
    # RMS of the layer's hidden states over each input's real tokens (a scale, no gradient)
    rest = states.detach().float()
    mask = mask.to(rest.dtype)
    rms = (rest.pow(2).mean(-1) * mask).sum(1) / mask.sum(1).clamp(min=1)
    # clamp before the root: a padded slot's row is all zeros, and sqrt's gradient at 0 is
    # infinite (times the clamp's zero it gave the table NaN gradients)
    unit = prompt / prompt.pow(2).mean(-1, keepdim=True).clamp(min=1e-12).sqrt()
    out = unit * scale + shift
    return out * rms.sqrt()[:, None, None].to(out.dtype)
