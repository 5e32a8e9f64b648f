"""Learning-curve tables made up for tests of replayed searches: every configuration of a
grid at each seed, with values that tell the curves apart."""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from typing import Any

from raypeft.search.simulate.table import Curve, CurveTable


def grid_table(
    path: Path,
    experiment: dict[str, Any],
    grid: dict[str, list[Any]],
    seeds: list[int],
    steps: list[int],
    metric: str = "accuracy",
) -> CurveTable:
    """A table of ``experiment`` (its JSON form) over ``grid`` x ``seeds``, saved at ``path``:
    values drawn from a seeded RNG, so no two curves are equal."""
    rng = random.Random(0)
    curves = []
    for combo in itertools.product(*grid.values()):
        for seed in seeds:
            curves.append(
                Curve(
                    params=dict(zip(grid, combo, strict=True)),
                    seed=seed,
                    steps=list(steps),
                    values={
                        "val_loss": [round(rng.uniform(0.3, 1.2), 6) for _ in steps],
                        f"val_{metric}": [round(rng.uniform(0.3, 0.9), 6) for _ in steps],
                    },
                    wall_s=[float(i + 1) for i in range(len(steps))],
                )
            )
    dims = {"hidden_size": 8, "num_layers": 1, "vocab_size": 100, "max_length": 16}
    table = CurveTable(experiment, metric, "max", dims, curves, {"concurrency": 2})
    table.save(path)
    return table
