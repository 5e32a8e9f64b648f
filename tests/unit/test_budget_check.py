"""benchmarks.search.budget_check on synthetic tables: a longer budget that keeps the order, one
that crowns another configuration, and curves that still rise at their last evaluation."""

from __future__ import annotations

import dataclasses

import pytest

from benchmarks.search import budget_check
from raypeft.search.simulate import CurveTable


def longer(table: CurveTable, gain, steps: int = 240) -> CurveTable:
    """``table`` as if trained to ``steps``: each curve's values raised by ``gain(params)``."""
    experiment = {**table.experiment, "train": {**table.experiment["train"], "max_steps": steps}}
    curves = []
    for c in table.curves:
        raised = [v + gain(c.params) for v in c.values["val_accuracy"]]
        curves.append(dataclasses.replace(c, values={**c.values, "val_accuracy": raised}))
    return dataclasses.replace(table, experiment=experiment, curves=curves)


def test_a_longer_budget_that_keeps_the_order_costs_nothing(dept_table_file):
    short = CurveTable.load(dept_table_file)
    result = budget_check.compare(short, longer(short, lambda p: 0.01))
    assert result.seeds == [0, 1] and len(result.short) == 48
    assert result.spearman == pytest.approx(1.0, abs=1e-3)  # ties broken by rounding
    assert result.regret_of_short_best == pytest.approx(0.0)
    assert result.top_overlap(5) == 5
    assert (result.short_steps, result.long_steps) == (short.config.train.max_steps, 240)


def test_a_configuration_that_overtakes_is_the_short_bests_regret(dept_table_file):
    short = CurveTable.load(dept_table_file)
    best = budget_check.ranked(budget_check.scores(short, [0, 1]))[0]
    late = {"method.lr_prompt": 0.3, "method.lr_lowrank": 5e-3, "method.prompt_length": 80}
    long = longer(short, lambda p: 0.2 if p == late else 0.0)
    result = budget_check.compare(short, long)
    overtaker = max(result.long, key=result.long.get)
    assert overtaker != best
    assert result.regret_of_short_best == pytest.approx(result.long[overtaker] - result.long[best])
    assert result.regret_of_short_best > 0


def test_curves_that_rise_at_their_last_evaluation_are_counted(dept_table_file):
    table = CurveTable.load(dept_table_file)
    # the synthetic curves rise linearly: each evaluation adds (top - 0.4) / 4 of accuracy
    rising, total = budget_check.still_rising(table, points=0.5)
    assert total == 96 and rising == 96
    assert budget_check.still_rising(table, points=20.0) == (0, 96)


def test_tables_of_different_grids_are_refused(dept_table_file):
    short = CurveTable.load(dept_table_file)
    fewer = dataclasses.replace(
        short, curves=[c for c in short.curves if c.params["method.prompt_length"] != 80]
    )
    with pytest.raises(SystemExit, match="different grids"):
        budget_check.compare(short, fewer)
