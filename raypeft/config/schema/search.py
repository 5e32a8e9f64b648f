"""The ``search`` section: the metric or objectives, constraints, the sampler, the Optuna
study, seeds and repeats, and the early-stopping scheduler (``search.scheduler``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from raypeft.config.space import StrictModel


class SchedulerConfig(StrictModel):
    """Early stopping of trials (their clock: a trial's evaluations, counted from its step 0)."""

    type: Literal["asha", "hyperband", "median", "none"] = Field(
        "asha",
        description="asha (async successive halving), hyperband (async HyperBand: ASHA over "
        "several brackets), median (median stopping rule), none (every trial runs to the end)",
    )
    grace_period: int = Field(
        2,
        ge=1,
        description="evaluations every trial gets before stopping; when set, at most "
        "ceil(train.max_steps / train.eval_every) (the default, 2, is lowered to that)",
    )
    reduction_factor: float = Field(2, gt=1, description="asha/hyperband: keep 1/factor per rung")
    brackets: int = Field(3, ge=1, description="hyperband: number of brackets")
    min_samples_required: int = Field(
        3, ge=1, description="median: trials that must have reached a step before it compares"
    )
    metric: str | None = Field(
        None,
        description="what the scheduler compares trials on, at each evaluation (e.g. val_loss, "
        "which does not tie where accuracies sit at the majority class); default: the search's "
        "metric. The searcher still optimises search.metric",
    )
    mode: Literal["max", "min"] | None = Field(
        None, description="direction of scheduler.metric; default: the metric's own"
    )


# Efficiency figures every trial reports (raypeft/train.py), with the direction that is better.
EFFICIENCY_METRICS: dict[str, str] = {
    "trainable_params": "min",
    "train_samples_per_s": "max",
    "eval_samples_per_s": "max",
    "peak_memory_mb": "min",
    "wall_time_s": "min",
}


class Objective(StrictModel):
    """One objective: a validation metric of the task (its best value in the trial) or an
    efficiency figure (trainable_params, train_samples_per_s, eval_samples_per_s,
    peak_memory_mb, wall_time_s)."""

    metric: str
    mode: Literal["max", "min"] | None = Field(None, description="default: the metric's")


class Bound(StrictModel):
    """A constraint on one metric: trials outside it are infeasible for the sampler and are
    never chosen as the best."""

    max: float | None = None
    min: float | None = None

    @model_validator(mode="after")
    def _one_side(self) -> Bound:
        if self.max is None and self.min is None:
            raise ValueError("give max, min or both")
        if self.max is not None and self.min is not None and self.min > self.max:
            raise ValueError(f"`min <= max` must hold, but got min={self.min}, max={self.max}")
        return self


class RepeatBest(StrictModel):
    """After the search, train the best configurations again with other seeds."""

    top_k: int = Field(3, ge=1, description="how many of the best configurations to repeat")
    seeds: int = Field(2, ge=1, description="extra seeds per configuration (train.seed + 1..n)")


class SearchConfig(StrictModel):
    """Ray Tune + Optuna settings."""

    metric: str | None = Field(None, description="validation metric to optimise (default: task's)")
    mode: Literal["max", "min"] | None = Field(None, description="default: the metric's")
    objectives: list[Objective] | None = Field(
        None,
        min_length=2,
        description="multi-objective search (Optuna's Pareto front), e.g. accuracy (max) and "
        "train_samples_per_s (max); the first one drives the scheduler and the test evaluation",
    )
    constraints: dict[str, Bound] = Field(
        default_factory=dict,
        description="metric -> {max, min}: e.g. trainable_params: {max: 40000} or "
        "eval_samples_per_s: {min: 500}; the sampler learns them, the best trial satisfies them",
    )
    num_samples: int = Field(12, ge=1, description="number of trials")
    max_concurrent: int | None = Field(None, ge=1, description="default: as many as fit")
    sampler: Literal["tpe", "random", "grid", "cmaes", "gp", "nsga2"] = Field(
        "tpe",
        description="Optuna sampler: tpe, random, grid (every combination of grid/choice "
        "keys), cmaes (numeric keys), gp (Optuna's Gaussian-process sampler), nsga2 "
        "(multi-objective)",
    )
    seed: int = Field(0, description="seed of the sampler")
    startup_trials: int | None = Field(
        None,
        ge=0,
        description="tpe and gp: trials drawn at random before the sampler models the results "
        "(Optuna's n_startup_trials; default Optuna's 10). With 12-24 samples the default "
        "leaves the sampler almost nothing to choose: docs/search_efficiency.md",
    )
    answer_repeats: bool = Field(
        True,
        description="over a discrete space, a configuration the sampler proposes again is "
        "answered from its earlier trial instead of trained again; false: it trains again "
        "(another draw of its noise, at the cost of a trial)",
    )
    seeds: list[int] | None = Field(
        None,
        min_length=1,
        description="train every configuration once per seed, each its own trial with its own "
        "train.seed (a grid of seeds: sampler grid only); the trials of one configuration share "
        "the raypeft.configuration tag in MLflow and user attribute in Optuna",
    )
    trial_seed: Literal["fixed", "per_trial"] = Field(
        "fixed",
        description="fixed: every trial trains with train.seed (paired comparison); per_trial: "
        "trial k trains with train.seed + k (logged as its train.seed)",
    )
    repeat_best: RepeatBest | None = Field(
        None, description="re-train the top_k configurations with more seeds; mean and std"
    )
    storage: str | None = Field(
        None,
        description="Optuna RDB storage URL (default: $RAYPEFT_SEARCH_STORAGE, else "
        "optuna.db next to the MLflow sqlite store, else in the working directory)",
    )
    study_name: str | None = Field(
        None,
        min_length=1,
        description="Optuna study (default: the MLflow experiment's name); a search with "
        "the same study continues its history",
    )
    scheduler: SchedulerConfig = SchedulerConfig()

    @field_validator("seeds")
    @classmethod
    def _distinct_seeds(cls, seeds: list[int] | None) -> list[int] | None:
        if seeds is not None and len(set(seeds)) != len(seeds):
            raise ValueError(f"seeds repeat a seed: {seeds}")
        return seeds

    @model_validator(mode="after")
    def _consistent(self) -> SearchConfig:
        if self.startup_trials is not None and self.sampler not in ("tpe", "gp"):
            raise ValueError(
                f"startup_trials: only tpe and gp draw start-up trials, so sampler must be one "
                f"of them, but got sampler: {self.sampler}"
            )
        if self.objectives:
            first = self.objectives[0].metric
            if self.metric is not None and self.metric != first:
                raise ValueError(
                    f"metric {self.metric!r} differs from the first objective {first!r}: "
                    "with objectives, leave metric out"
                )
            names = [o.metric for o in self.objectives]
            if len(set(names)) != len(names):
                raise ValueError(f"objectives repeat a metric: {names}")
            if self.sampler in ("cmaes", "gp"):
                raise ValueError(
                    f"sampler: {self.sampler} optimises a single objective: with "
                    "search.objectives, sampler must be tpe, nsga2 or random"
                )
        return self

    def objective_list(self, default_metric: str) -> list[Objective]:
        """The objectives, first one primary; the single metric when there are none."""
        if self.objectives:
            return list(self.objectives)
        return [Objective(metric=self.metric or default_metric, mode=self.mode)]
