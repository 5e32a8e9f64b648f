"""How a replayed search did, and how many replays did: regret, compute, anytime curves.

A configuration's quality is its seed-mean: the mean over the table's seeds of the value its
checkpoint holds at the end (``best_val_<metric>`` of a full-length trial). The regret of a
search is the table's best seed-mean minus the seed-mean of the configuration it chose, in
points (x100) and normalised between the table's median configuration (1) and its best (0).
Compute is counted in trial-steps and in simulated wall time, as fractions of the full grid's
(every configuration of the replayed space once, to its end, at the same concurrency).
Over replays: the median and the interquartile mean (IQM), each with a bootstrap 95%
interval (scipy), and the 25th and 75th percentiles. Two searches replayed on the same seed
draws pair by replay index: :class:`Paired` gives their mean difference, its bootstrap
interval, the wins and losses, and Wilcoxon's signed-rank test.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

from raypeft.config.space import configuration_key
from raypeft.search.outcome import choose_best
from raypeft.search.results import TrialResult, in_creation_order
from raypeft.search.simulate.table import Curve, CurveTable

POINTS = 100.0  # a metric in [0, 1] (accuracy, F1) reads in points: x100


def final_value(curve: Curve, metric: str, mode: str) -> float:
    """What a full-length trial's checkpoint holds: the best value over its evaluations."""
    values = curve.values[f"val_{metric}"]
    return max(values) if mode == "max" else min(values)


@dataclass(frozen=True)
class Quality:
    """Each configuration's seed-mean and standard error, and the table's best and median."""

    means: dict[str, float]
    errors: dict[str, float]  # standard error of the mean over seeds (0 with one seed)
    sign: int  # +1 when higher is better
    values: dict[str, dict[int, float]] = field(default_factory=dict)  # by seed

    @classmethod
    def of(cls, table: CurveTable, configurations: set[str] | None = None) -> Quality:
        """Over ``configurations`` (those the replayed space can propose; default all)."""
        means, errors, by_seed = {}, {}, {}
        for key, curves in table.by_configuration().items():
            if configurations is not None and key not in configurations:
                continue
            by_seed[key] = {c.seed: final_value(c, table.metric, table.mode) for c in curves}
            values = list(by_seed[key].values())
            means[key] = statistics.fmean(values)
            spread = statistics.stdev(values) if len(values) > 1 else 0.0
            errors[key] = spread / math.sqrt(len(values))
        return cls(means, errors, 1 if table.mode == "max" else -1, by_seed)

    @property
    def best(self) -> str:
        return max(self.means, key=lambda k: self.sign * self.means[k])

    def regret(self, configuration: str) -> float:
        """Points below the best seed-mean (0 for the best configuration)."""
        return POINTS * self.sign * (self.means[self.best] - self.means[configuration])

    def heldout_regret(self, configuration: str, seed: int | None) -> float:
        """Points below the best configuration of ``configuration``'s value on the held-out
        ``seed``, the best configuration's value on that seed being the reference (NaN when
        no seed was held out). The replay never saw that seed, so the chosen configuration's
        value there is an unbiased draw of its quality, where its seed-mean includes the draw
        it was chosen by (the best of noisy draws is biased upwards); comparing on the same
        seed cancels the seed's own effect (one seed can be lower for every configuration)."""
        if seed is None:
            return math.nan
        best = self.values[self.best][seed]
        return POINTS * self.sign * (best - self.values[configuration][seed])

    @property
    def median_gap(self) -> float:
        """Points between the best and the median seed-mean: what normalised regret divides
        by."""
        median = statistics.median(self.means.values())
        return POINTS * self.sign * (self.means[self.best] - median)

    def normalised(self, configuration: str) -> float:
        """Regret over the gap between the best and the median seed-mean (0 best, 1 median)."""
        gap = self.median_gap
        return self.regret(configuration) / gap if gap > 0 else 0.0

    def tolerance(self, goal_points: float) -> tuple[float, str]:
        """The goal's tolerance: ``goal_points``, or the best configuration's standard error
        over seeds if that is larger; and which of the two applies."""
        error = POINTS * self.errors[self.best]
        if error > goal_points:
            return error, "the best configuration's standard error over seeds"
        return goal_points, f"{goal_points:g} points"


def chosen_configuration(trial: TrialResult | None, space_keys, fixed: dict) -> str | None:
    """The configuration key of a chosen trial (its searched values and the fixed ones)."""
    if trial is None:
        return None
    params = {**fixed, **{k: v for k, v in trial.config.items() if k in space_keys}}
    return configuration_key(params)


def anytime(
    trials: list[TrialResult], choose, regret_of, grid_steps: int
) -> list[tuple[float, float]]:
    """(compute fraction, regret of the choice the search would make then) after each trial
    that ended, in the order they ended: the search's best-so-far against what it spent."""
    points, spent = [], 0
    for i, trial in enumerate(trials):
        spent += int(trial.metrics.get("step", 0))
        choice = choose(trials[: i + 1])
        if choice is not None:
            points.append((spent / grid_steps, regret_of(choice)))
    return points


def regret_at(points: list[tuple[float, float]], budget: float) -> float:
    """The regret a search's anytime curve has reached when it has spent ``budget``; NaN
    before its first finished trial."""
    reached = [regret for spent, regret in points if spent <= budget]
    return reached[-1] if reached else math.nan


@dataclass(frozen=True)
class Spread:
    """One figure over replays: median and IQM with bootstrap 95% intervals, quartiles."""

    n: int
    median: float
    median_ci: tuple[float, float]
    iqm: float
    iqm_ci: tuple[float, float]
    q25: float
    q75: float

    @classmethod
    def of(cls, values: list[float], seed: int = 0) -> Spread:
        x = np.asarray([v for v in values if not math.isnan(v)], dtype=float)
        if len(x) == 0:
            nan = (math.nan, math.nan)
            return cls(0, math.nan, nan, math.nan, nan, math.nan, math.nan)
        return cls(
            n=len(x),
            median=float(np.median(x)),
            median_ci=_interval(x, np.median, seed),
            iqm=float(stats.trim_mean(x, 0.25)),
            iqm_ci=_interval(x, lambda v, axis=-1: stats.trim_mean(v, 0.25, axis=axis), seed),
            q25=float(np.percentile(x, 25)),
            q75=float(np.percentile(x, 75)),
        )


def _interval(x: np.ndarray, statistic, seed: int) -> tuple[float, float]:
    """A bootstrap 95% percentile interval of ``statistic`` (a point where all agree)."""
    if len(x) < 2 or np.all(x == x[0]):
        return float(statistic(x)), float(statistic(x))
    result = stats.bootstrap(
        (x,),
        statistic,
        n_resamples=2000,
        confidence_level=0.95,
        method="percentile",
        rng=np.random.default_rng(seed),
        vectorized=False,
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def choose_from(objective, constraints, pruned: bool):
    """``choose_best`` as the search calls it: on the trials in creation order (a tie goes
    to the trial created first), whatever order they ended in."""

    def choose(trials: list[TrialResult]) -> TrialResult | None:
        ordered = in_creation_order(trials)
        return choose_best(ordered, objective, constraints, stopped_are_pruned=pruned)[0]

    return choose


@dataclass(frozen=True)
class Paired:
    """Search A against search B replay by replay (the same seed draws and held-out seed):
    the differences A - B of one figure, their mean with a bootstrap 95% interval, how often A
    was lower (better for regret and compute), higher or equal, and the p-value of Wilcoxon's
    signed-rank test (Pratt's treatment of ties: equal replays count, as they should when two
    searches often choose the same configuration)."""

    n: int
    mean: float
    mean_ci: tuple[float, float]
    lower: int  # replays where A's figure is below B's
    higher: int
    ties: int
    p_value: float  # two-sided; NaN when every pair is a tie

    @classmethod
    def of(cls, a: list[float], b: list[float], seed: int = 0) -> Paired:
        if len(a) != len(b):
            raise ValueError(f"paired figures need as many replays: {len(a)} against {len(b)}")
        d = np.asarray(
            [x - y for x, y in zip(a, b, strict=True) if not (math.isnan(x) or math.isnan(y))]
        )
        if len(d) == 0:
            nan = (math.nan, math.nan)
            return cls(0, math.nan, nan, 0, 0, 0, math.nan)
        ties = int(np.sum(d == 0))
        p_value = math.nan
        if ties < len(d):
            p_value = float(stats.wilcoxon(d, zero_method="pratt").pvalue)
        return cls(
            n=len(d),
            mean=float(np.mean(d)),
            mean_ci=_interval(d, np.mean, seed),
            lower=int(np.sum(d < 0)),
            higher=int(np.sum(d > 0)),
            ties=ties,
            p_value=p_value,
        )

    def describe(self, digits: int = 2) -> str:
        """``+0.49 [0.17, 0.84] (12 lower, 5 higher, 13 equal; Wilcoxon p = 0.01)``."""
        if self.n == 0:
            return "-"
        f = f"{{:+.{digits}f}}"
        low, high = (f.format(v) for v in self.mean_ci)
        p = "-" if math.isnan(self.p_value) else f"{self.p_value:.3g}"
        return (
            f"{f.format(self.mean)} [{low}, {high}] ({self.lower} lower, {self.higher} higher, "
            f"{self.ties} equal; Wilcoxon p = {p})"
        )
