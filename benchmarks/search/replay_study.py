"""Search defaults chosen by the numbers (issue 25, item 4): settings replayed against tables.

Every setting below is the shipped ``search_spaces/dept.yaml`` experiment (its space, data,
steps) with its search set to ``COMMON`` (TPE, ASHA on validation loss, 12 samples: the file's
search until 2026-11-26) and then some ``search.*`` keys changed; the row whose search is the
file's is marked "(shipped)". Two references replay DePT's whole grid (m included) once per
configuration: alone, and with its top 3 trained again on 2 more seeds. Each setting is
replayed ``--replays`` times (default 30) against each learning-curve table given
(``raypeft table``'s files) by :func:`raypeft.search.simulate.simulate`, the same Optuna
searcher and Tune scheduler objects ``raypeft tune`` builds, on a simulated clock. Per table it
prints one row per setting: the chosen configuration's regret (points below the table's best
seed-mean) as median [25th-75th percentile], the median's bootstrap 95% interval and the
interquartile mean, the compute (trial-steps and simulated wall time, fractions of the full
grid's on the same seed draws), and whether the issue's goal is met (regret within 0.5 points
or the best configuration's standard error over seeds, at <= 0.30 of the grid's trial-steps).

Replays see the recorded seeds as the setting's search trains them (``search.trial_seed``:
the file's ``fixed`` puts one recorded seed under every trial of a replay, rotated across
replays) and hold one seed out in rotation where the table has one to spare: the regret the
study leads with is scored on it; the in-sample regret (by seed-mean, the seeds the replay
saw included) is the second column. Every setting replays the same draws for the same
``--seed``, so settings pair by replay index: each row shows its paired difference from
``--baseline`` (mean, bootstrap 95% interval, Wilcoxon's signed-rank p). Choose on one
``--seed`` and confirm on another: a setting chosen as the best of many on the same replays
is flattered by them (the winner's curse).

Results are appended to ``--out`` (JSON lines) as each setting finishes, so an interrupted
study continues where it stopped: a setting already there for the same table, replays and
seed is not replayed again, and is printed marked "stored" with its date. ``--only`` replays
the settings it names whatever is stored, and replaces their stored rows.

``--figures DIR`` also draws, per table, ``raypeft simulate``'s two figures with the settings
named by ``--figure-setting`` side by side (anytime regret against compute, and each replay's
compute and regret): ``DIR/<table>-anytime.png`` and ``DIR/<table>-tradeoff.png``.

Usage::

    python -m benchmarks.search.replay_study --table benchmarks/results/table_dept_subj.json
    python -m benchmarks.search.replay_study --table T1.json --table T2.json --replays 30 \\
        --only tpe-asha-loss --out benchmarks/results/replay_study.jsonl
    python -m benchmarks.search.replay_study --table T.json --figures docs/figures \
        --figure-setting tpe-none-repeat2x1 --figure-setting tpe-asha-loss
    python -m benchmarks.search.replay_study --table T.json --seed 1000   # fresh replays: confirm
    python -m benchmarks.search.replay_study --table T.json --replays 200 --seed 3000 --stored \
        --only tpe-asha-loss-repeat3x1 --baseline tpe-none-repeat2x1   # stored rows, re-read

Intervals are hierarchical (issue 57, item 5): each replay's held-out seed is drawn first,
then its replays (:func:`raypeft.search.simulate.scores.hierarchical_interval`); rows stored
before the held-out reference was picked without the held-out seed are re-scored on reading
(:func:`rescored`).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from benchmarks.common.paths import RESULTS, digest
from benchmarks.common.tables import print_table, right_aligned_after
from benchmarks.search.replays import (
    DRAWS,
    SETTINGS,
    as_float,
    read_rows,
    row_key,
    search_with,
    seed_groups,
    shipped_setting,
    study_row,
    write_row,
)
from raypeft.reporting.replay_figures import draw_anytime, draw_tradeoff
from raypeft.search.simulate import CurveTable, Paired, simulate


def cell(figure: dict, digits: int = 2) -> str:
    if not figure["n"]:
        return "-"
    f = f"{{:.{digits}f}}"
    return f"{f.format(figure['median'])} [{f.format(figure['q25'])}-{f.format(figure['q75'])}]"


def paired_cell(row: dict, base: dict | None, figure: str) -> str:
    """``row`` minus ``base`` replay by replay on ``figure``: mean [95% CI], Wilcoxon p."""
    if base is None or row is base:
        return "(baseline)" if row is base else "-"
    paired = Paired.of(
        as_float(row["per_replay"][figure]),
        as_float(base["per_replay"][figure]),
        groups=seed_groups(row),
    )
    if paired.n == 0:
        return "-"
    p = "-" if math.isnan(paired.p_value) else f"{paired.p_value:.2g}"
    low, high = paired.mean_ci
    return f"{paired.mean:+.2f} [{low:+.2f}, {high:+.2f}] p={p}"


def goal_cell(goal: dict) -> str:
    """Met or missed, and on which regret: the held-out seed's, or in-sample where the table
    had no seed to spare."""
    verdict = "met" if goal["met"] else "missed"
    figure = "held-out" if goal.get("scored_on") == "heldout" else "in-sample"
    return f"{verdict} ({figure})"


def print_rows(rows: list[dict], baseline: str, fresh: set[tuple]) -> None:
    """One line per setting; rows not replayed by this invocation say so, with their date."""
    header = [
        "setting", "regret, held-out seed: median [IQR]", "IQM", f"paired vs {baseline}",
        "in-sample regret: median [IQR]", "trial-steps / grid", "wall / grid", "goal",
    ]  # fmt: skip
    shipped = shipped_setting()
    base = next((r for r in rows if r["setting"] == baseline), None)
    body = []
    for r in rows:
        label = r["setting"] + (" (shipped)" if r["setting"] == shipped else "")
        if row_key(r) not in fresh:
            label += f" (stored {r.get('date', 'earlier')})"
        heldout = r["heldout"]
        body.append([
            label,
            cell(heldout) if heldout["n"] else "(no seed to spare)",
            f"{heldout['iqm']:.2f}" if heldout["n"] else "-",
            paired_cell(r, base, "heldout" if heldout["n"] else "regret"),
            cell(r["regret"]),
            cell(r["steps"]),
            cell(r["wall"]),
            goal_cell(r["goal"]),
        ])  # fmt: skip
    print_table(header, body, right_aligned_after(1, len(header)))


def draw_figures(labels: list[str], table_path: Path, table: CurveTable, replays: int,
                 seed: int, folder: Path) -> None:  # fmt: skip
    """``raypeft simulate``'s figures for ``labels`` side by side, named after the table."""
    sims = [
        simulate(search_with(SETTINGS[label]), table, replays=replays, seed=seed, label=label)
        for label in labels
    ]
    folder.mkdir(parents=True, exist_ok=True)
    anytime = draw_anytime({s.name: s.anytime_band() for s in sims}, folder)
    tradeoff = draw_tradeoff(
        {s.name: [(r.steps, r.regret) for r in s.scores] for s in sims}, folder
    )
    for drawn in (anytime, tradeoff):
        drawn.replace(folder / f"{table_path.stem}-{drawn.name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", action="append", type=Path, required=True)
    parser.add_argument("--replays", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0,
                        help="offsets the replays' draws and sampler seeds: fresh replays "
                        "with --seed >= the first study's --replays")  # fmt: skip
    parser.add_argument("--only", action="append",
                        help="replay these settings again, whatever is stored (default: every "
                        "setting not stored yet)")  # fmt: skip
    parser.add_argument("--baseline", default="tpe-asha-loss",
                        help="the setting every row is paired with (default: the search shipped "
                        "before the study)")  # fmt: skip
    parser.add_argument("--stored", action="store_true",
                        help="replay nothing: print the stored rows (re-scored, with "
                        "hierarchical intervals) of --only or every setting")  # fmt: skip
    parser.add_argument("--out", type=Path, default=RESULTS / "replay_study.jsonl")
    parser.add_argument("--figures", type=Path, help="folder for the comparison figures")
    parser.add_argument("--figure-setting", action="append", default=[],
                        help="a setting in the figures (repeatable; default: shipped)")  # fmt: skip
    args = parser.parse_args()
    labels = args.only or list(SETTINGS)
    figured = args.figure_setting or [shipped_setting()]
    unknown = [label for label in [*labels, *figured, args.baseline] if label not in SETTINGS]
    if unknown:
        parser.error(f"unknown settings {unknown}; known: {', '.join(SETTINGS)}")
    done = {row_key(r) for r in read_rows(args.out)}
    fresh: set[tuple] = set()
    for table_path in args.table:
        table, table_digest = CurveTable.load(table_path), digest(table_path)
        for label in [] if args.stored else labels:
            key = (table_digest, label, args.replays, args.seed, DRAWS)
            if key in done and not args.only:
                continue
            row = study_row(label, table_path, table, args.replays, args.seed)
            write_row(args.out, row, replacing=key in done)
            fresh.add(key)
            print(f"{table_path.name}: {label}: {row['seconds']} s", flush=True)
        if args.figures:
            draw_figures(figured, table_path, table, args.replays, args.seed, args.figures)
        shown = {*labels, args.baseline}
        every = [
            r for r in read_rows(args.out)
            if r["table_digest"] == table_digest and r["setting"] in shown
            and r["replays"] == args.replays and r["seed"] == args.seed
            and r.get("draws") == DRAWS
        ]  # fmt: skip
        print(f"\n{table_path} ({args.replays} replays per setting, seed {args.seed}):")
        print_rows(every, args.baseline, fresh)


if __name__ == "__main__":
    main()
