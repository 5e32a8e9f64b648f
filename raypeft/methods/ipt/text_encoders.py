"""Small trainable text encoders for IPT: token vectors ``(batch, n', e)`` -> ``k`` prompt
vectors ``(batch, k, d)``.

Three families (IPT's Encoder IPT; the paper's appendix uses TextCNN, LSTM and MLP):

- ``textcnn`` (Kim, 2014): one convolution per kernel size (3, 4, 5) with ``width`` filters,
  ReLU, max-pooling over time, then a linear projection to ``k·d``. The same conv body is the
  pretraining classifier's (:mod:`raypeft.methods.ipt.pretrain`), so it can start from there.
- ``lstm``: ``layers`` stacked (bi-)LSTM layers of ``width`` units; the last layer's final
  states (both directions) are projected to ``k·d``.
- ``mlp``: the token vectors mean-pooled (``e`` inputs) or flattened at a fixed number of
  positions (``positions·e`` inputs), then ``layers`` hidden ReLU layers of ``width`` units and
  a projection to ``k·d``.

Every encoder reads only the first ``lengths[i]`` vectors of row ``i``; positions past that
are ignored (masked), whatever they hold. Each family's closed-form count is a function
below its module; :meth:`EncoderSpec.num_params` dispatches to them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

EncoderKind = Literal["textcnn", "lstm", "mlp"]
KERNEL_SIZES = (3, 4, 5)  # Kim (2014)


class TextCNNBody(nn.Module):
    """Convolutions of several widths over time, ReLU, max-pool: ``(b, n, e)`` -> ``(b, |K|·w)``."""

    def __init__(self, embed_dim: int, width: int, kernel_sizes: tuple[int, ...] = KERNEL_SIZES):
        super().__init__()
        self.kernel_sizes = tuple(kernel_sizes)
        self.convs = nn.ModuleList(nn.Conv1d(embed_dim, width, k) for k in self.kernel_sizes)

    @property
    def out_features(self) -> int:
        return len(self.kernel_sizes) * self.convs[0].out_channels

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        x = zero_past(x, lengths)
        longest = max(self.kernel_sizes)
        if x.shape[1] < longest:  # a sequence shorter than a kernel: zero padding, one window
            x = nn.functional.pad(x, (0, 0, 0, longest - x.shape[1]))
        x = x.transpose(1, 2)  # (b, e, n): channels first for Conv1d
        pooled = []
        for k, conv in zip(self.kernel_sizes, self.convs, strict=True):
            out = torch.relu(conv(x))  # (b, w, n-k+1)
            # window p covers tokens [p, p+k): keep windows inside the real tokens, and at
            # least the first one (zero-padded) when a row has fewer than k tokens
            last = (lengths - k).clamp(min=0)
            valid = torch.arange(out.shape[2], device=x.device)[None, :] <= last[:, None]
            pooled.append(out.masked_fill(~valid[:, None, :], float("-inf")).amax(dim=2))
        return torch.cat(pooled, dim=1)


class PromptEncoder(nn.Module):
    """Base: a body giving ``(b, f)`` features, and a head ``f -> k·d`` reshaped to prompts."""

    def __init__(self, features: int, num_prompts: int, hidden_size: int):
        super().__init__()
        self.num_prompts, self.hidden_size = num_prompts, hidden_size
        self.head = nn.Linear(features, num_prompts * hidden_size)

    def features(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """``x``: ``(b, n', e)`` token vectors; ``lengths``: ``(b,)`` tokens to read (>= 1)."""
        out = self.head(self.features(x, lengths))
        return out.view(x.shape[0], self.num_prompts, self.hidden_size)


class TextCNNEncoder(PromptEncoder):
    def __init__(self, embed_dim: int, width: int, num_prompts: int, hidden_size: int):
        body = TextCNNBody(embed_dim, width)
        super().__init__(body.out_features, num_prompts, hidden_size)
        self.body = body

    def features(self, x, lengths):
        return self.body(x, lengths)


class LSTMEncoder(PromptEncoder):
    def __init__(
        self,
        embed_dim: int,
        width: int,
        num_prompts: int,
        hidden_size: int,
        layers: int = 1,
        bidirectional: bool = True,
    ):
        directions = 2 if bidirectional else 1
        super().__init__(directions * width, num_prompts, hidden_size)
        self.directions = directions
        self.lstm = nn.LSTM(
            embed_dim, width, num_layers=layers, bidirectional=bidirectional, batch_first=True
        )

    def features(self, x, lengths):
        packed = pack_padded_sequence(
            x, lengths.cpu(), batch_first=True, enforce_sorted=False
        )  # the LSTM stops at each row's length: padding never enters its state
        _, (final, _) = self.lstm(packed)  # (layers·D, b, w)
        return torch.cat(list(final[-self.directions :]), dim=1)


class MLPEncoder(PromptEncoder):
    def __init__(
        self,
        embed_dim: int,
        width: int,
        num_prompts: int,
        hidden_size: int,
        layers: int = 1,
        pool: Literal["mean", "flatten"] = "mean",
        positions: int = 1,
    ):
        super().__init__(width, num_prompts, hidden_size)
        self.pool, self.positions = pool, positions
        inputs = embed_dim if pool == "mean" else positions * embed_dim
        blocks: list[nn.Module] = []
        for i in range(layers):
            blocks += [nn.Linear(inputs if i == 0 else width, width), nn.ReLU()]
        self.mlp = nn.Sequential(*blocks)

    def features(self, x, lengths):
        x = zero_past(x, lengths)
        if self.pool == "mean":
            pooled = x.sum(1) / lengths.clamp(min=1)[:, None].to(x.dtype)
        else:  # a fixed number of positions: pad with zeros or cut
            x = x[:, : self.positions]
            x = nn.functional.pad(x, (0, 0, 0, self.positions - x.shape[1]))
            pooled = x.flatten(1)
        return self.mlp(pooled)


def zero_past(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """``x`` with the vectors at positions ``>= lengths[i]`` of row ``i`` set to zero."""
    keep = torch.arange(x.shape[1], device=x.device)[None, :] < lengths[:, None]
    return x * keep[..., None].to(x.dtype)


@dataclass(frozen=True)
class EncoderSpec:
    """Everything that fixes an encoder's shape (and so its parameter count)."""

    kind: EncoderKind
    embed_dim: int  # e: width of the token vectors it reads
    width: int  # CNN filters per kernel size / LSTM units / MLP hidden units
    num_prompts: int  # k
    hidden_size: int  # d
    layers: int = 1  # LSTM layers / MLP hidden layers (TextCNN: one conv per kernel size)
    bidirectional: bool = True  # LSTM only
    mlp_pool: Literal["mean", "flatten"] = "mean"
    positions: int = 1  # MLP flatten: token positions read

    def num_params(self) -> int:
        """Closed-form count of the encoder's parameters (``*_encoder_params`` below)."""
        e, w, k, d = self.embed_dim, self.width, self.num_prompts, self.hidden_size
        if self.kind == "textcnn":
            return textcnn_encoder_params(e, w, k, d, KERNEL_SIZES)
        if self.kind == "lstm":
            return lstm_encoder_params(e, w, k, d, self.layers, self.bidirectional)
        inputs = e if self.mlp_pool == "mean" else self.positions * e
        return mlp_encoder_params(inputs, w, k, d, self.layers)

    def build(self, seed: int) -> PromptEncoder:
        """The encoder, initialised from ``seed`` (the global RNG is left untouched)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            e, w, k, d = self.embed_dim, self.width, self.num_prompts, self.hidden_size
            if self.kind == "textcnn":
                return TextCNNEncoder(e, w, k, d)
            if self.kind == "lstm":
                return LSTMEncoder(e, w, k, d, self.layers, self.bidirectional)
            return MLPEncoder(e, w, k, d, self.layers, self.mlp_pool, self.positions)


# ----------------------------------------------------------------------------- counts


def textcnn_encoder_params(
    embed_dim: int,
    width: int,
    num_prompts: int,
    hidden_size: int,
    kernel_sizes: tuple[int, ...] = KERNEL_SIZES,
) -> int:
    """TextCNN ``e -> k·d``: a conv ``K·e·w + w`` per kernel size ``K``, then a projection
    ``(|K|·w)·k·d + k·d``: ``w·(e·ΣK + |K|) + (|K|·w + 1)·k·d``."""
    convs = width * (embed_dim * sum(kernel_sizes) + len(kernel_sizes))
    return convs + (len(kernel_sizes) * width + 1) * num_prompts * hidden_size


def lstm_encoder_params(
    embed_dim: int,
    width: int,
    num_prompts: int,
    hidden_size: int,
    layers: int = 1,
    bidirectional: bool = True,
) -> int:
    """Stacked (bi-)LSTM of ``w`` units then ``D·w -> k·d`` (``D`` directions). A layer reading
    ``a`` inputs holds ``D·4w·(a + w + 2)`` (PyTorch keeps two bias vectors); the first reads
    ``e``, later ones ``D·w``."""
    directions = 2 if bidirectional else 1
    total = directions * 4 * width * (embed_dim + width + 2)
    total += (layers - 1) * directions * 4 * width * (directions * width + width + 2)
    return total + (directions * width + 1) * num_prompts * hidden_size


def mlp_encoder_params(
    input_size: int, width: int, num_prompts: int, hidden_size: int, layers: int = 1
) -> int:
    """MLP ``in -> w (-> w)… -> k·d`` with ``layers`` hidden layers:
    ``(in+1)·w + (layers−1)·(w+1)·w + (w+1)·k·d``."""
    hidden = (input_size + 1) * width + (layers - 1) * (width + 1) * width
    return hidden + (width + 1) * num_prompts * hidden_size
