"""A search reads its trials in the order Tune created them, whether its Tune experiment ran
at once or was restored by ``--resume`` (which lists them newest result first): ties between
equal scores then break alike, so a resumed search chooses what an uninterrupted one would."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from raypeft.search.objectives import Constraints, ResolvedObjective
from raypeft.search.outcome import choose_best
from raypeft.search.repeats import top_trials
from raypeft.search.results import TrialResult, trial_results
from raypeft.training.result_keys import TRIAL_STEPS_KEY


@dataclass
class FakeResult:  # what trial_results reads of a ray.tune.Result
    metrics: dict[str, Any]
    config: dict[str, Any] = field(default_factory=dict)


def grid(order: list[int]) -> list[FakeResult]:
    """Trials 1..3 (Tune's counter in ``experiment_tag``), listed in ``order``; 1 and 3 tie."""
    scores = {1: 0.5, 2: 0.4, 3: 0.5}
    return [
        FakeResult(
            {
                "trial_id": f"t{n}",
                "experiment_tag": f"{n}_method.lr=0.{n}",
                "best_val_accuracy": scores[n],
                "step": 30,
                TRIAL_STEPS_KEY: 30,
            },
            {"method.lr": n / 10},
        )
        for n in order
    ]


def test_trials_are_read_in_creation_order_however_tune_lists_them():
    fresh, restored = trial_results(grid([1, 2, 3])), trial_results(grid([3, 2, 1]))
    assert [t.trial_id for t in fresh] == [t.trial_id for t in restored] == ["t1", "t2", "t3"]
    objective = ResolvedObjective("accuracy", "max", "best_val_accuracy")
    for trials in (fresh, restored):
        best, _ = choose_best(trials, objective, Constraints({}))
        assert best.trial_id == "t1"  # the first of the tied trials, both times
        top = top_trials(trials, "best_val_accuracy", "max", 1)
        assert [t.trial_id for t in top] == ["t1"]


def test_trials_without_a_counter_keep_their_order():
    results = [FakeResult({"trial_id": t}) for t in ("b", "a", "c")]
    assert [t.trial_id for t in trial_results(results)] == ["b", "a", "c"]


def test_a_pruned_trial_is_chosen_only_when_none_ran_to_its_end():
    """Where stopped trials are PRUNED in Optuna (the scheduler judged the objective), the
    choice is the study's best_trial: a COMPLETE one, though a pruned one scored higher."""
    objective = ResolvedObjective("accuracy", "max", "best_val_accuracy")
    full = TrialResult("full", {}, {"best_val_accuracy": 0.6, "step": 30, TRIAL_STEPS_KEY: 30})
    stopped = TrialResult("cut", {}, {"best_val_accuracy": 0.9, "step": 10, TRIAL_STEPS_KEY: 30})
    pick = choose_best([full, stopped], objective, Constraints({}), stopped_are_pruned=True)
    assert pick[0].trial_id == "full"
    pick = choose_best([full, stopped], objective, Constraints({}), stopped_are_pruned=False)
    assert pick[0].trial_id == "cut"  # stopped on another metric: its score is real
    assert choose_best([stopped], objective, Constraints({}), True)[0].trial_id == "cut"
