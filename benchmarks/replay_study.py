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

    python -m benchmarks.replay_study --table benchmarks/results/table_dept_subj.json
    python -m benchmarks.replay_study --table T1.json --table T2.json --replays 30 \\
        --only tpe-asha-loss --out benchmarks/results/replay_study.jsonl
    python -m benchmarks.replay_study --table T.json --figures docs/figures \
        --figure-setting tpe-none-repeat2x1 --figure-setting tpe-asha-loss
    python -m benchmarks.replay_study --table T.json --seed 1000   # fresh replays: confirm
    python -m benchmarks.replay_study --table T.json --replays 200 --seed 3000 --stored \
        --only tpe-asha-loss-repeat3x1 --baseline tpe-none-repeat2x1   # stored rows, re-read

Intervals are hierarchical (issue 57, item 5): each replay's held-out seed is drawn first,
then its replays (:func:`raypeft.search.simulate.scores.hierarchical_interval`); rows stored
before the held-out reference was picked without the held-out seed are re-scored on reading
(:func:`rescored`).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import math
import time
from pathlib import Path

from benchmarks.common.paths import REPO, RESULTS, digest
from benchmarks.common.results import ResultsFile
from benchmarks.common.tables import print_table, right_aligned_after
from raypeft.config.loading import load_experiment
from raypeft.reporting.replay_figures import draw_anytime, draw_tradeoff
from raypeft.search.simulate import CurveTable, Paired, simulate
from raypeft.search.simulate.records import FIGURES, nan_as_null
from raypeft.search.simulate.runs import within_goal
from raypeft.search.simulate.scores import Quality, Spread

BASE = REPO / "search_spaces" / "dept.yaml"
DRAWS = "trial_seed+heldout/1"  # replays draw seeds as searches do and hold one out (issue 42)
ASHA = {"type": "asha", "grace_period": 1, "reduction_factor": 3, "metric": "val_loss"}
NONE = {"type": "none"}
# every setting starts from this search (the file's until 2026-11-26), whatever ships now
COMMON = {"sampler": "tpe", "num_samples": 12, "answer_repeats": True, "scheduler": ASHA,
          "repeat_best": None}  # fmt: skip
# the references: every configuration of DePT's grid once, m included (what the paper runs)
GRID = {"sampler": "grid", "num_samples": 48, "scheduler": NONE,
        "space": {"method.prompt_length": {"grid": [20, 40, 60, 80]}}}  # fmt: skip

# label -> search.* overrides of COMMON ("space": space overrides)
SETTINGS: dict[str, dict] = {
    "tpe-asha-loss": {},
    "tpe-none": {"scheduler": NONE},
    "tpe-asha-accuracy": {"scheduler": {**ASHA, "metric": "val_accuracy"}},
    "tpe-asha-loss-grace2": {"scheduler": {**ASHA, "grace_period": 2}},
    "tpe-asha-loss-rf2": {"scheduler": {**ASHA, "reduction_factor": 2}},
    "tpe-hyperband-loss": {"scheduler": {**ASHA, "type": "hyperband"}},
    "tpe-median-loss": {"scheduler": {"type": "median", "grace_period": 1, "metric": "val_loss"}},
    "tpe-asha-loss-n6": {"num_samples": 6},
    "tpe-asha-loss-n18": {"num_samples": 18},
    "tpe-asha-loss-n24": {"num_samples": 24},
    "tpe-asha-loss-retrain-repeats": {"answer_repeats": False},
    # at 12 samples the (a1, a2) grid never repeats; at 24 every pair comes twice
    "tpe-asha-loss-n24-retrain-repeats": {"num_samples": 24, "answer_repeats": False},
    # a configuration's score is one draw of its seeds: train the top ones again, best mean wins
    "tpe-asha-loss-repeat3x1": {"repeat_best": {"top_k": 3, "seeds": 1}},
    "tpe-asha-loss-repeat3x2": {"repeat_best": {"top_k": 3, "seeds": 2}},
    "tpe-asha-loss-repeat5x1": {"repeat_best": {"top_k": 5, "seeds": 1}},
    "tpe-asha-loss-repeat2x2": {"repeat_best": {"top_k": 2, "seeds": 2}},
    "tpe-asha-loss-n18-repeat3x2": {"num_samples": 18, "repeat_best": {"top_k": 3, "seeds": 2}},
    "tpe-asha-loss-grace2-repeat3x2": {
        "scheduler": {**ASHA, "grace_period": 2},
        "repeat_best": {"top_k": 3, "seeds": 2},
    },  # fmt: skip
    "tpe-none-repeat2x1": {"scheduler": NONE, "repeat_best": {"top_k": 2, "seeds": 1}},
    "tpe-none-repeat3x2": {"scheduler": NONE, "repeat_best": {"top_k": 3, "seeds": 2}},
    "random-asha-loss": {"sampler": "random"},
    "random-none": {"sampler": "random", "scheduler": NONE},
    "gp-asha-loss": {"sampler": "gp"},
    "gp-none": {"sampler": "gp", "scheduler": NONE},
    # Optuna draws its first n_startup_trials (10) at random: at 12 samples TPE and GP choose
    # almost nothing (issue 42); fewer start-up trials let them act
    "tpe-none-repeat2x1-startup2": {
        "scheduler": NONE,
        "repeat_best": {"top_k": 2, "seeds": 1},
        "startup_trials": 2,
    },  # fmt: skip
    "tpe-none-repeat2x1-startup4": {
        "scheduler": NONE,
        "repeat_best": {"top_k": 2, "seeds": 1},
        "startup_trials": 4,
    },  # fmt: skip
    "tpe-none-repeat2x1-startup6": {
        "scheduler": NONE,
        "repeat_best": {"top_k": 2, "seeds": 1},
        "startup_trials": 6,
    },  # fmt: skip
    "gp-none-repeat2x1-startup4": {
        "sampler": "gp",
        "scheduler": NONE,
        "repeat_best": {"top_k": 2, "seeds": 1},
        "startup_trials": 4,
    },  # fmt: skip
    "tpe-asha-loss-grace2-repeat2x1": {
        "scheduler": {**ASHA, "grace_period": 2},
        "repeat_best": {"top_k": 2, "seeds": 1},
    },  # fmt: skip
    "tpe-asha-loss-grace2-repeat2x1-startup4": {
        "scheduler": {**ASHA, "grace_period": 2},
        "repeat_best": {"top_k": 2, "seeds": 1},
        "startup_trials": 4,
    },  # fmt: skip
    "grid (reference)": GRID,
    "grid-repeat3x2 (reference)": {**GRID, "repeat_best": {"top_k": 3, "seeds": 2}},
}


def search_with(overrides: dict):
    """The shipped DePT file's experiment with its search set to COMMON, then ``overrides``
    (``space`` among them: space entries replaced)."""
    base = load_experiment(BASE)
    overrides = dict(overrides)
    space = base.model_dump(mode="json")["space"] | overrides.pop("space", {})
    search = base.search.model_dump(mode="json") | COMMON | overrides
    data = base.model_dump(mode="json") | {"search": search, "space": space}
    return type(base).model_validate(data)


@functools.cache  # the file does not change during a study
def shipped_setting() -> str:
    """The label whose search is the shipped file's (each is checked to be one of them)."""
    shipped = load_experiment(BASE)
    for label, overrides in SETTINGS.items():
        candidate = search_with(overrides)
        if candidate.search == shipped.search and candidate.space == shipped.space:
            return label
    raise SystemExit(f"{BASE}: its search is none of the settings; add it to SETTINGS")


PER_REPLAY = ("heldout", "regret", "steps")  # kept per replay in each row: settings pair
# how held-out regret's reference is picked: without the held-out seed (issue 57, item 5);
# rows without this field picked it with that seed, and are re-scored on reading
REFERENCE = "without-heldout-seed"


def row_key(row: dict) -> tuple:
    """What a row's figures depend on: the table, the setting, the replays and their seed,
    and how replays draw seeds (rows written before replays drew as searches do lack it)."""
    return (row["table_digest"], row["setting"], row["replays"], row["seed"],
            row.get("draws"))  # fmt: skip


def stored_rows(out: Path) -> list[dict]:
    """The rows as stored."""
    return ResultsFile(out).rows()


def read_rows(out: Path) -> list[dict]:
    """The stored rows, each scored against the reference picked without its held-out seed
    (:func:`rescored`)."""
    rows = []
    for row in stored_rows(out):
        key = json.dumps(row, sort_keys=True)
        if key not in _RESCORED:  # a study reads its file after each row: score each once
            _RESCORED[key] = rescored(row, _quality(row["table"], row["table_digest"]))
        rows.append(_RESCORED[key])
    return rows


_RESCORED: dict[str, dict] = {}


@functools.cache
def _quality(table: str, table_digest: str) -> Quality | None:
    """The quality of the table a row was replayed on; None if the file has changed since."""
    path = REPO / table
    same = path.exists() and digest(path) == table_digest
    return Quality.of(CurveTable.load(path)) if same else None


def rescored(row: dict, quality: Quality | None) -> dict:
    """``row`` with its held-out regret against the reference picked without the held-out
    seed (issue 57, item 5). Rows stored before picked it with that seed; their figures less
    :meth:`Quality.reference_inflation` of each replay's held-out seed are exactly what a
    replay gives now (the choice does not depend on the reference), and their spread is
    recomputed. ``quality`` None: the row's table has changed since (the first round's 3-seed
    MR), so the row keeps its old figures, marked ``"reference": "with-heldout-seed"``."""
    if row.get("reference") == REFERENCE:
        return row
    if quality is None:
        return {**row, "reference": "with-heldout-seed"}
    seeds = row["heldout_seeds"]
    heldout = [
        math.nan if v is None or seed is None else v - quality.reference_inflation(seed)
        for v, seed in zip(row["per_replay"]["heldout"], seeds, strict=True)
    ]
    spread = Spread.of(heldout, groups=None if None in seeds else seeds)
    row = {**row, "reference": REFERENCE, "heldout": spread_figures(spread)}
    row["per_replay"] = {**row["per_replay"], "heldout": heldout}
    if row["goal"].get("scored_on") == "heldout":
        goal = row["goal"]
        met = within_goal(spread.median, goal["tolerance_points"], goal["median_steps"])
        row["goal"] = {**goal, "median_regret": spread.median, "met": met}
    return row


def spread_figures(spread: Spread) -> dict:
    """A spread as a row stores it."""
    return {"n": spread.n, "median": spread.median, "median_ci": list(spread.median_ci),
            "iqm": spread.iqm, "iqm_ci": list(spread.iqm_ci), "q25": spread.q25,
            "q75": spread.q75}  # fmt: skip


def write_row(out: Path, row: dict, replacing: bool) -> None:
    """Append ``row`` to ``out``; ``replacing``: drop the stored rows with its key first."""
    results = ResultsFile(out, key=row_key)
    (results.replace if replacing else results.append)(nan_as_null(row))


def study_row(label: str, table_path: Path, table: CurveTable, replays: int, seed: int) -> dict:
    """Replay one setting against one table; its figures as one JSON-able row."""
    started = time.perf_counter()
    sim = simulate(search_with(SETTINGS[label]), table, replays=replays, seed=seed, label=label)
    row = {
        "setting": label,
        "overrides": SETTINGS[label],
        "table": str(table_path),
        "table_digest": digest(table_path),
        "replays": replays,
        "seed": seed,
        "draws": DRAWS,
        "date": datetime.date.today().isoformat(),
        "seconds": round(time.perf_counter() - started, 1),
        "shipped": label == shipped_setting(),
        "goal": sim.goal(),
        "per_replay": {f: [getattr(s, f) for s in sim.scores] for f in PER_REPLAY},
        "heldout_seeds": [s.heldout_seed for s in sim.scores],
        "reference": REFERENCE,
    }
    for figure in FIGURES:
        row[figure] = spread_figures(sim.spread(figure))
    row["stopped_median"] = sorted(s.stopped for s in sim.scores)[len(sim.scores) // 2]
    return row


def cell(figure: dict, digits: int = 2) -> str:
    if not figure["n"]:
        return "-"
    f = f"{{:.{digits}f}}"
    return f"{f.format(figure['median'])} [{f.format(figure['q25'])}-{f.format(figure['q75'])}]"


def as_float(values: list) -> list[float]:
    """JSON's nulls (NaN written out) back to NaN."""
    return [math.nan if v is None else float(v) for v in values]


def seed_groups(row: dict) -> list[int] | None:
    """Each replay's held-out seed: the top level of the hierarchical intervals (None where
    no seed was held out: the intervals are then over replays)."""
    seeds = row.get("heldout_seeds") or []
    return None if not seeds or None in seeds else seeds


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
