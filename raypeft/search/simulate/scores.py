"""How a replayed search did, and how many replays did: regret, compute, anytime curves.

A configuration's quality is its seed-mean: the mean over the table's seeds of the value its
checkpoint holds at the end (``best_val_<metric>`` of a full-length trial). The regret of a
search is the table's best seed-mean minus the seed-mean of the configuration it chose, in
points (x100) and normalised between the table's median configuration (1) and its best (0).
Compute is counted in trial-steps and in simulated wall time, as fractions of the full grid's
(every configuration of the replayed space once, to its end, at the same concurrency).
Over replays: the median and the interquartile mean (IQM), each with a bootstrap 95%
interval, and the 25th and 75th percentiles. Two searches replayed on the same seed
draws pair by replay index: :class:`Paired` gives their mean difference, its bootstrap
interval, the wins and losses, and Wilcoxon's signed-rank test. Where each replay's held-out
seed is given, the intervals are hierarchical (:func:`hierarchical_interval`: seeds, then
replays), the headline since issue 57: replays of one table share its seeds' noise.
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

    def best_without(self, seed: int) -> str:
        """The configuration of the best mean over the seeds other than ``seed`` (a tie: the
        first in the table): the reference a choice scored on ``seed`` is measured against."""

        def mean(key: str) -> float:
            return statistics.fmean(v for s, v in self.values[key].items() if s != seed)

        return max(self.means, key=lambda k: self.sign * mean(k))

    def heldout_regret(self, configuration: str, seed: int | None) -> float:
        """Points below the reference of ``configuration``'s value on the held-out ``seed``
        (NaN when no seed was held out); the reference is the configuration of the best mean
        over the *other* seeds (:meth:`best_without`), scored on the same seed. The replay
        never saw that seed, so the chosen configuration's value there is an unbiased draw of
        its quality; a reference picked with that seed would be the best of noisy draws on
        it, biased upwards (issue 57: by 0.65-1.25 points on DePT's tables), so it is picked
        without it. Comparing on the same seed cancels the seed's own effect (one seed can be
        lower for every configuration). The figure can be negative: the choice beat the
        reference on that seed."""
        if seed is None:
            return math.nan
        best = self.values[self.best_without(seed)][seed]
        return POINTS * self.sign * (best - self.values[configuration][seed])

    def reference_inflation(self, seed: int) -> float:
        """Points by which a reference picked *with* ``seed`` (the best seed-mean over every
        seed) overstated held-out regret on it: its value on ``seed`` minus that of
        :meth:`best_without`'s. Held-out regrets scored before issue 57 minus this are the
        figures :meth:`heldout_regret` gives now (the choice does not depend on it)."""
        old, new = self.values[self.best][seed], self.values[self.best_without(seed)][seed]
        return POINTS * self.sign * (old - new)

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
    def of(cls, values: list[float], seed: int = 0, groups: list | None = None) -> Spread:
        """``groups``: each value's seed (the replay's held-out seed); given, the intervals
        are :func:`hierarchical_interval`'s (seeds, then replays), else over replays."""
        kept = [i for i, v in enumerate(values) if not math.isnan(v)]
        x = np.asarray([values[i] for i in kept], dtype=float)
        if len(x) == 0:
            nan = (math.nan, math.nan)
            return cls(0, math.nan, nan, math.nan, nan, math.nan, math.nan)
        g = None if groups is None else [groups[i] for i in kept]
        return cls(
            n=len(x),
            median=float(np.median(x)),
            median_ci=_interval(x, np.median, seed, g),
            iqm=float(stats.trim_mean(x, 0.25)),
            iqm_ci=_interval(x, iqm, seed, g),
            q25=float(np.percentile(x, 25)),
            q75=float(np.percentile(x, 75)),
        )


def iqm(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """The interquartile mean (the mean of the middle half)."""
    return stats.trim_mean(x, 0.25, axis=axis)


def _interval(x: np.ndarray, statistic, seed: int, groups=None) -> tuple[float, float]:
    """A bootstrap 95% percentile interval of ``statistic`` (a point where all agree):
    hierarchical over ``groups`` where given, else over the values."""
    if len(x) < 2 or np.all(x == x[0]):
        return float(statistic(x)), float(statistic(x))
    if groups is not None:
        return hierarchical_interval(x, groups, statistic, seed)
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


def hierarchical_interval(
    x, groups, statistic=np.mean, seed: int = 0, resamples: int = 2000
) -> tuple[float, float]:
    """A two-level bootstrap 95% percentile interval of ``statistic`` (a numpy reduction
    taking ``axis``) over ``x``: each resample draws the groups (seeds) with replacement,
    then, within each drawn group, its values (replays) with replacement, and takes
    ``statistic`` of them all.

    Replays of one table are not independent samples: every replay that holds out the same
    recorded seed is scored on that seed's draw of every configuration, so 200 replays of a
    5-seed table are 5 draws of the seed noise, each averaged over 40 replays. An interval
    over replays alone treats them as 200 draws and is too narrow (issue 57, item 5: four
    200-replay sets of one comparison gave +0.20, +0.16, -0.10 and +0.06). Drawing seeds first
    puts the seed-to-seed spread into the interval; with 3 seeds it can take only a few
    values, and is as coarse as that evidence is. One group: the interval over replays."""
    x = np.asarray(x, dtype=float)
    labels = list(dict.fromkeys(groups))
    members = [np.flatnonzero(np.asarray([g == label for g in groups])) for label in labels]
    if len(x) < 2 or np.all(x == x[0]):
        value = float(statistic(x))
        return value, value
    rng = np.random.default_rng(seed)
    sizes = {len(m) for m in members}
    if len(sizes) == 1:  # as many replays per seed (the rotation's usual case): in one go
        size, table = sizes.pop(), np.stack(members)
        drawn = rng.integers(len(members), size=(resamples, len(members), 1))
        within = rng.integers(size, size=(resamples, len(members), size))
        values = statistic(x[table[drawn, within]].reshape(resamples, -1), axis=-1)
        low, high = np.percentile(values, [2.5, 97.5])
        return float(low), float(high)
    values = np.empty(resamples)
    for r in range(resamples):
        drawn = rng.integers(len(members), size=len(members))
        index = np.concatenate(
            [members[k][rng.integers(len(members[k]), size=len(members[k]))] for k in drawn]
        )
        values[r] = statistic(x[index])
    low, high = np.percentile(values, [2.5, 97.5])
    return float(low), float(high)


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
    p_value: float  # two-sided, over replays as if independent; NaN when every pair ties
    replay_ci: tuple[float, float] = (math.nan, math.nan)  # the interval over replays alone
    seeds: int = 0  # groups of the hierarchical interval (0: the interval is over replays)

    @classmethod
    def of(cls, a: list[float], b: list[float], seed: int = 0, groups: list | None = None
           ) -> Paired:  # fmt: skip
        """``groups``: each replay's seed (its held-out seed); given, ``mean_ci`` is
        :func:`hierarchical_interval`'s (seeds, then replays) and ``replay_ci`` the interval
        over replays alone, which treats them as independent (too narrow: issue 57)."""
        if len(a) != len(b) or (groups is not None and len(groups) != len(a)):
            raise ValueError(
                f"paired figures need as many replays: {len(a)} against {len(b)}"
                + ("" if groups is None else f" and {len(groups)} seeds")
            )
        kept = [i for i, (x, y) in enumerate(zip(a, b, strict=True))
                if not (math.isnan(x) or math.isnan(y))]  # fmt: skip
        d = np.asarray([a[i] - b[i] for i in kept])
        if len(d) == 0:
            nan = (math.nan, math.nan)
            return cls(0, math.nan, nan, 0, 0, 0, math.nan, nan, 0)
        g = None if groups is None else [groups[i] for i in kept]
        ties = int(np.sum(d == 0))
        p_value = math.nan
        if ties < len(d):
            p_value = float(stats.wilcoxon(d, zero_method="pratt").pvalue)
        return cls(
            n=len(d),
            mean=float(np.mean(d)),
            mean_ci=_interval(d, np.mean, seed, g),
            lower=int(np.sum(d < 0)),
            higher=int(np.sum(d > 0)),
            ties=ties,
            p_value=p_value,
            replay_ci=_interval(d, np.mean, seed),
            seeds=0 if g is None else len(set(g)),
        )

    def describe(self, digits: int = 2) -> str:
        """``+0.49 [0.17, 0.84] (12 lower, 5 higher, 13 equal; Wilcoxon p = 0.01)``."""
        if self.n == 0:
            return "-"
        f = f"{{:+.{digits}f}}"
        low, high = (f.format(v) for v in self.mean_ci)
        p = "-" if math.isnan(self.p_value) else f"{self.p_value:.3g}"
        over = f"; {self.seeds} seeds" if self.seeds else ""
        return (
            f"{f.format(self.mean)} [{low}, {high}] ({self.lower} lower, {self.higher} higher, "
            f"{self.ties} equal{over}; Wilcoxon p over replays = {p})"
        )
