"""Parameterized hypercomplex multiplication (PHM) layers, as IDPG (eq. 4) uses them.

A PHM layer is a linear layer whose weight is a sum of Kronecker products,
``W = Σ_{i=1..n} A_i ⊗ B_i`` with ``A_i ∈ R^{n×n}`` and ``B_i ∈ R^{(out/n)×(in/n)}``: it
holds ``n³ + in·out/n`` weights instead of ``in·out``. The ``A`` set may be owned by the layer
or shared between layers (IDPG's single-layer generator shares one set between its two PHM
layers); the owner of a shared set registers it once, so it is counted and saved once.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def init_phm_a(n: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """A fresh ``A`` set ``(n, n, n)`` with entries ``N(0, 1/n)``.

    With this variance each entry of ``Σ A_i ⊗ B_i`` has the variance of one entry of ``B``
    (a sum of ``n`` products), so ``B``'s standard deviation sets the dense-equivalent scale.
    """
    return torch.randn(n, n, n, generator=generator) / math.sqrt(n)


class PHMLinear(nn.Module):
    """``y = x Wᵀ + b`` with ``W = Σ_i A_i ⊗ B_i`` (``n`` must divide both sizes).

    ``shared_a``: an ``(n, n, n)`` parameter owned (registered) by another module; when given,
    this layer uses it without registering it again. ``weight_std``: standard deviation of
    the dense-equivalent weight at initialisation (default ``1/sqrt(in_features)``).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        n: int,
        *,
        bias: bool = True,
        shared_a: nn.Parameter | None = None,
        weight_std: float | None = None,
        generator: torch.Generator | None = None,
    ):
        super().__init__()
        if n < 1 or in_features % n or out_features % n:
            raise ValueError(
                f"PHM: n={n} must divide both sizes, but got "
                f"(in_features={in_features}, out_features={out_features})"
            )
        self.in_features, self.out_features, self.n = in_features, out_features, n
        if shared_a is None:
            self.own_a = nn.Parameter(init_phm_a(n, generator))
            self._shared_a: tuple[nn.Parameter, ...] = ()
        else:
            if tuple(shared_a.shape) != (n, n, n):
                raise ValueError(
                    f"PHM: the shared A set must have shape ({n}, {n}, {n}), "
                    f"but got {tuple(shared_a.shape)}"
                )
            self.register_parameter("own_a", None)
            # a tuple hides it from nn.Module's registration: its owner counts and saves it
            self._shared_a = (shared_a,)
        std = weight_std if weight_std is not None else 1 / math.sqrt(in_features)
        self.phm_b = nn.Parameter(
            torch.randn(n, out_features // n, in_features // n, generator=generator) * std
        )
        if bias:
            self.bias = nn.Parameter(torch.zeros(out_features))
        else:
            self.register_parameter("bias", None)

    @property
    def phm_a(self) -> torch.Tensor:
        """The ``A`` set in use (owned or shared), ``(n, n, n)``."""
        return self.own_a if self.own_a is not None else self._shared_a[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Never build W: contract x with the small factors. Output index (p, r) and input
        # index (q, s) are the Kronecker block and in-block positions (p, q over n blocks).
        a, b, n = self.phm_a.to(x.dtype), self.phm_b.to(x.dtype), self.n
        lead = x.shape[:-1]
        xs = x.reshape(-1, n, self.in_features // n)  # (batch, q, s)
        if self.in_features <= self.out_features:  # mix blocks where the vectors are short
            mixed = torch.einsum("ipq,bqs->bips", a, xs)
            y = torch.einsum("irs,bips->bpr", b, mixed)
        else:
            partial = torch.einsum("irs,bqs->biqr", b, xs)
            y = torch.einsum("ipq,biqr->bpr", a, partial)
        y = y.reshape(*lead, self.out_features)
        return y if self.bias is None else y + self.bias.to(x.dtype)

    def extra_repr(self) -> str:
        shared = ", shared A" if self.own_a is None else ""
        return f"in={self.in_features}, out={self.out_features}, n={self.n}{shared}"
