"""The study's tables from its JSON lines: regret by method, table and budget, and the
simulator cross-check (raypeft's random search and ASHA against syne-tune's).

Held-out regret in points, mean over replays with a hierarchical bootstrap 95% interval
(issue 57, item 5: the held-out seeds drawn with replacement, then each drawn seed's replays;
2000 resamples, percentile), the interval raypeft's study uses
(:func:`raypeft.search.simulate.scores.hierarchical_interval`); "minus shipped": the paired
difference from raypeft's shipped search, replay by replay (the same seed draws), its mean
and hierarchical interval, and beside it the interval over replays alone. A row stored before
the reference was picked without the held-out seed is re-scored exactly on reading (its
choice does not depend on the reference). The cross-check compares two independent samplers
on the same draws: the difference of their mean regrets with an unpaired bootstrap interval
over replays, and the Mann-Whitney U test's p::

    PYTHONPATH=. /work/main/.venv/bin/python -m benchmarks.synetune.report [--out FILE]
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
from scipy import stats

from benchmarks.common.results import ResultsFile
from benchmarks.common.tables import markdown_table, right_aligned_after
from benchmarks.synetune.curves import Quality, load
from benchmarks.synetune.study import BUDGETS, OUT, REFERENCE, TABLES, digest
from raypeft.search.simulate.scores import hierarchical_interval

SHIPPED = "raypeft-shipped"
CROSS_CHECK = (("raypeft-random", "st-random"), ("raypeft-random-asha", "st-asha"))


def read(out: Path, tables: list[Path] = TABLES) -> dict[tuple[str, str], dict[int, dict]]:
    """(table, method) -> replay -> row (the last stored for a replay wins), each row's
    held-out regret against the reference picked without its held-out seed (rows stored
    before are re-scored; one whose table is not among ``tables`` at its digest is left
    out, with a line on stderr)."""
    rows: dict[tuple[str, str], dict[int, dict]] = defaultdict(dict)
    qualities = {digest(t): Quality.of(load(t)) for t in tables if Path(t).exists()}
    unknown: set[str] = set()
    for r in ResultsFile(out).rows():
        if r.get("reference") != REFERENCE:
            if r["table_sha"] not in qualities:
                unknown.add(r["table"])
                continue
            r = rescored(r, qualities[r["table_sha"]])
        rows[(r["table"], r["method"])][r["replay"]] = r
    if unknown:
        print(f"left out (their table changed since): {sorted(unknown)}", file=sys.stderr)
    return rows


def rescored(row: dict, quality: Quality) -> dict:
    """``row`` with its held-out regret against the reference picked without its held-out
    seed: the old figure minus :meth:`Quality.reference_inflation` of that seed, exact since
    the replay's choice does not depend on the reference."""
    seed = row.get("heldout_seed")
    shift = 0.0 if seed is None else quality.reference_inflation(seed)
    budgets = {
        b: None if at is None else {
            **at, "heldout": None if at["heldout"] is None else round(at["heldout"] - shift, 4)
        }
        for b, at in row["budgets"].items()
    }  # fmt: skip
    return {**row, "budgets": budgets, "reference": REFERENCE}


def seeds_of(replays: dict[int, dict], which: list[int]) -> list:
    """The held-out seed of each replay in ``which``: the top level of the intervals."""
    return [replays[i].get("heldout_seed") for i in which]


def figure(replays: dict[int, dict], budget: float, name: str = "heldout") -> dict[int, float]:
    """replay -> its figure at ``budget`` (replays with no choice yet left out)."""
    out = {}
    for i, r in replays.items():
        at = r["budgets"].get(str(budget))
        if at is not None and at[name] is not None and not math.isnan(at[name]):
            out[i] = at[name]
    return out


def interval(*samples, statistic, paired: bool = False) -> tuple[float, float]:
    if any(len(s) < 2 for s in samples) or all(np.all(s == s[0]) for s in samples):
        value = statistic(*samples)
        return value, value
    result = stats.bootstrap(
        samples,
        statistic,
        n_resamples=2000,
        method="percentile",
        paired=paired,
        vectorized=False,
        rng=np.random.default_rng(0),
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def grouped_interval(x: np.ndarray, groups: list) -> tuple[float, float]:
    """The hierarchical bootstrap interval of the mean (seeds, then replays); over replays
    where a replay has no held-out seed."""
    if any(g is None for g in groups):
        return interval(x, statistic=np.mean)
    return hierarchical_interval(x, groups, np.mean, seed=0)


def mean_ci(values: dict[int, float], replays: dict[int, dict]) -> str:
    if not values:
        return "-"
    which = sorted(values)
    x = np.asarray([values[i] for i in which])
    low, high = grouped_interval(x, seeds_of(replays, which))
    return f"{x.mean():.2f} [{low:.2f}, {high:.2f}]"


def paired_ci(a: dict[int, float], b: dict[int, float], replays: dict[int, dict]) -> str:
    """The mean of a - b, replay by replay: [hierarchical interval] (over replays alone)."""
    both = sorted(a.keys() & b.keys())
    if not both:
        return "-"
    d = np.asarray([a[i] - b[i] for i in both])
    low, high = grouped_interval(d, seeds_of(replays, both))
    flat_low, flat_high = interval(d, statistic=np.mean)
    return (f"{d.mean():+.2f} [{low:+.2f}, {high:+.2f}] "
            f"(replays only [{flat_low:+.2f}, {flat_high:+.2f}])")  # fmt: skip


def anchored(method: str, replays: dict, shipped: dict, budget: float) -> str:
    """The paired difference from the shipped search at ``budget`` ("anchor" on its row)."""
    if method == SHIPPED:
        return "(anchor)"
    if not shipped:
        return "-"
    return paired_ci(figure(replays, budget), figure(shipped, budget), replays)


def regret_table(rows, table: str) -> str:
    """One row per method on ``table``: held-out regret at each budget, the paired
    difference from the shipped search at the largest, the wall there, replays."""
    methods = sorted({m for t, m in rows if t == table}, key=lambda m: (m != SHIPPED, m))
    shipped = rows.get((table, SHIPPED), {})
    top = max(BUDGETS)
    body = []
    for method in methods:
        replays = rows[(table, method)]
        walls = list(figure(replays, top, "wall").values())
        body.append([method]
                    + [mean_ci(figure(replays, b), replays) for b in BUDGETS]
                    + [anchored(method, replays, shipped, top),
                       f"{np.median(walls):.2f}" if walls else "-", str(len(replays))])  # fmt: skip
    header = ["method"] + [f"held-out regret at {b:g}" for b in BUDGETS]
    header += [f"minus shipped at {top:g}", f"wall at {top:g}", "replays"]
    return markdown_table(header, body, right_aligned_after(1, len(header)))


def cross_check_table(rows, tables: list[str]) -> str:
    """raypeft's simulator against syne-tune's for the settings both express."""
    body = []
    for table in tables:
        for ours, theirs in CROSS_CHECK:
            a_rows, b_rows = rows.get((table, ours)), rows.get((table, theirs))
            if not a_rows or not b_rows:
                continue
            for budget in BUDGETS:
                for name in ("heldout", "regret"):
                    a = np.asarray(list(figure(a_rows, budget, name).values()))
                    b = np.asarray(list(figure(b_rows, budget, name).values()))
                    if len(a) < 2 or len(b) < 2:
                        continue
                    low, high = interval(a, b, statistic=lambda x, y: np.mean(x) - np.mean(y))
                    p = stats.mannwhitneyu(a, b).pvalue
                    body.append([table, f"{ours} / {theirs}", f"{budget:g}", name,
                                 f"{a.mean():.2f}", f"{b.mean():.2f}",
                                 f"{a.mean() - b.mean():+.2f} [{low:+.2f}, {high:+.2f}]",
                                 f"{p:.2f}", "yes" if low <= 0 <= high else "no"])  # fmt: skip
    header = ["table", "raypeft / syne-tune", "budget", "regret", "raypeft mean",
              "syne-tune mean", "difference [95%]", "Mann-Whitney p", "agree"]  # fmt: skip
    return markdown_table(header, body, right_aligned_after(4, len(header)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help="the study's JSON lines")
    args = parser.parse_args(argv)
    if not args.out.exists():
        parser.exit(2, f"--out {args.out}: no such file (run benchmarks.synetune.study)\n")
    rows = read(args.out)
    tables = sorted({t for t, _ in rows})
    for table in tables:
        print(f"\n### {table}\n\n{regret_table(rows, table)}")
    print(f"\n### Cross-check\n\n{cross_check_table(rows, tables)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
