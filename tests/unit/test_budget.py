"""Closed-form parameter counts (METHODS.md: PT and DePT; T5-base shapes)."""

from __future__ import annotations

import pytest

from raypeft.methods import BackboneDims
from raypeft.methods.dept import DePTConfig, dept_params, dept_rank_for_params
from raypeft.methods.sizing import soft_prompt_params

D, S, L = 768, 256, 100  # T5-base hidden size, max length, PT prompt length
PAPER = {20: 60, 40: 45, 60: 30, 80: 15}  # DePT Table: m -> r at PT's budget
T5_BASE = BackboneDims(hidden_size=D, num_layers=12, vocab_size=32128, max_length=S)


def dept_rank_for_budget(budget_prompt_length: int, prompt_length: int, s: int, d: int) -> int:
    """Largest rank ``r`` with ``m·d + (s+d)·r <= l·d``: the library's rank at PT's count."""
    return dept_rank_for_params(soft_prompt_params(budget_prompt_length, d), prompt_length, s, d)


def dept_budget_table(prompt_lengths: list[int] | None = None) -> list[tuple[int, int, int, int]]:
    """(m, r, count, slack) rows of DePT at PT's budget, as `raypeft budget` lists them."""
    cfg = DePTConfig(prompt_length=prompt_lengths[0] if prompt_lengths else 40, rank=1)
    budget = soft_prompt_params(L, D)
    if prompt_lengths is None:
        options = cfg.budget_options(budget, T5_BASE)
    else:  # `raypeft budget -m ...`
        options = cfg.budget_options_at(budget, T5_BASE, prompt_lengths)
    return [(o.settings["prompt_length"], o.settings["rank"], o.params, o.slack) for o in options]


def test_prompt_tuning_t5_base():
    assert soft_prompt_params(L, D) == 76_800
    assert soft_prompt_params(5, 1024) == 5_120  # IDPG's PT (t=5), RoBERTa-large


@pytest.mark.parametrize("m,r", sorted(PAPER.items()))
def test_dept_rank_for_budget_matches_paper(m, r):
    assert dept_rank_for_budget(L, m, S, D) == r
    assert dept_params(m, r, S, D) == 76_800
    # by hand: m·d + (s+d)·r
    assert m * D + (S + D) * r == 76_800


def test_dept_params_closed_form():
    assert dept_params(prompt_length=3, rank=2, max_length=10, hidden_size=7) == 3 * 7 + 17 * 2
    assert dept_params(prompt_length=60, rank=0, max_length=S, hidden_size=D) == 60 * D


def test_budget_table_paper_rows_have_no_slack():
    rows = dept_budget_table(prompt_lengths=[20, 40, 60, 80])
    assert rows == [(m, r, 76_800, 0) for m, r in sorted(PAPER.items())]


def test_budget_table_default_prompt_lengths():
    rows = dept_budget_table()  # multiples of l/10 (the config's own m=40 is one of them)
    assert [m for m, *_ in rows] == list(range(10, 100, 10))
    for m, rank, params, slack in rows:
        assert rank == (L - m) * D // (S + D)
        assert params == dept_params(m, rank, S, D)
        assert slack == 76_800 - params >= 0
        # the floor is the largest rank that fits: one more would exceed the budget
        assert dept_params(m, rank + 1, S, D) > 76_800


def test_non_integer_rank_floors_and_reports_slack():
    # m=30: r = 70·768/1024 = 52.5 -> 52; count 30·768 + 1024·52 = 76,288, slack 512
    assert dept_rank_for_budget(L, 30, S, D) == 52
    (row,) = dept_budget_table(prompt_lengths=[30])
    assert row == (30, 52, 76_288, 512)


def test_budget_table_skips_rank_zero():
    # m=99 leaves 768 params: r = 768 // 1024 = 0, no configuration fits
    assert dept_rank_for_budget(L, 99, S, D) == 0
    assert dept_budget_table(prompt_lengths=[99, 80]) == [(80, 15, 76_800, 0)]


@pytest.mark.parametrize("m", [100, 101, 250])
def test_prompt_length_not_below_budget_raises(m):
    # a prompt as long as PT's leaves no room for A·B
    with pytest.raises(ValueError, match="prompt_length < budget_prompt_length"):
        DePTConfig(prompt_length=m, budget_prompt_length=L)


def test_budget_options_at_refuses_a_length_without_room_for_a_rank():
    cfg = DePTConfig(prompt_length=40, rank=1)
    with pytest.raises(ValueError, match="every DePT m must leave room for a rank"):
        cfg.budget_options_at(soft_prompt_params(L, D), T5_BASE, [20, L])
