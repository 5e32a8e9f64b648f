"""What a search found: the best trial, the Pareto front, test scores, and its summary.

The best trial is chosen by the primary objective among the trials that meet
``search.constraints`` (validation scores only); the test split scores the chosen
configuration once, and with ``search.repeat_best`` every seed it was trained with.
"""

from __future__ import annotations

import math
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from raypeft.config.schema import ExperimentConfig
from raypeft.data import TokenizedTask
from raypeft.search.objectives import Constraints, ResolvedObjective
from raypeft.search.repeats import RepeatGroup
from raypeft.search.results import TrialResult
from raypeft.tracking.callback import MLflowTrialCallback
from raypeft.tracking.registry import Published
from raypeft.tracking.tags import PARETO_FRONT_TAG
from raypeft.training.checkpoints import load_checkpoint
from raypeft.training.datasets import ensure_features, split_dataset
from raypeft.training.evaluation import evaluate


@dataclass
class SearchSummary:
    """What a finished search found, and where its records are."""

    experiment: str
    tracking_uri: str
    experiment_id: str
    parent_run_id: str
    best_trial_id: str
    best_run_id: str | None
    best_params: dict[str, Any]
    metric: str
    best_validation: dict[str, float]
    test: dict[str, float]
    num_trials: int
    num_errors: int
    storage_path: str
    wall_s: float
    trial_run_ids: dict[str, str] = field(default_factory=dict)
    objectives: list[ResolvedObjective] = field(default_factory=list)
    pareto: list[dict[str, Any]] = field(default_factory=list)  # multi-objective searches
    repeats: list[RepeatGroup] = field(default_factory=list)  # search.repeat_best
    num_pruned: int = 0
    optuna_storage: str = ""
    optuna_study: str = ""
    seed_means_study: str = ""  # search.repeat_best: the study whose best trial is the choice
    constraints_met: bool = True
    started_over: list[str] = field(default_factory=list)  # trials whose checkpoint was unusable
    # trials whose end the Optuna study could not record: "<trial> (Optuna trial <n>: <why>)"
    unrecorded: list[str] = field(default_factory=list)
    # trials started after Tune's last snapshot that --resume ran again (new trials):
    # "<stale trial> (Optuna trial <n>) as <trial>"
    rerun: list[str] = field(default_factory=list)
    published: Published | None = None  # the chosen model in MLflow (pyfunc, registry)
    # seconds each phase took, in order (prepare, open_records, fit, analyse, finish)
    phase_s: dict[str, float] = field(default_factory=dict)
    test_split_s: float = 0.0  # of finish: the chosen trial scored on the test split
    # trial id -> the driver's seconds on it (MLflow records, Optuna), a PhaseTimer each; the
    # trial's own phases are in its results (phase_s/<name>: raypeft.training.phases)
    trial_driver_phases: dict[str, Any] = field(default_factory=dict)


@dataclass
class Outcome:
    """What the search's trials amount to, before the test split is touched."""

    best: TrialResult  # the chosen configuration's trial
    constraints_met: bool  # False: no trial met search.constraints, the best of all is chosen
    num_trials: int
    num_errors: int  # trials that raised, or reported a diverged loss
    num_pruned: int  # trials the scheduler stopped early
    pareto: list[dict[str, Any]]  # multi-objective searches: the front, best first
    # trials restarted from a damaged or incomplete checkpoint, which trained from step 0
    started_over: list[str] = field(default_factory=list)
    # trials whose end the Optuna study could not record (the summary names them)
    unrecorded: list[str] = field(default_factory=list)
    # trials started after Tune's last snapshot that --resume ran again (the summary names them)
    rerun: list[str] = field(default_factory=list)
    repeats: list[RepeatGroup] = field(default_factory=list)  # the top configurations' seeds
    ranked_repeats: list[RepeatGroup] = field(default_factory=list)  # best mean first


def choose_best(
    trials: list[TrialResult],
    objective: ResolvedObjective,
    constraints: Constraints,
    stopped_are_pruned: bool = False,
) -> tuple[TrialResult | None, bool]:
    """The best trial by the primary objective among those meeting the constraints.

    Returns ``(trial, constraints_met)``; when no trial meets them, the best of all is
    returned with ``False`` (the summary says so). Where the scheduler stops trials on the
    objective itself (``stopped_are_pruned``: Optuna holds them PRUNED, and
    ``study.best_trial`` looks at COMPLETE trials only), a stopped trial is chosen only when
    no trial ran to its end: the study and raypeft name the same trial.
    """
    key, sign = objective.result_key, (1 if objective.mode == "max" else -1)
    scored = [t for t in trials if t.has_number(key) and math.isfinite(t.metrics[key])]
    feasible = [t for t in scored if constraints.feasible(t.metrics)]
    pool = feasible or scored
    if stopped_are_pruned:
        pool = [t for t in pool if t.ran_to_end] or pool
    if not pool:
        return None, False
    return max(pool, key=lambda t: sign * t.metrics[key]), bool(feasible) or not constraints


def pareto_front(rows: list[dict[str, float]], objectives: list[ResolvedObjective]) -> list[int]:
    """Indices of the rows no other row dominates (at least as good everywhere, better once)."""

    def better_or_equal(a: dict, b: dict) -> bool:
        return all(
            (a[o.result_key] >= b[o.result_key])
            if o.mode == "max"
            else (a[o.result_key] <= b[o.result_key])
            for o in objectives
        )

    def dominates(a: dict, b: dict) -> bool:
        return better_or_equal(a, b) and any(a[o.result_key] != b[o.result_key] for o in objectives)

    return [i for i, row in enumerate(rows) if not any(dominates(other, row) for other in rows)]


def tag_pareto_front(
    trials: list[TrialResult],
    objectives: list[ResolvedObjective],
    constraints: Constraints,
    tracker: MLflowTrialCallback,
) -> list[dict[str, Any]]:
    """Multi-objective searches: the trials on the Pareto front (full-length, feasible),
    each tagged ``raypeft.pareto_front`` on its MLflow run."""
    if len(objectives) < 2:
        return []
    full = [
        t
        for t in trials
        if t.ran_to_end
        and constraints.feasible(t.metrics)
        and all(t.has_number(o.result_key) for o in objectives)
    ]
    front = [full[i] for i in pareto_front([t.metrics for t in full], objectives)]
    out = []
    for trial in front:
        run_id = tracker.run_ids.get(trial.trial_id)
        if run_id:
            tracker.client.set_tag(run_id, PARETO_FRONT_TAG, "true")
        out.append(
            {
                "trial_id": trial.trial_id,
                "run_id": run_id,
                "method": trial.config.get("method.name", tracker.base.method.name),
                **{o.name: trial.metrics[o.result_key] for o in objectives},
            }
        )
    return sorted(out, key=lambda p: p[objectives[0].name], reverse=objectives[0].mode == "max")


def score_on_test(cfg: ExperimentConfig, data: TokenizedTask, folder: Path) -> dict[str, float]:
    """Evaluate a checkpoint once on the test split (the chosen configuration only)."""
    torch.set_num_threads(os.cpu_count() or 1)
    trial_cfg, model = load_checkpoint(folder, data)
    ensure_features(data, trial_cfg, ("test",))  # its resolved config may name other keys
    scores = evaluate(
        model,
        split_dataset(data, trial_cfg, "test"),
        data.spec.metrics,
        cfg.train.eval_batch_size,
        torch.device("cpu"),
    )
    test = {f"test_{k}": v for k, v in scores.items()}
    if data.spec.problem == "classification":
        # what always answering the most frequent test label scores: the bar to beat
        counts = np.bincount(data.splits["test"]["labels"])
        test["test_majority_class_accuracy"] = float(counts.max() / counts.sum())
    return test


def score_seeds_on_test(
    cfg: ExperimentConfig, data: TokenizedTask, group: RepeatGroup, tracker, say
) -> dict[str, float]:
    """Test metrics of every seed of the chosen configuration: mean and std."""
    say(f"Evaluating the chosen configuration's {len(group.trial_ids)} seeds on the test split ...")
    per_seed: dict[str, list[float]] = {}
    for trial_id in group.trial_ids.values():
        folder = tracker.best_checkpoint_dir(trial_id)
        if folder is None:
            continue
        for key, value in score_on_test(cfg, data, folder).items():
            per_seed.setdefault(key, []).append(value)
    out = {}
    for key, values in per_seed.items():
        if key.endswith(("_loss", "samples_per_s", "majority_class_accuracy")):
            continue
        out[f"{key}_mean"] = statistics.fmean(values)
        out[f"{key}_std"] = statistics.stdev(values) if len(values) > 1 else 0.0
        out[f"{key}_seeds"] = float(len(values))
    return out


def parent_run_record(summary: SearchSummary, ranked_repeats: list[RepeatGroup]) -> dict:
    """What the parent run records when the search finishes (``finish_parent_run``): the best
    trial and configuration, its metrics, the search's counts, the JSON tables."""
    extra = {
        "num_trials": summary.num_trials,
        "num_failed_trials": summary.num_errors,
        "num_pruned_trials": summary.num_pruned,
    }
    for i, group in enumerate(ranked_repeats):
        extra[f"repeat_{i}_mean_val_{summary.metric}"] = group.mean
        extra[f"repeat_{i}_std_val_{summary.metric}"] = group.std
    best_val = {f"best_{k}": v for k, v in summary.best_validation.items()}
    return {
        "trial_id": summary.best_trial_id,
        "run_id": summary.best_run_id,
        "config": summary.best_params,
        "metrics": {**best_val, **summary.test, **extra},
        "tables": _tables(summary),
    }


def _tables(summary: SearchSummary) -> dict[str, Any]:
    """JSON artefacts of the parent run: the Pareto front and the repeated seeds."""
    tables: dict[str, Any] = {}
    if summary.pareto:
        tables["pareto_front.json"] = summary.pareto
    if summary.repeats:
        tables["repeats.json"] = [
            {
                "trial_id": g.trial_id,
                "mean": g.mean,
                "std": g.std,
                "scores_by_seed": g.scores,
                "trials_by_seed": g.trial_ids,
                "config": g.config,
            }
            for g in summary.repeats
        ]
    return tables
