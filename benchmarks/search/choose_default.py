"""The shipped DePT search chosen under issue 42's protocol: chosen on the replays of some
tables, then confirmed on a table the choice never saw and on fresh replays.

The rule, fixed before the confirmation table was read:

1. **Replays.** Every candidate is replayed ``--replays`` times at ``--seed`` against each
   choice table (``benchmarks.search.replay_study``'s rows: read from its ``--out`` file
   where stored for the same table, setting, replays, seed and draws; replayed and stored
   otherwise).
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
5. **Confirmation** (issue 57, item 5), run once, on data the choice never saw. The chosen
   against the shipped search (``--shipped``: what ``search_spaces/dept.yaml`` ships unless
   given), paired, ``--confirm-replays`` replays (``--replays`` unless given) of each
   confirmation table (``--confirm``) at ``--confirm-table-seed`` (``--seed`` unless given).
   Its margin is tied to the cost it saves: ``--points-per-grid`` (declared; by default the
   goal's own rate, 0.5 points for 0.30 of the grid's trial-steps) times the trial-steps the
   chosen saves against the shipped (median fractions of the grid's, averaged over the choice
   tables); a chosen that costs more must be better by as much. Confirmed when, on every
   confirmation table, the hierarchical 95% interval of the chosen minus the shipped lies
   below that margin. Both settings' figures are printed (held-out regret, its IQM and mean
   with intervals, trial-steps), and the cheapest candidate's as a control: a confirmation it
   would pass as well says little about the chosen. Fresh replays of the choice tables at
   ``--confirm-seed`` are printed beside it for information only: they replay recordings the
   choice read. A confirmation table's replays must be unread (no stored row of that table
   overlaps them) and a confirmation is written to ``--ledger`` when it runs: run again, it
   is shown from there with its date, not judged again.

Every interval is hierarchical (``Paired`` with each replay's held-out seed: the seeds drawn
with replacement, then their replays): replays of one table share its seeds' noise.

Every candidate must have a held-out figure on every table: a setting whose repeats need
every other seed of a 3-seed table is not a candidate.

Usage::

    python -m benchmarks.search.choose_default \\
        --choose benchmarks/results/table_dept_subj.json \\
        --choose benchmarks/results/table_dept_mr.json \\
        --confirm benchmarks/results/table_dept_tweets.json
"""

from __future__ import annotations

import argparse
import datetime
import math
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common.paths import RESULTS, digest
from benchmarks.common.results import ResultsFile
from benchmarks.common.tables import print_table, right_aligned_after
from benchmarks.search.replays import (
    DRAWS,
    SETTINGS,
    as_float,
    read_rows,
    row_key,
    seed_groups,
    shipped_setting,
    stored_rows,
    study_row,
    write_row,
)
from raypeft.search.simulate import CurveTable, Paired
from raypeft.search.simulate.runs import GOAL_COMPUTE, GOAL_POINTS

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
# the confirmation's exchange rate: points of held-out regret a setting may lose per grid's
# worth of trial-steps it saves (the goal's: 0.5 points at 0.30 of the grid)
POINTS_PER_GRID = GOAL_POINTS / GOAL_COMPUTE
LEDGER = RESULTS / "confirmations.jsonl"


@dataclass(frozen=True)
class ConfirmationSet:
    """Replays of one table the chosen setting is confirmed on."""

    table: Path
    seed: int  # the first replay's seed
    replays: int

    @property
    def name(self) -> str:
        return f"{self.table.stem.removeprefix('table_')}, seed {self.seed}"


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
    """``row`` minus ``base`` on the held-out regret, replay by replay; the interval is
    hierarchical where the rows hold each replay's held-out seed."""
    return Paired.of(heldout(row), heldout(base), groups=seed_groups(row))


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


def cost_margin(chosen_steps: float, shipped_steps: float,
                points_per_grid: float = POINTS_PER_GRID) -> float:  # fmt: skip
    """The points of held-out regret the chosen may lose against the shipped: the rate times
    the trial-steps it saves (fractions of the grid's); negative when it costs more."""
    return points_per_grid * (shipped_steps - chosen_steps)


@dataclass(frozen=True)
class Verdict:
    """One setting against the shipped on one confirmation set."""

    label: str
    margin: float
    difference: Paired

    @property
    def passes(self) -> bool:
        return self.difference.mean_ci[1] <= self.margin


def figures(row: dict) -> str:
    """A setting's figures on a set: held-out IQM [interval], mean, median trial-steps."""
    h = row["heldout"]
    ci = h.get("iqm_ci")
    interval = f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""
    mean = sum(v for v in heldout(row) if not math.isnan(v)) / max(h["n"], 1)
    return (f"IQM {fmt(h['iqm'])}{interval}, mean {mean:.2f}; "
            f"trial-steps {fmt(row['steps']['median'])}")  # fmt: skip


def confirm(settings: dict[str, float], sets: dict[str, dict], shipped: str) -> dict:
    """Each of ``settings`` (label -> its margin) against ``shipped`` on each set, printed
    with both settings' figures; label -> whether it passes on every set."""
    header = [
        "confirmation set",
        "setting",
        "its figures",
        f"{shipped}'s figures",
        "minus shipped [seeds, then replays]",
        "replays only",
        "margin",
        "passes",
    ]
    body, passes = [], dict.fromkeys(settings, True)
    for name, rows in sets.items():
        for label, margin in settings.items():
            verdict = Verdict(label, margin, paired(rows[label], rows[shipped]))
            passes[label] &= verdict.passes
            d = verdict.difference
            body.append([name, label, figures(rows[label]), figures(rows[shipped]),
                         d.describe(), f"[{d.replay_ci[0]:+.2f}, {d.replay_ci[1]:+.2f}]",
                         f"{margin:+.2f}", "yes" if verdict.passes else "no"])  # fmt: skip
    print_table(header, body, right_aligned_after(2, len(header)))
    return passes


def read_by_others(table: Path, seed: int, replays: int, out: Path) -> list[dict]:
    """Stored rows of ``table`` whose replays overlap ``seed`` .. ``seed + replays - 1``:
    replays some earlier study or confirmation has read."""
    table_digest = digest(table)
    return [
        r for r in stored_rows(out)
        if r["table_digest"] == table_digest
        and r["seed"] < seed + replays and seed < r["seed"] + r["replays"]
    ]  # fmt: skip


def declaration(chosen: str, shipped: str, sets: list[ConfirmationSet], rate: float) -> dict:
    return {"chosen": chosen, "shipped": shipped, "points_per_grid": round(rate, 6),
            "sets": [[digest(s.table), s.seed, s.replays] for s in sets]}  # fmt: skip


def ledger_entry(ledger: Path, declared: dict) -> dict | None:
    """The confirmation of ``declared`` the ledger holds, if one ran."""
    return next((e for e in ResultsFile(ledger).rows() if e["declared"] == declared), None)


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
    parser.add_argument(
        "--points-per-grid",
        type=float,
        default=POINTS_PER_GRID,
        help="the confirmation's margin: points of held-out regret per grid's worth of "
        "trial-steps saved against the shipped (default: the goal's, 0.5 / 0.30)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "replay_study.jsonl")
    parser.add_argument("--ledger", type=Path, default=LEDGER,
                        help="the confirmations run so far (each runs once)")  # fmt: skip
    args = parser.parse_args()
    labels = args.candidate or list(CANDIDATES)
    shipped = args.shipped or shipped_setting()
    unknown = [label for label in [*labels, shipped] if label not in SETTINGS]
    if unknown:
        parser.error(f"unknown settings {unknown}; known: {', '.join(SETTINGS)}")
    if args.confirm_seed < args.seed + args.replays:
        parser.error("--confirm-seed must be at least --seed + --replays (fresh replays)")
    wanted = list(dict.fromkeys([*labels, shipped]))
    chosen_on = [rows_for(t, wanted, args.replays, args.seed, args.out) for t in args.choose]
    choice = choose([{lbl: rows[lbl] for lbl in labels} for rows in chosen_on], args.margin)
    names = [t.stem.removeprefix("table_") for t in args.choose]
    print(f"\nChoice on {', '.join(names)} ({args.replays} replays each, seed {args.seed}):")
    print_choice(choice, names, [{lbl: rows[lbl] for lbl in labels} for rows in chosen_on])
    print(f"leader {choice.leader}; ties: {', '.join(choice.tied[1:]) or 'none'}; "
          f"chosen {choice.chosen}; confirmed against {shipped}")  # fmt: skip
    confirmation(args, parser, choice, chosen_on, labels, shipped)


def confirmation(args, parser, choice: Choice, chosen_on: list[dict], labels: list[str],
                 shipped: str) -> None:  # fmt: skip
    """Step 5: the chosen, and the cheapest candidate as a control, against the shipped search
    on the --confirm tables (once: refused on replays read before, recorded in the ledger and
    shown from it when run again), then on fresh replays of the choice tables (information)."""
    steps = {lbl: sum(rows[lbl]["steps"]["median"] for rows in chosen_on) / len(chosen_on)
             for lbl in dict.fromkeys([*labels, shipped])}  # fmt: skip
    confirm_replays = args.confirm_replays or args.replays
    table_seed = args.seed if args.confirm_table_seed is None else args.confirm_table_seed
    control = min(labels, key=lambda lbl: (round(steps[lbl], 6), labels.index(lbl)))
    margins = {lbl: cost_margin(steps[lbl], steps[shipped], args.points_per_grid)
               for lbl in dict.fromkeys([choice.chosen, control])}  # fmt: skip
    compared = list(dict.fromkeys([*margins, shipped]))
    unseen = [ConfirmationSet(t, table_seed, confirm_replays) for t in args.confirm]
    fresh = [ConfirmationSet(t, args.confirm_seed, confirm_replays) for t in args.choose]
    if choice.chosen == shipped or not unseen:
        why = "the choice is the shipped search" if unseen else "no --confirm table"
        print(f"\n{why}: nothing to confirm")
        return
    declared = declaration(choice.chosen, shipped, unseen, args.points_per_grid)
    entry = ledger_entry(args.ledger, declared)
    if entry is None:
        for s in unseen:
            if read := read_by_others(s.table, s.seed, s.replays, args.out):
                first = read[0]
                parser.exit(2, f"--confirm {s.table} at --confirm-table-seed {s.seed}: its "
                            f"replays were read before ({first['setting']}, seed "
                            f"{first['seed']}, {first['replays']} replays, {first.get('date')}"
                            f"); a confirmation runs once on unread replays: choose a seed past "
                            f"{max(r['seed'] + r['replays'] for r in read)}\n")  # fmt: skip
    print(
        f"\nMargins tied to the trial-steps saved against {shipped} "
        f"({steps[shipped]:.2f} of the grid's), {args.points_per_grid:.2f} points per grid: "
        + "; ".join(f"{lbl} {steps[lbl]:.2f} -> {m:+.2f}" for lbl, m in margins.items())
    )
    sets = {s.name: rows_for(s.table, compared, s.replays, s.seed, args.out) for s in unseen}
    print(
        f"\nConfirmation on tables the choice never read ({confirm_replays} replays each"
        + (f"; run once on {entry['date']}, shown again" if entry else "")
        + "):"
    )
    judged = confirm(margins, sets, shipped)
    passes = entry["passes"] if entry else judged  # a confirmation is judged once
    if entry is None:
        ResultsFile(args.ledger).append(
            {"declared": declared, "date": datetime.date.today().isoformat(), "passes": passes}
        )
    info = {s.name: rows_for(s.table, compared, s.replays, s.seed, args.out) for s in fresh}
    print(
        f"\nFor information, fresh replays of the choice tables ({confirm_replays} each; "
        "the recordings the choice read, not part of the verdict):"
    )
    confirm(margins, info, shipped)
    verdict = "confirmed" if passes[choice.chosen] else "NOT confirmed"
    print(
        f"{choice.chosen}: {verdict} against {shipped} "
        f"(margin {margins[choice.chosen]:+.2f} points)"
    )
    if control != choice.chosen:
        print(
            f"control, the cheapest candidate {control}: "
            f"{'would pass' if passes[control] else 'fails'} "
            f"(margin {margins[control]:+.2f} points)"
        )


if __name__ == "__main__":
    main()
