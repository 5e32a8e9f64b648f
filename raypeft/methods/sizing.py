"""Sizing primitives several methods' closed-form counts and budgets share.

Each method's own count lives in its file, next to its module (the method contract tests
check that the two agree). Notation follows ../shared/METHODS.md: hidden size ``d``.
"""

from __future__ import annotations

from collections.abc import Callable


def soft_prompt_params(prompt_length: int, hidden_size: int) -> int:
    """A soft prompt ``P ∈ R^{l×d}``: ``l·d`` (PT's count, and the unit of a budget given as
    a PT length ``l``)."""
    return prompt_length * hidden_size


def largest_fitting(count: Callable[[int], int], budget: int, upper: int = 1 << 24) -> int:
    """Largest ``x`` in ``[1, upper]`` with ``count(x) <= budget`` (``count`` increasing);
    0 when even ``x = 1`` does not fit."""
    if count(1) > budget:
        return 0
    low, high = 1, upper
    while low < high:  # invariant: count(low) <= budget
        mid = (low + high + 1) // 2
        if count(mid) <= budget:
            low = mid
        else:
            high = mid - 1
    return low
