"""A raypeft learning-curve table as arrays, and how raypeft's study scores a choice on it.

Reads the JSON ``raypeft table`` writes (``raypeft.curves/1``, docs/simulate.md) with the
standard library and numpy only, so that it runs in syne-tune's own environment, where
raypeft's dependencies are not installed. The scoring repeats raypeft's definitions
(:mod:`raypeft.search.simulate.scores` and :func:`raypeft.search.simulate.replay.draw_seeds`)
and a test holds it equal to them on a shipped table (tests/unit/test_synetune_benchmark.py):

- a (configuration, seed)'s value is the best ``val_<metric>`` over its evaluations (what its
  checkpoint keeps); a configuration's quality is its mean over the table's seeds;
- replay ``i`` holds out seed ``seeds[i % n]`` and trains every trial on one common seed
  (``search.trial_seed: fixed``), ``usable[(i // n) % (n - 1)]``;
- the held-out regret of a choice is the reference's value on the held-out seed minus the
  chosen one's, in points (x100), the reference being the configuration of the best mean over
  the *other* seeds (issue 57: picked with the scoring seed, it inflated the regret);
- a replay's anytime curve: after each trial that ended (in the order they ended), the trial
  with the best checkpoint value among the ended ones (a tie: the one created first), against
  the steps those trials trained, as a fraction of the full grid's.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

TABLE_FORMAT = "raypeft.curves/1"
POINTS = 100.0
OBJECTIVES = ("val_accuracy", "val_loss", "elapsed_time")  # the exported objectives


@dataclass(frozen=True)
class Curves:
    """One table: configurations x seeds x evaluations, for the metric, the loss and the wall.

    ``values[name]`` has shape (configurations, seeds, evaluations); NaN where the table
    recorded no curve for a (configuration, seed) (a partial recording)."""

    path: Path
    name: str  # the recording's experiment name
    metric: str  # "accuracy": the table's ``val_<metric>`` is what checkpoints keep
    mode: str  # "max" or "min"
    keys: list[str]  # the searched keys, sorted
    configurations: list[dict]  # in the order the table first holds them
    seeds: list[int]  # the recorded seeds, sorted
    steps: list[int]  # the training steps at each evaluation (the fidelity)
    values: dict[str, np.ndarray]
    raw: dict  # the whole JSON (experiment, dims, source), for the dataset card

    @property
    def max_steps(self) -> int:
        return self.steps[-1]

    @property
    def concurrency(self) -> int:
        return int(self.raw.get("source", {}).get("concurrency", 1))

    @property
    def complete(self) -> bool:
        """Every configuration recorded at every seed."""
        return not np.isnan(self.values["val_loss"]).any()

    def sha256(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()

    def space(self) -> dict[str, list]:
        """Each key and its values, sorted."""
        return {k: sorted({c[k] for c in self.configurations}) for k in self.keys}

    def index(self, config: dict) -> int:
        """The row of ``config`` (its searched keys; others ignored)."""
        wanted = tuple(config[k] for k in self.keys)
        for i, c in enumerate(self.configurations):
            if tuple(c[k] for k in self.keys) == wanted:
                return i
        raise KeyError(f"{config} is not a configuration of {self.path.name}")

    def final(self) -> np.ndarray:
        """(configurations, seeds): what each checkpoint keeps, the best metric value."""
        metric = self.values[f"val_{self.metric}"]
        return np.nanmax(metric, axis=2) if self.mode == "max" else np.nanmin(metric, axis=2)

    def sign(self) -> int:
        return 1 if self.mode == "max" else -1


def load(path: Path) -> Curves:
    """The table at ``path``; a file of another format is a ValueError naming it."""
    path = Path(path)
    data = json.loads(path.read_text())
    if data.get("format") != TABLE_FORMAT:
        raise ValueError(f"{path}: format is {data.get('format')!r}, not {TABLE_FORMAT!r}")
    curves = data["curves"]
    keys = sorted({k for c in curves for k in c["params"]})
    configurations: list[dict] = []
    for c in curves:
        if c["params"] not in configurations:
            configurations.append(c["params"])
    seeds = sorted({c["seed"] for c in curves})
    steps = sorted({s for c in curves for s in c["steps"]})
    metric = f"val_{data['metric']}"
    shape = (len(configurations), len(seeds), len(steps))
    values = {name: np.full(shape, np.nan) for name in (metric, "val_loss", "wall_s")}
    for c in curves:
        row, col = configurations.index(c["params"]), seeds.index(c["seed"])
        at = [steps.index(s) for s in c["steps"]]
        values[metric][row, col, at] = c["values"][metric]
        values["val_loss"][row, col, at] = c["values"]["val_loss"]
        values["wall_s"][row, col, at] = c["wall_s"]
    return Curves(path, data["experiment"]["name"], data["metric"], data["mode"], keys,
                  configurations, seeds, steps, values, data)  # fmt: skip


@dataclass(frozen=True)
class Draw:
    """The seeds replay ``replay`` sees: the one every trial trains on, the one held out."""

    replay: int
    common: int  # a recorded seed (its value, not its index)
    heldout: int | None

    @classmethod
    def of(cls, curves: Curves, replay: int, spare: int = 0) -> Draw:
        """As :func:`raypeft.search.simulate.replay.draw_seeds` with ``trial_seed: fixed``
        (``spare``: the other seeds ``repeat_best`` needs)."""
        seeds = curves.seeds
        heldout = seeds[replay % len(seeds)] if len(seeds) > spare + 1 else None
        usable = [s for s in seeds if s != heldout]
        return cls(replay, usable[(replay // len(seeds)) % len(usable)], heldout)


@dataclass(frozen=True)
class Quality:
    """Each configuration's seed-mean and its value at each seed, as raypeft's study has them."""

    final: np.ndarray  # (configurations, seeds), in the metric's units (not points)
    sign: int
    seeds: list[int]

    @classmethod
    def of(cls, curves: Curves) -> Quality:
        return cls(curves.final(), curves.sign(), curves.seeds)

    @property
    def best(self) -> int:
        """The configuration of the best seed-mean (a tie: the first in the table)."""
        return int(np.argmax(self.sign * self.final.mean(axis=1)))

    def regret(self, chosen: int) -> float:
        """In-sample: points below the best seed-mean."""
        means = self.final.mean(axis=1)
        return POINTS * self.sign * float(means[self.best] - means[chosen])

    def best_without(self, seed: int) -> int:
        """The configuration of the best mean over the seeds other than ``seed`` (a tie: the
        first in the table)."""
        others = [i for i, s in enumerate(self.seeds) if s != seed]
        return int(np.argmax(self.sign * self.final[:, others].mean(axis=1)))

    def heldout_regret(self, chosen: int, seed: int | None) -> float:
        """Points below the reference, both on the held-out ``seed`` (NaN: none); the
        reference is the best configuration by the other seeds' mean (:meth:`best_without`)."""
        if seed is None:
            return math.nan
        col, best = self.seeds.index(seed), self.best_without(seed)
        return POINTS * self.sign * float(self.final[best, col] - self.final[chosen, col])

    def reference_inflation(self, seed: int) -> float:
        """Points by which the reference picked with ``seed`` (before issue 57) overstated
        held-out regret on it."""
        col = self.seeds.index(seed)
        return POINTS * self.sign * float(self.final[self.best, col]
                                          - self.final[self.best_without(seed), col])  # fmt: skip


@dataclass(frozen=True)
class EndedTrial:
    """A trial of a replay once it ended: its configuration's row, how far it trained, its
    checkpoint's value (the best metric it reported), when it was created and when it ended."""

    row: int
    steps: int
    best: float
    created: int
    ended_s: float


def anytime(trials: list[EndedTrial], sign: int, grid_steps: int) -> list[tuple]:
    """(steps fraction, ended_s, chosen row) after each trial that ended, in the order they
    ended: raypeft's :func:`~raypeft.search.simulate.scores.anytime` with ``choose_best``
    over every ended trial (stopped ones included: the scheduler's metric is not the
    objective), a tie going to the trial created first."""
    points, spent, done = [], 0, []
    for trial in sorted(trials, key=lambda t: (t.ended_s, t.created)):
        spent += trial.steps
        done.append(trial)
        chosen = max(sorted(done, key=lambda t: t.created), key=lambda t: sign * t.best)
        points.append((spent / grid_steps, trial.ended_s, chosen.row))
    return points


def at_budget(points: list[tuple], budget: float) -> tuple | None:
    """The last anytime point within ``budget`` (a steps fraction); None before the first."""
    reached = [p for p in points if p[0] <= budget + 1e-12]
    return reached[-1] if reached else None


def grid_wall(curves: Curves, seed: int, workers: int) -> float:
    """Simulated seconds of the full grid on ``seed``: every configuration to its end, in the
    table's order, ``workers`` at a time (each starts when a worker is free)."""
    col = curves.seeds.index(seed)
    free = [0.0] * workers
    for row in range(len(curves.configurations)):
        start = min(free)
        free[free.index(start)] = start + float(np.nanmax(curves.values["wall_s"][row, col]))
    return max(free)
