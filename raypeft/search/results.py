"""A trial as the search reads it once Tune is done: its id, its config, its last metrics."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ray.tune import ResultGrid

from raypeft.training.result_keys import FAILURE_KEY, ran_to_end


@dataclass(frozen=True)
class TrialResult:
    """One trial's Tune config (flat ``{key: value}``) and the last result it reported."""

    trial_id: str
    config: dict[str, Any]
    metrics: dict[str, Any]

    @property
    def failed(self) -> bool:
        """The trial reported its own failure (a diverged loss) instead of going on."""
        return FAILURE_KEY in self.metrics

    @property
    def failure(self) -> str:
        """Why it failed, as it reported it (only for a failed trial)."""
        return str(self.metrics[FAILURE_KEY])

    @property
    def ran_to_end(self) -> bool:
        """Trained to its own last step; else the scheduler stopped it early (a
        low-fidelity score)."""
        return ran_to_end(self.metrics)

    def has_number(self, key: str) -> bool:
        """``key`` is among its metrics, as a number."""
        return isinstance(self.metrics.get(key), (int, float))

    def best_validation(self) -> dict[str, float]:
        """The best validation metrics it reached: ``{"val_accuracy": ...}``."""
        return {
            key[len("best_") :]: value
            for key, value in self.metrics.items()
            if key.startswith("best_val_") and isinstance(value, (int, float))
        }


def trial_results(results: ResultGrid) -> list[TrialResult]:
    """Every trial of a Tune experiment that reported anything, in the order Tune created
    them (so that ties break alike whether the experiment ran at once or was resumed)."""
    reported = [
        TrialResult(r.metrics["trial_id"], dict(r.config), dict(r.metrics))
        for r in results
        if r.metrics and "trial_id" in r.metrics
    ]
    return in_creation_order(reported)


def in_creation_order(trials: list[TrialResult]) -> list[TrialResult]:
    """``trials`` in the order Tune created them: where two tie on the objective, the
    search chooses the one created first, whatever order the trials ended in."""
    return sorted(trials, key=_creation_order)


def _creation_order(trial: TrialResult) -> int:
    """The counter Tune puts first in a trial's ``experiment_tag`` ("3_method.lr=...").

    A resumed experiment lists its trials newest result first (``Tuner.restore``), a fresh
    one as they were created; sorted by this counter, both list them alike.
    """
    head = str(trial.metrics.get("experiment_tag", "")).split("_", 1)[0]
    return int(head) if head.isdigit() else 0
