"""syne-tune's baselines and raypeft's shipped search on raypeft's tables: regret at budgets.

Each method is replayed ``--replays`` times on each table; replay ``i`` of every method trains
every trial on the same recorded seed and holds out the same one (raypeft's replay ``i`` at
``--seed 0``), so methods pair by replay index. A replay is scored at 0.1, 0.2 and 0.3 of the
full grid's trial-steps: the configuration the method would choose then (raypeft's rule: the
best checkpoint accuracy among the trials that ended), and its regret on the held-out seed
(points below the table's best configuration on that seed) and in-sample (below the best
seed-mean), with the simulated seconds at that point over the full grid's at the same
concurrency (the recording's: 2 trials at a time).

The two libraries live in two environments, so the study runs in each: syne-tune's methods
(``st-*``) in syne-tune's venv, raypeft's (``raypeft-*``) in raypeft's; each appends one JSON
line per replay to ``--out`` as it finishes and skips replays already there (for the same
table file, by its digest), so an interrupted run continues where it stopped::

    PYTHONPATH=. .venv-synetune/bin/python -m benchmarks.synetune.study --replays 30
    PYTHONPATH=. /work/main/.venv/bin/python -m benchmarks.synetune.study --replays 30
    PYTHONPATH=. /work/main/.venv/bin/python -m benchmarks.synetune.report

``--smoke``: one table, two replays of two methods, into a temporary file unless ``--out``.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import sys
import tempfile
from pathlib import Path

from benchmarks.common.results import ResultsFile
from benchmarks.synetune.curves import (
    Curves,
    Draw,
    Quality,
    anytime,
    at_budget,
    grid_wall,
    load,
)

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
OUT = RESULTS / "synetune_baselines.jsonl"
TABLES = [RESULTS / f"table_dept_{name}.json" for name in ("subj", "mr", "tweets")]
BUDGETS = (0.1, 0.2, 0.3)
ST_METHODS = ("st-random", "st-asha", "st-asha-3brackets", "st-bohb", "st-tpe", "st-rea",
              "st-bore", "st-asha-bore", "st-cqr", "st-asha-cqr")  # fmt: skip
RAYPEFT_METHODS = ("raypeft-shipped", "raypeft-random", "raypeft-random-asha")
# how held-out regret's reference was picked: rows without this field picked it with the
# held-out seed itself (before issue 57, item 5); the report re-scores them exactly
REFERENCE = "without-heldout-seed"


def available() -> list[str]:
    """The methods this environment can replay (syne-tune's or raypeft's)."""
    found = []
    if importlib.util.find_spec("syne_tune"):
        found += ST_METHODS
    if importlib.util.find_spec("raypeft") and importlib.util.find_spec("ray"):
        found += RAYPEFT_METHODS
    return found


def digest(path: Path) -> str:
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def replay_key(row: dict) -> tuple[str, str, int]:
    """What a row replayed: (method, table digest, replay)."""
    return (row["method"], row["table_sha"], row["replay"])


def scored(curves: Curves, draw: Draw, points: list[tuple], workers: int) -> dict:
    """A replay's figures at each budget from its anytime points (steps fraction, ended_s,
    held-out regret, in-sample regret)."""
    wall = grid_wall(curves, draw.common, workers)
    budgets = {}
    for budget in BUDGETS:
        point = at_budget(points, budget)
        budgets[str(budget)] = None if point is None else {
            "heldout": round(point[2], 4), "regret": round(point[3], 4),
            "steps": round(point[0], 4), "wall": round(point[1] / wall, 4),
        }  # fmt: skip
    return {"budgets": budgets, "spent": round(points[-1][0], 4) if points else 0.0}


def synetune_points(curves: Curves, method: str, draw: Draw, workers: int) -> list[tuple]:
    """syne-tune's replay as anytime points, scored as raypeft scores."""
    from benchmarks.synetune.baselines import replay
    from benchmarks.synetune.export import blackbox

    quality = Quality.of(curves)
    trials = replay(curves, blackbox(curves), method, draw, max(BUDGETS), workers)
    grid_steps = len(curves.configurations) * curves.max_steps
    return [(frac, ended, quality.heldout_regret(row, draw.heldout), quality.regret(row))
            for frac, ended, row in anytime(trials, curves.sign(), grid_steps)]  # fmt: skip


def raypeft_points(path: Path, method: str, index: int, workers: int) -> list[tuple]:
    from benchmarks.synetune import raypeft_side
    from raypeft.search.simulate.table import CurveTable

    return raypeft_side.replay(CurveTable.load(path), method, index, workers)


def run(tables: list[Path], methods: list[str], replays: int, out: Path) -> int:
    """Replay what is not stored yet; one JSON line per replay. Returns how many ran."""
    results, ran = ResultsFile(out, key=replay_key), 0
    for path in tables:
        curves, sha = load(path), digest(path)
        workers = curves.concurrency
        for method in methods:
            for i in range(replays):
                if results.done((method, sha, i)):
                    continue
                spare = 1 if method == "raypeft-shipped" else 0
                draw = Draw.of(curves, i, spare)
                points = (synetune_points(curves, method, draw, workers)
                          if method.startswith("st-")
                          else raypeft_points(path, method, i, workers))  # fmt: skip
                row = {"method": method, "table": path.stem, "table_sha": sha, "replay": i,
                       "heldout_seed": draw.heldout, "common_seed": draw.common,
                       "workers": workers, "date": datetime.date.today().isoformat(),
                       "reference": REFERENCE,
                       **scored(curves, draw, points, workers)}  # fmt: skip
                results.append(row)
                ran += 1
            print(f"{path.stem} {method}: {replays} replays stored in {out}", flush=True)
    return ran


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", type=Path, action="append", help="default: DePT's three")
    parser.add_argument("--method", action="append", help="default: all this venv can run")
    parser.add_argument("--replays", type=int, default=30)
    parser.add_argument("--out", type=Path, help=f"JSON lines (default {OUT.relative_to(REPO)})")
    parser.add_argument("--smoke", action="store_true", help="1 table, 2 replays, 2 methods")
    args = parser.parse_args(argv)
    can = available()
    methods = args.method or can
    unknown = [m for m in methods if m not in ST_METHODS + RAYPEFT_METHODS]
    if unknown:
        parser.exit(
            2, f"--method {unknown[0]}: not one of {', '.join(ST_METHODS + RAYPEFT_METHODS)}\n"
        )
    missing = [m for m in methods if m not in can]
    if missing:
        parser.exit(2, f"--method {missing[0]}: its library is not installed in this Python "
                    "(st-*: syne-tune's venv; raypeft-*: raypeft's)\n")  # fmt: skip
    tables = args.table or TABLES
    for path in tables:
        try:
            load(path)
        except (OSError, ValueError, KeyError) as err:
            parser.exit(2, f"--table {path}: not a learning-curve table ({err})\n")
    if args.replays < 1:
        parser.exit(2, f"--replays must be at least 1, got {args.replays}\n")
    out = args.out or OUT
    if args.smoke:
        tables, methods, replays = tables[:1], methods[:2], 2
        out = args.out or Path(tempfile.mkdtemp()) / "smoke.jsonl"
    else:
        replays = args.replays
    run(tables, methods, replays, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
