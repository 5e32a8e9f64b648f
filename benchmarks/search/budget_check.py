"""Does a longer training budget change what a table says? Two learning-curve tables of the
same grid, recorded with different ``train.max_steps`` (issue 42: MR at 180 steps, where its
curves still rise, against 240), compared on the seeds both hold.

For each configuration, its score is the best validation value over its curve (the value the
trial's checkpoint kept), averaged over the shared seeds. Printed:

- the rank correlation (Spearman) of the configurations' scores under the two budgets;
- the best configuration under each, and the longer budget's regret of the shorter's best
  (what a search run on the short table would have lost, had the trials run longer);
- how many of the shorter's top configurations stay in the longer's top;
- how much each configuration gained, and how many curves still rise at their last
  evaluation (by more than ``--rising`` points) under each budget.

Usage::

    python -m benchmarks.search.budget_check benchmarks/results/table_dept_mr.json \\
        benchmarks/results/table_dept_mr240.json
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass
from pathlib import Path

from scipy import stats

from benchmarks.common.tables import print_table, right_aligned_after
from raypeft.search.simulate import CurveTable


def ranked(scores: dict[str, float]) -> list[str]:
    """Configurations from the best score down (ties by name)."""
    return sorted(scores, key=lambda c: (-scores[c], c))


@dataclass(frozen=True)
class BudgetComparison:
    """Two tables' configurations compared on the seeds both hold."""

    seeds: list[int]
    short: dict[str, float]  # configuration -> score (points), the shorter budget
    long: dict[str, float]  # the same configurations, the longer budget
    short_steps: int
    long_steps: int

    @property
    def spearman(self) -> float:
        keys = list(self.short)
        return float(
            stats.spearmanr([self.short[k] for k in keys], [self.long[k] for k in keys])[0]
        )

    @property
    def regret_of_short_best(self) -> float:
        """The longer budget's best score minus that of the shorter budget's best configuration."""
        best_short = ranked(self.short)[0]
        return max(self.long.values()) - self.long[best_short]

    def top_overlap(self, k: int) -> int:
        return len(set(ranked(self.short)[:k]) & set(ranked(self.long)[:k]))


def metric_key(table: CurveTable) -> str:
    """The key of the table's checkpoint metric in each curve's values."""
    return f"val_{table.metric}"


def curve_score(values: list[float]) -> float:
    """A curve's best validation value, in points (a metric to maximise: see compare)."""
    return 100 * max(values)


def scores(table: CurveTable, seeds: list[int]) -> dict[str, float]:
    """Each configuration's score averaged over ``seeds``."""
    metric = metric_key(table)
    return {
        configuration: statistics.fmean(
            curve_score(c.values[metric]) for c in curves if c.seed in seeds
        )
        for configuration, curves in table.by_configuration().items()
        if any(c.seed in seeds for c in curves)
    }


def still_rising(table: CurveTable, points: float) -> tuple[int, int]:
    """How many curves' best-so-far rose by more than ``points`` at the last evaluation."""
    metric = metric_key(table)
    rising = 0
    for curve in table.curves:
        values = [100 * v for v in curve.values[metric]]
        if len(values) > 1 and max(values) - max(values[:-1]) > points:
            rising += 1
    return rising, len(table.curves)


def compare(short: CurveTable, long: CurveTable) -> BudgetComparison:
    """The two tables on the seeds both hold; refused where the grids differ."""
    if short.mode != "max" or long.mode != "max":  # ranked() and the regret: higher is better
        raise SystemExit("budget_check compares tables of a metric to maximise (accuracy, F1)")
    if short.space() != long.space():
        raise SystemExit("the two tables search different grids: nothing to compare")
    seeds = sorted(set(short.seeds()) & set(long.seeds()))
    if not seeds:
        raise SystemExit("the two tables share no seed")
    a, b = scores(short, seeds), scores(long, seeds)
    shared = sorted(set(a) & set(b))
    return BudgetComparison(
        seeds,
        {k: a[k] for k in shared},
        {k: b[k] for k in shared},
        short.config.train.max_steps,
        long.config.train.max_steps,
    )


def print_comparison(result: BudgetComparison, top: int) -> None:
    """The summary, then the configurations in the longer budget's order."""
    best_short, best_long = ranked(result.short)[0], ranked(result.long)[0]
    print(
        f"{len(result.short)} configurations, seeds {result.seeds}; "
        f"{result.short_steps} against {result.long_steps} steps"
    )
    print(f"Spearman rank correlation: {result.spearman:.2f}")
    print(f"best at {result.short_steps}: {best_short} ({result.short[best_short]:.2f})")
    print(f"best at {result.long_steps}: {best_long} ({result.long[best_long]:.2f})")
    print(
        f"regret at {result.long_steps} steps of the best at {result.short_steps}: "
        f"{result.regret_of_short_best:.2f} points"
    )
    print(f"top {top} shared: {result.top_overlap(top)} of {top}")
    gains = [result.long[k] - result.short[k] for k in result.short]
    print(
        f"gain from the longer budget: median {statistics.median(gains):+.2f} points "
        f"(min {min(gains):+.2f}, max {max(gains):+.2f})"
    )
    header = ["configuration", f"{result.short_steps} steps", f"{result.long_steps} steps", "gain"]
    body = [
        [k, f"{result.short[k]:.2f}", f"{result.long[k]:.2f}", f"{gain:+.2f}"]
        for k in ranked(result.long)
        for gain in [result.long[k] - result.short[k]]
    ]
    print_table(header, body, right_aligned_after(1, len(header)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("short", type=Path, help="the table with the shorter budget")
    parser.add_argument("long", type=Path, help="the table with the longer budget")
    parser.add_argument("--top", type=int, default=5, help="how many top configurations to match")
    parser.add_argument(
        "--rising", type=float, default=0.5, help="points a last evaluation must add to count"
    )
    args = parser.parse_args()
    short, long = CurveTable.load(args.short), CurveTable.load(args.long)
    print_comparison(compare(short, long), args.top)
    for name, table in ((args.short.name, short), (args.long.name, long)):
        rising, total = still_rising(table, args.rising)
        print(f"{name}: {rising} of {total} curves rose by > {args.rising} points last")


if __name__ == "__main__":
    main()
