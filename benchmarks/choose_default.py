"""The shipped DePT search chosen under issue 42's protocol: chosen on the replays of some
tables, then confirmed on a table the choice never saw and on fresh replays.

The rule, fixed before the confirmation table was read:

1. **Replays.** Every candidate is replayed ``--replays`` times at ``--seed`` against each
   choice table (``benchmarks.replay_study``'s rows: read from its ``--out`` file where stored
   for the same table, setting, replays, seed and draws, replayed and stored otherwise).
2. **Leader.** The candidate with the lowest held-out regret (the interquartile mean over
   replays of the chosen configuration's score on the seed the replay never saw), averaged
   over the choice tables.
3. **Ties.** A candidate ties with the leader when, on every choice table, the 95% bootstrap
   interval of its held-out regret minus the leader's, paired replay by replay, lies below
   ``--margin`` (0.5 points: the quality goal's tolerance). An interval that merely reaches 0
   is no tie: at 30 replays of 3-seed tables nearly every interval does, and the cheapest
   setting of all (the old ASHA default, +0.44 [-0.07, +1.00] points behind on MR) would win.
4. **Chosen.** Of the leader and the candidates that tie with it, the cheapest: the lowest
   median trial-steps (a fraction of the full grid's), averaged over the choice tables; the
   leader where that is equal. (A newcomer's first command is part of the product.)
5. **Confirmation.** The chosen against the shipped search (``--shipped``: what
   ``search_spaces/dept.yaml`` ships unless given) and against the leader, paired,
   on each confirmation table at ``--confirm-table-seed`` (``--seed`` unless given) and on
   each choice table at ``--confirm-seed`` (fresh replays: seed draws and sampler seeds the
   choice never saw), ``--confirm-replays`` replays each (``--replays`` unless given). It is
   confirmed when, on every confirmation set, the interval of the chosen minus the shipped
   lies below the margin (not worse by more than it). More replays narrow that interval
   over replays of the same tables; they do not shrink the tables' own seed noise.

Every candidate must have a held-out figure on every table: a setting whose repeats need
every other seed of a 3-seed table is not a candidate.

Usage::

    python -m benchmarks.choose_default \\
        --choose benchmarks/results/table_dept_subj.json \\
        --choose benchmarks/results/table_dept_mr.json \\
        --confirm benchmarks/results/table_dept_tweets.json
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common.paths import RESULTS, digest
from benchmarks.common.tables import print_table, right_aligned_after
from benchmarks.replay_study import (
    DRAWS,
    SETTINGS,
    as_float,
    read_rows,
    row_key,
    shipped_setting,
    study_row,
    write_row,
)
from raypeft.search.simulate import CurveTable, Paired

# Settings a default could be: no reference grids, no GP (minutes per replay set, and its
# start-up rows equal TPE's), each with a held-out seed on a 3-seed table (repeats x1 only).
CANDIDATES = (
    "tpe-asha-loss",
    "tpe-none",
    "tpe-asha-loss-grace2",
    "tpe-asha-loss-repeat3x1",
    "tpe-asha-loss-repeat5x1",
    "tpe-none-repeat2x1",
    "tpe-none-repeat2x1-startup2",
    "tpe-none-repeat2x1-startup4",
    "tpe-none-repeat2x1-startup6",
    "tpe-asha-loss-grace2-repeat2x1",
    "tpe-asha-loss-grace2-repeat2x1-startup4",
    "random-none",
)
MARGIN = 0.5  # points of held-out regret: the goal's tolerance (docs/search_efficiency.md)


@dataclass(frozen=True)
class ConfirmationSet:
    """Replays of one table the chosen setting is confirmed on."""

    table: Path
    seed: int  # the first replay's seed
    replays: int

    @property
    def name(self) -> str:
        return f"{self.table.stem.removeprefix('table_')}, seed {self.seed}"


def confirmation_sets(
    choose_tables: list[Path],
    confirm_tables: list[Path],
    confirm_seed: int,
    table_seed: int,
    replays: int,
) -> list[ConfirmationSet]:
    """The confirmation tables at ``table_seed``, then fresh replays of the choice tables at
    ``confirm_seed``: ``replays`` each."""
    return [ConfirmationSet(t, table_seed, replays) for t in confirm_tables] + [
        ConfirmationSet(t, confirm_seed, replays) for t in choose_tables
    ]


@dataclass(frozen=True)
class Choice:
    """The rule's outcome on the choice tables."""

    leader: str
    tied: tuple[str, ...]  # the leader's ties, the leader first
    chosen: str
    heldout_iqm: dict[str, float]  # averaged over the choice tables
    steps: dict[str, float]  # median trial-steps / grid, averaged over the choice tables


def heldout(row: dict) -> list[float]:
    """A row's held-out regret per replay (NaN where a replay had none)."""
    return as_float(row["per_replay"]["heldout"])


def paired(row: dict, base: dict) -> Paired:
    """``row`` minus ``base`` on the held-out regret, replay by replay."""
    return Paired.of(heldout(row), heldout(base))


def within(row: dict, reference: dict, margin: float) -> bool:
    """Whether ``row`` is not worse than ``reference`` by more than ``margin``: its paired
    interval's upper end lies below it."""
    return paired(row, reference).mean_ci[1] <= margin


def choose(rows_by_table: list[dict[str, dict]], margin: float = MARGIN) -> Choice:
    """The rule's steps 2-4 on one row per candidate per choice table."""
    labels = list(rows_by_table[0])
    missing = [lbl for rows in rows_by_table for lbl in labels if not rows[lbl]["heldout"]["n"]]
    if missing:
        raise SystemExit(f"no held-out figure for {sorted(set(missing))}: not candidates")

    def averaged(figure: str, stat: str) -> dict[str, float]:
        return {
            lbl: sum(rows[lbl][figure][stat] for rows in rows_by_table) / len(rows_by_table)
            for lbl in labels
        }

    iqm, steps = averaged("heldout", "iqm"), averaged("steps", "median")
    leader = min(labels, key=lambda lbl: (iqm[lbl], labels.index(lbl)))
    tied = [leader] + [
        lbl for lbl in labels
        if lbl != leader and all(within(rows[lbl], rows[leader], margin) for rows in rows_by_table)
    ]  # fmt: skip
    chosen = min(tied, key=lambda lbl: (round(steps[lbl], 6), tied.index(lbl)))
    return Choice(leader, tuple(tied), chosen, iqm, steps)


def rows_for(table_path: Path, labels: list[str], replays: int, seed: int, out: Path) -> dict:
    """One replay_study row per label for this table and seed: stored, or replayed now."""
    table_digest = digest(table_path)
    stored = {row_key(r): r for r in read_rows(out)}
    table, rows = None, {}
    for label in labels:
        key = (table_digest, label, replays, seed, DRAWS)
        if key not in stored:
            table = table or CurveTable.load(table_path)
            stored[key] = study_row(label, table_path, table, replays, seed)
            write_row(out, stored[key], replacing=False)
            print(f"{table_path.name} (seed {seed}): {label}: {stored[key]['seconds']} s")
        rows[label] = stored[key]
    return rows


def fmt(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}"


def print_choice(choice: Choice, names: list[str], rows_by_table: list[dict]) -> None:
    """Every candidate: held-out IQM and paired difference from the leader per table."""
    header = ["candidate"]
    for name in names:
        header += [f"{name} held-out IQM", f"{name} minus leader"]
    header += ["held-out IQM, mean", "trial-steps / grid", "verdict"]
    body = []
    for label in choice.heldout_iqm:
        cells = [label]
        for rows in rows_by_table:
            cells.append(fmt(rows[label]["heldout"]["iqm"]))
            if label == choice.leader:
                cells.append("(leader)")
            else:
                cells.append(paired(rows[label], rows[choice.leader]).describe())
        verdict = "chosen" if label == choice.chosen else "ties" if label in choice.tied else ""
        cells += [fmt(choice.heldout_iqm[label]), fmt(choice.steps[label]), verdict]
        body.append(cells)
    print_table(header, body, right_aligned_after(1, len(header)))


def confirm(chosen: str, against: list[str], sets: dict[str, dict], shipped: str,
            margin: float = MARGIN) -> bool:  # fmt: skip
    """Step 5: the chosen against each of ``against``, paired, on each confirmation set;
    printed; whether the chosen is within ``margin`` of ``shipped`` on every set."""
    header = ["confirmation set", "chosen held-out IQM"]
    header += [f"chosen minus {label}" for label in against]
    body, confirmed = [], True
    for name, rows in sets.items():
        cells = [name, fmt(rows[chosen]["heldout"]["iqm"])]
        for label in against:
            difference = paired(rows[chosen], rows[label])
            cells.append("(itself)" if label == chosen else difference.describe())
            if label == shipped and not within(rows[chosen], rows[label], margin):
                confirmed = False
        body.append(cells)
    print_table(header, body, right_aligned_after(1, len(header)))
    return confirmed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--choose", action="append", type=Path, required=True,
                        help="a table the default is chosen on (repeatable)")  # fmt: skip
    parser.add_argument("--confirm", action="append", type=Path, default=[],
                        help="a table the choice never saw (repeatable)")  # fmt: skip
    parser.add_argument("--replays", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--confirm-seed",
        type=int,
        default=1000,
        help="fresh replays of the choice tables (>= --seed + --replays)",
    )
    parser.add_argument(
        "--confirm-table-seed",
        type=int,
        help="the first replay's seed on the --confirm tables (default: --seed)",
    )
    parser.add_argument(
        "--confirm-replays",
        type=int,
        help="replays per confirmation set (default: --replays)",
    )
    parser.add_argument(
        "--candidate",
        action="append",
        help=f"a candidate setting (repeatable; default: {', '.join(CANDIDATES)})",
    )
    parser.add_argument(
        "--margin",
        type=float,
        default=MARGIN,
        help="points of held-out regret a tie or a confirmation may lose",
    )
    parser.add_argument(
        "--shipped",
        help="the setting a choice must be confirmed against (default: what "
        "search_spaces/dept.yaml ships now; the rounds of 2026-11-28: tpe-none-repeat2x1)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "replay_study.jsonl")
    args = parser.parse_args()
    labels = args.candidate or list(CANDIDATES)
    shipped = args.shipped or shipped_setting()
    unknown = [label for label in [*labels, shipped] if label not in SETTINGS]
    if unknown:
        parser.error(f"unknown settings {unknown}; known: {', '.join(SETTINGS)}")
    if args.confirm_seed < args.seed + args.replays:
        parser.error("--confirm-seed must be at least --seed + --replays (fresh replays)")
    confirm_replays = args.confirm_replays or args.replays
    table_seed = args.seed if args.confirm_table_seed is None else args.confirm_table_seed
    wanted = list(dict.fromkeys([*labels, shipped]))
    chosen_on = [rows_for(t, wanted, args.replays, args.seed, args.out) for t in args.choose]
    choice = choose([{lbl: rows[lbl] for lbl in labels} for rows in chosen_on], args.margin)
    names = [t.stem.removeprefix("table_") for t in args.choose]
    print(f"\nChoice on {', '.join(names)} ({args.replays} replays each, seed {args.seed}):")
    print_choice(choice, names, [{lbl: rows[lbl] for lbl in labels} for rows in chosen_on])
    print(f"leader {choice.leader}; ties: {', '.join(choice.tied[1:]) or 'none'}; "
          f"chosen {choice.chosen}; confirmed against {shipped}")  # fmt: skip
    against = list(dict.fromkeys([shipped, choice.leader]))
    compared = list(dict.fromkeys([choice.chosen, *against]))
    declared = confirmation_sets(
        args.choose, args.confirm, args.confirm_seed, table_seed, confirm_replays
    )
    sets = {s.name: rows_for(s.table, compared, s.replays, s.seed, args.out) for s in declared}
    print(f"\nConfirmation ({confirm_replays} replays each):")
    confirmed = confirm(choice.chosen, against, sets, shipped, args.margin)
    verdict = "confirmed" if confirmed else "NOT confirmed"
    print(f"{choice.chosen}: {verdict} against {shipped} (margin {args.margin} points)")


if __name__ == "__main__":
    main()
