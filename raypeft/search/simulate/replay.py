"""Replay a search against a learning-curve table on a simulated clock.

The replay builds the objects ``raypeft tune`` builds (the Optuna searcher over the study,
behind Ray's ``ConcurrencyLimiter``, and the trial scheduler, from the same functions) and
drives them through the hooks Ray Tune's controller calls, in the order it calls them
(``ray.tune.execution.tune_controller``: the scheduler judges a result first, the searcher
hears it only if the trial goes on, and both hear a trial's end), as syne-tune's simulator
does. Trials do not train: each reports, at the wall time the table recorded for it, the
values one recorded seed of its configuration reached, through the library's own
``evaluation_metrics``. Nothing of ASHA, HyperBand or TPE is re-implemented here.

Which recorded seeds a replay sees follows the search's seed policy (:func:`draw_seeds`), and
one seed of the table is held out of every replay where the table has one to spare: the
choice is scored on it (:meth:`~raypeft.search.simulate.scores.Quality.heldout_regret`).
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import optuna
from ray.tune.experiment import Trial
from ray.tune.schedulers import FIFOScheduler, TrialScheduler
from ray.tune.search import ConcurrencyLimiter, Searcher

from raypeft.config.schema import REPEAT_OF, ExperimentConfig
from raypeft.config.space import SEED_KEY, configuration_key
from raypeft.search.objectives import (
    Constraints,
    ResolvedObjective,
    resolve_objectives,
    stops_on_objective,
)
from raypeft.search.repeats import FixedConfigs, group_repeats, repeat_configs, top_trials
from raypeft.search.results import TrialResult
from raypeft.search.simulate.plan import fixed_values
from raypeft.search.simulate.scores import choose_from
from raypeft.search.simulate.table import Curve, CurveTable
from raypeft.search.study import StudyPlan
from raypeft.search.tuner import optuna_searcher, scheduler
from raypeft.training.evaluation import TargetMetric, best_record, evaluation_metrics
from raypeft.training.result_keys import EVALUATION_KEY, TRIAL_STEPS_KEY


@dataclass
class ReplayedTrial:
    """A trial of a replay: its configuration, the recorded curve it reports, how far it got."""

    trial: Trial
    curve: Curve
    started_s: float
    best: dict[str, float] = field(default_factory=dict)
    reported: int = 0  # evaluations reported so far
    last: dict[str, Any] = field(default_factory=dict)  # its last result


@dataclass
class Replay:
    """What one replayed search did: its trials in the order they ended, and its choice."""

    trials: list[TrialResult]  # every trial that reported, in the order they ended
    ended_s: list[float]  # simulated seconds at which each of them ended
    chosen: TrialResult | None
    wall_s: float  # simulated seconds from the first trial's start to the last one's end
    choose: Callable[[list[TrialResult]], TrialResult | None]  # how the search chooses
    seen: dict[str, set[int]] = field(default_factory=dict)  # configuration -> seeds reported

    def trial_steps(self) -> int:
        """Training steps summed over the replay's trials (the compute it spent)."""
        return sum(int(t.metrics.get("step", 0)) for t in self.trials)


class SimulatedController:
    """What Tune's schedulers may ask their controller: the trials and the live ones."""

    def __init__(self) -> None:
        self.trials: list[Trial] = []

    def get_trials(self) -> list[Trial]:
        return list(self.trials)

    def get_live_trials(self) -> list[Trial]:
        return [t for t in self.trials if t.status in (Trial.PENDING, Trial.RUNNING)]


@dataclass(frozen=True)
class SeedDraw:
    """The recorded seeds one replay sees: the curve each configuration's trials report, the
    order in which ``repeat_best`` draws its other seeds, and the seed held out of the replay
    (``None``: none could be spared) that its choice is scored on."""

    curves: dict[str, Curve]  # configuration -> the curve its search trials report
    # configuration -> its other seeds' curves in the order repeats take them (held-out excluded)
    others: dict[str, list[Curve]] = field(default_factory=dict)
    heldout: int | None = None

    def repeat_curve(self, configuration: str, index: int, seen: set[int]) -> Curve:
        """The curve of the ``index``-th repeat of ``configuration``: the next of its other
        seeds that the replay has not seen yet."""
        unseen = [c for c in self.others[configuration] if c.seed not in seen]
        return unseen[index]

    @classmethod
    def fixed(cls, curves: dict[str, Curve], table: CurveTable) -> SeedDraw:
        """``curves`` as the search's draws, repeats taking the other seeds in seed order
        and nothing held out (for replays whose draws are set by hand)."""
        groups = table.by_configuration()
        others = {key: sorted(groups[key], key=lambda c: c.seed) for key in groups}
        return cls(curves, others, None)


def replay_search(
    cfg: ExperimentConfig, table: CurveTable, draws: SeedDraw, concurrency: int
) -> Replay:
    """Run the search ``cfg`` describes against ``table``: each configuration reports the
    curve ``draws`` holds for it (one recorded seed), at most ``concurrency`` at a time."""
    objectives = resolve_objectives(cfg, (table.metric,))
    constraints = Constraints(cfg.search.constraints)
    study = StudyPlan(
        storage_url="memory",
        storage=optuna.storages.InMemoryStorage(),
        study_name=cfg.name,
        points=[] if cfg.search.sampler == "grid" else cfg.grid_points(),
        finished_before=0,
    )
    limited = optuna_searcher(cfg, table.backbone, objectives, constraints, study, "replay")
    trial_scheduler = scheduler(cfg, objectives[0].result_key, objectives[0].mode)
    loop = ReplayLoop(cfg, table, draws, limited, trial_scheduler, concurrency)
    loop.run()
    choose = choose_from(objectives[0], constraints, stops_on_objective(cfg, objectives[0]))
    replay = Replay(loop.ended, loop.ended_s, choose(loop.ended), loop.clock, choose, loop.seen)
    if cfg.search.repeat_best and replay.chosen is not None:
        return with_repeats(replay, cfg, table, draws, concurrency, objectives[0], constraints)
    return replay


def with_repeats(replay: Replay, cfg: ExperimentConfig, table: CurveTable,
                 draws: SeedDraw, concurrency: int, primary: ResolvedObjective,
                 constraints: Constraints) -> Replay:  # fmt: skip
    """``search.repeat_best`` after the replayed search, as ``raypeft tune`` runs it
    (:func:`raypeft.search.repeats.run_repeats`): the same top trials, the same repeat configs
    behind the same fixed-list searcher, run to the end, and the best mean wins. The i-th
    repeat of a trial (``train.seed`` = its seed + i) reports the i-th of its configuration's
    seeds that the replay has not seen, in the random order ``draws`` holds, as a real search
    trains seeds it has not trained yet (never the held-out seed)."""
    feasible = [t for t in replay.trials if constraints.feasible(t.metrics)] or replay.trials
    spec = cfg.search.repeat_best
    top = top_trials(feasible, primary.result_key, primary.mode, spec.top_k)
    configs = repeat_configs(top, cfg.train.seed, spec.seeds)
    fixed = fixed_values(cfg, table)
    seed_of = {t.trial_id: int(t.config.get(SEED_KEY, cfg.train.seed)) for t in top}

    def other_seed(config: dict[str, Any]) -> Curve:
        params = {**fixed, **{k: v for k, v in config.items() if k in cfg.space}}
        key = configuration_key(params)
        index = config[SEED_KEY] - seed_of[config[REPEAT_OF]] - 1
        return draws.repeat_curve(key, index, replay.seen.get(key, set()))

    searcher = ConcurrencyLimiter(
        FixedConfigs(configs, primary.result_key, primary.mode), max_concurrent=concurrency
    )
    repeats = cfg.model_copy(update={"search": cfg.search.model_copy(
        update={"num_samples": len(configs)})})  # fmt: skip
    loop = ReplayLoop(repeats, table, draws, searcher, FIFOScheduler(), concurrency, other_seed,
                      name="repeat")  # fmt: skip
    loop.run()

    def choose(trials: list[TrialResult]) -> TrialResult | None:
        """The search's choice until a repeat ends; then the top trial of the best mean."""
        done = [t for t in trials if REPEAT_OF in t.config]
        if not done:
            return replay.choose(trials)
        means = group_repeats(top, done, primary.result_key, cfg.train.seed)
        best = max(means, key=lambda g: g.mean if primary.mode == "max" else -g.mean)
        return next(t for t in top if t.trial_id == best.trial_id)

    trials = replay.trials + loop.ended
    seen = {key: replay.seen.get(key, set()) | loop.seen.get(key, set())
            for key in replay.seen.keys() | loop.seen.keys()}  # fmt: skip
    return Replay(
        trials,
        replay.ended_s + [replay.wall_s + s for s in loop.ended_s],
        choose(trials),
        replay.wall_s + loop.clock,
        choose,
        seen,
    )


class ReplayLoop:
    """The event loop: trials start while slots are free, and report in simulated time."""

    def __init__(self, cfg, table, draws, searcher, trial_scheduler, concurrency, curves=None,
                 name="replay"):  # fmt: skip
        self.cfg, self.table, self.draws, self.name = cfg, table, draws, name
        self.curves: Callable[[dict[str, Any]], Curve] = curves or self.curve_for
        self.searcher: Searcher = searcher
        self.scheduler: TrialScheduler = trial_scheduler
        self.concurrency = concurrency
        self.target = TargetMetric(table.metric, table.mode)
        self.fixed = fixed_values(cfg, table)  # the keys the table varies, this search not
        self.controller = SimulatedController()
        self.running: dict[str, ReplayedTrial] = {}
        self.events: list[tuple[float, int, str]] = []  # (time, order, trial id)
        self.created = 0
        self.pushed = 0
        self.finished = False  # the searcher has nothing more to propose
        self.clock = 0.0
        self.ended: list[TrialResult] = []
        self.ended_s: list[float] = []
        self.seen: dict[str, set[int]] = {}  # configuration -> the recorded seeds it reported

    def run(self) -> None:
        self.start_trials()
        while self.events:
            self.clock, _, trial_id = heapq.heappop(self.events)
            self.report(self.running[trial_id])
            self.start_trials()

    def start_trials(self) -> None:
        """Ask the searcher for trials while a slot is free and the search wants more."""
        while (
            len(self.running) < self.concurrency
            and self.created < self.cfg.search.num_samples
            and not self.finished
        ):
            trial_id = f"{self.name}_{self.created:05d}"
            config = self.searcher.suggest(trial_id)
            if config is None or config == Searcher.FINISHED:
                self.finished = config == Searcher.FINISHED or not self.running
                return
            self.created += 1
            self.start(trial_id, config)

    def start(self, trial_id: str, config: dict[str, Any]) -> None:
        # Tune's experiment tag starts with the trial's creation counter, from 1
        tag = f"{self.created}_replay"
        trial = Trial("replay", config=config, trial_id=trial_id, experiment_tag=tag, stub=True)
        self.controller.trials.append(trial)
        self.scheduler.on_trial_add(self.controller, trial)
        trial.set_status(Trial.RUNNING)
        replayed = ReplayedTrial(trial, self.curves(config), self.clock)
        self.seen.setdefault(replayed.curve.configuration, set()).add(replayed.curve.seed)
        self.running[trial_id] = replayed
        self.schedule_next(replayed)

    def curve_for(self, config: dict[str, Any]) -> Curve:
        """The recorded curve the trial reports: its own seed's where it searches seeds,
        else the seed this replay drew for its configuration."""
        params = {**self.fixed, **{k: v for k, v in config.items() if k in self.cfg.space}}
        key = configuration_key(params)
        if SEED_KEY in params:
            return self.table.curve(key, params[SEED_KEY])
        return self.draws.curves[key]

    def schedule_next(self, replayed: ReplayedTrial) -> None:
        at = replayed.started_s + replayed.curve.wall_s[replayed.reported]
        self.pushed += 1  # equal times: the earlier scheduled event first, as a queue would
        heapq.heappush(self.events, (at, self.pushed, replayed.trial.trial_id))

    def report(self, replayed: ReplayedTrial) -> None:
        """The trial's next evaluation, told as Tune's controller tells it."""
        result = self.result(replayed)
        replayed.last = result
        trial_id = replayed.trial.trial_id
        decision = self.scheduler.on_trial_result(self.controller, replayed.trial, result)
        if decision != TrialScheduler.STOP:
            self.searcher.on_trial_result(trial_id, result)
        if decision == TrialScheduler.STOP or replayed.reported == len(replayed.curve.steps):
            self.end(replayed)
        else:
            self.schedule_next(replayed)

    def result(self, replayed: ReplayedTrial) -> dict[str, Any]:
        """What the trial reports at its next evaluation: what it would report training."""
        curve, k = replayed.curve, replayed.reported
        step = curve.steps[k]
        val = {name.removeprefix("val_"): values[k] for name, values in curve.values.items()}
        if self.target.improves(val, replayed.best):
            replayed.best = best_record(val, step)
        metrics = evaluation_metrics(self.target, val, replayed.best, float("nan"), step)
        replayed.reported = k + 1
        metrics.update(
            {
                TRIAL_STEPS_KEY: curve.steps[-1],
                EVALUATION_KEY: k + 1,  # the schedulers' clock (raypeft.search.tuner)
                "training_iteration": k + 1,
                "time_total_s": curve.wall_s[k],
                "trial_id": replayed.trial.trial_id,
                "experiment_tag": replayed.trial.experiment_tag,
            }
        )
        return metrics

    def end(self, replayed: ReplayedTrial) -> None:
        trial = replayed.trial
        self.scheduler.on_trial_complete(self.controller, trial, replayed.last)
        self.searcher.on_trial_complete(trial.trial_id, result=replayed.last)
        trial.set_status(Trial.TERMINATED)
        del self.running[trial.trial_id]
        self.ended.append(TrialResult(trial.trial_id, dict(trial.config), replayed.last))
        self.ended_s.append(self.clock)


def draw_seeds(
    table: CurveTable, rng: random.Random, policy: str = "per_trial", replay: int = 0,
    spare: int = 0,
) -> SeedDraw:  # fmt: skip
    """The recorded seeds replay number ``replay`` sees, as a real search with
    ``search.trial_seed: policy`` would: ``fixed`` trains every trial on one seed, so every
    configuration reports the same recorded seed (rotated across replays); ``per_trial``
    trains each trial on a seed of its own, so each configuration reports a seed drawn at
    random. A configuration's score is then one draw of its distribution, as in a real search.

    Where every configuration has more than ``spare`` + 1 recorded seeds (``spare``: the
    other seeds ``repeat_best`` needs), one seed is held out of the replay, rotated across
    replays so that every seed is held out as often: the replay never sees it, and its choice
    is scored on it."""
    groups = table.by_configuration()
    seeds = table.seeds()
    fewest = min(len({c.seed for c in curves}) for curves in groups.values())
    heldout = seeds[replay % len(seeds)] if fewest > spare + 1 else None
    usable = [s for s in seeds if s != heldout]
    # fixed: the replays cycle through the held-out seed first, then through the others
    common = usable[(replay // len(seeds)) % len(usable)]
    curves, others = {}, {}
    for key, group in groups.items():
        candidates = [c for c in group if c.seed != heldout]
        same = [c for c in candidates if c.seed == common]
        if policy == "fixed" and same:
            curves[key] = same[0]
        else:  # per_trial, or a configuration not recorded at the common seed
            curves[key] = rng.choice(candidates)
        others[key] = rng.sample(candidates, len(candidates))
    return SeedDraw(curves, others, heldout)
