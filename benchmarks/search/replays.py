"""The replay studies' settings and rows: every search setting the studies compare (the
shipped ``search_spaces/dept.yaml`` experiment with its search set to ``COMMON``, then some
``search.*`` keys changed), one setting replayed against one learning-curve table as one
JSON-able row (:func:`study_row`), and the rows in their results file (JSON lines, one
:class:`~benchmarks.common.results.ResultsFile`), re-scored on reading where stored before the
held-out reference was picked without the held-out seed (:func:`rescored`).
:mod:`~benchmarks.search.replay_study` prints them; :mod:`~benchmarks.search.choose_default`
chooses the shipped default from them.
"""

from __future__ import annotations

import datetime
import functools
import json
import math
import time
from pathlib import Path

from benchmarks.common.paths import REPO, digest
from benchmarks.common.results import ResultsFile
from raypeft.config.loading import load_experiment
from raypeft.search.simulate import CurveTable, simulate
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


def as_float(values: list) -> list[float]:
    """JSON's nulls (NaN written out) back to NaN."""
    return [math.nan if v is None else float(v) for v in values]


def seed_groups(row: dict) -> list[int] | None:
    """Each replay's held-out seed: the top level of the hierarchical intervals (None where
    no seed was held out: the intervals are then over replays)."""
    seeds = row.get("heldout_seeds") or []
    return None if not seeds or None in seeds else seeds
