"""Closed-form trainable-parameter counts (task head excluded, as in the papers).

Every method's module must report exactly the count computed here; the method contract
tests check it. Notation follows ../shared/METHODS.md: hidden size ``d``, input length ``s``.
"""

from __future__ import annotations

from dataclasses import dataclass


def prompt_tuning_params(prompt_length: int, hidden_size: int) -> int:
    """Soft prompt ``P ∈ R^{l×d}``: ``l·d``."""
    return prompt_length * hidden_size


def deep_prompt_params(
    prompt_length: int, num_layers: int, hidden_size: int, style: str, kv_size: int | None = None
) -> int:
    """Deep prompts: ``t·N·d`` (hidden states) or ``2·t·N·d_kv`` (key/value prefixes).

    ``d_kv`` is one layer's key width (``d`` unless grouped-query attention shrinks it).
    """
    if style == "hidden":
        return prompt_length * num_layers * hidden_size
    return 2 * prompt_length * num_layers * (kv_size or hidden_size)


def dept_params(prompt_length: int, rank: int, max_length: int, hidden_size: int) -> int:
    """DePT: soft prompt ``m·d`` plus ``A ∈ R^{s×r}``, ``B ∈ R^{r×d}``: ``m·d + (s+d)·r``."""
    return prompt_length * hidden_size + (max_length + hidden_size) * rank


def dept_rank_for_budget(
    budget_prompt_length: int, prompt_length: int, max_length: int, hidden_size: int
) -> int:
    """Largest rank ``r`` with ``m·d + (s+d)·r <= l·d``, i.e. ``floor((l−m)·d/(s+d))``.

    ``budget_prompt_length`` is the PT length ``l`` whose parameter count is the budget.
    """
    if prompt_length >= budget_prompt_length:
        raise ValueError(
            f"`prompt_length < budget_prompt_length` must hold for DePT, but got "
            f"(prompt_length={prompt_length}, budget_prompt_length={budget_prompt_length})."
        )
    return (budget_prompt_length - prompt_length) * hidden_size // (max_length + hidden_size)


def dept_rank_for_params(budget: int, prompt_length: int, max_length: int, hidden_size: int) -> int:
    """Largest rank ``r`` with ``m·d + (s+d)·r <= budget`` (may be < 1: does not fit)."""
    return (budget - prompt_length * hidden_size) // (max_length + hidden_size)


@dataclass(frozen=True)
class BudgetRow:
    """One DePT configuration that fits a PT-equivalent budget."""

    prompt_length: int
    rank: int
    params: int
    slack: int  # budget − params (≥ 0): what flooring r leaves unused


def dept_budget_table(
    budget_prompt_length: int,
    max_length: int,
    hidden_size: int,
    prompt_lengths: list[int] | None = None,
) -> list[BudgetRow]:
    """(m, r, count, slack) for every ``m`` (default: multiples of ``l/10``) below ``l``."""
    budget = prompt_tuning_params(budget_prompt_length, hidden_size)
    if prompt_lengths is None:
        step = max(1, budget_prompt_length // 10)
        prompt_lengths = list(range(step, budget_prompt_length, step))
    rows = []
    for m in prompt_lengths:
        r = dept_rank_for_budget(budget_prompt_length, m, max_length, hidden_size)
        if r < 1:
            continue
        n = dept_params(m, r, max_length, hidden_size)
        rows.append(BudgetRow(m, r, n, budget - n))
    return rows
