"""The study's tables from its JSON lines: regret by method, table and budget, and the
simulator cross-check (raypeft's random search and ASHA against syne-tune's).

Held-out regret in points, mean over replays with a bootstrap 95% interval (scipy, 2000
resamples, percentile); "minus shipped": the paired difference from raypeft's shipped
search, replay by replay (the same seed draws), its mean and bootstrap interval. The
cross-check compares two independent samplers on the same draws: the difference of their
mean regrets with an unpaired bootstrap interval, and the Mann-Whitney U test's p::

    PYTHONPATH=. /work/main/.venv/bin/python -m benchmarks.synetune.report [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
from scipy import stats

from benchmarks.common.tables import markdown_table, right_aligned_after
from benchmarks.synetune.study import BUDGETS, OUT

SHIPPED = "raypeft-shipped"
CROSS_CHECK = (("raypeft-random", "st-random"), ("raypeft-random-asha", "st-asha"))


def read(out: Path) -> dict[tuple[str, str], dict[int, dict]]:
    """(table, method) -> replay -> row (the last stored for a replay wins)."""
    rows: dict[tuple[str, str], dict[int, dict]] = defaultdict(dict)
    for line in out.read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            rows[(r["table"], r["method"])][r["replay"]] = r
    return rows


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


def mean_ci(values: list[float]) -> str:
    if not values:
        return "-"
    x = np.asarray(values)
    low, high = interval(x, statistic=np.mean)
    return f"{x.mean():.2f} [{low:.2f}, {high:.2f}]"


def paired_ci(a: dict[int, float], b: dict[int, float]) -> str:
    both = sorted(a.keys() & b.keys())
    if not both:
        return "-"
    d = np.asarray([a[i] - b[i] for i in both])
    low, high = interval(d, statistic=np.mean)
    return f"{d.mean():+.2f} [{low:+.2f}, {high:+.2f}]"


def anchored(method: str, replays: dict, shipped: dict, budget: float) -> str:
    """The paired difference from the shipped search at ``budget`` ("anchor" on its row)."""
    if method == SHIPPED:
        return "(anchor)"
    return paired_ci(figure(replays, budget), figure(shipped, budget)) if shipped else "-"


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
                    + [mean_ci(list(figure(replays, b).values())) for b in BUDGETS]
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
