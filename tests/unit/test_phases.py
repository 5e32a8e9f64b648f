"""The phase timer a trial and the driver's hooks measure with (raypeft.training.phases)."""

from __future__ import annotations

from types import SimpleNamespace

from raypeft.training.phases import PhaseTimer, merged, phases_of, timed_phase


def test_phases_add_up_and_become_result_keys():
    timer = PhaseTimer()
    with timer.phase("steps"):
        pass
    timer.add("steps", 1.0)
    timer.add("data", 0.5)
    result = timer.result()
    assert set(result) == {"phase_s/steps", "phase_s/data"}
    assert result["phase_s/steps"] >= 1.0
    assert phases_of({**result, "val_loss": 0.3}) == timer.seconds


def test_a_timed_iterator_counts_the_time_between_items():
    timer = PhaseTimer()
    assert list(timer.timed("data", iter([1, 2, 3]))) == [1, 2, 3]
    assert set(timer.seconds) == {"data"}


class Hooks:
    """A Tune callback's and a searcher's hooks, as Tune calls them."""

    def __init__(self):
        self.phase_s: dict[str, PhaseTimer] = {}

    @timed_phase("mlflow_result")
    def on_trial_result(self, iteration, trials, trial, result, **info):
        return result

    @timed_phase("optuna_tell")
    def on_trial_complete(self, trial_id, result=None, error=False):
        return trial_id


def test_driver_hooks_time_the_trial_they_are_about():
    hooks, trial = Hooks(), SimpleNamespace(trial_id="t1")
    assert hooks.on_trial_result(iteration=1, trials=[], trial=trial, result={"a": 1}) == {"a": 1}
    hooks.on_trial_result(iteration=2, trials=[], trial=trial, result={})
    hooks.on_trial_complete("t2", {})
    assert set(hooks.phase_s) == {"t1", "t2"}
    assert set(hooks.phase_s["t1"].seconds) == {"mlflow_result"}
    assert set(hooks.phase_s["t2"].marks) == {"optuna_tell"}
    both = merged(hooks.phase_s, {"t1": hooks.phase_s["t2"]})
    assert set(both["t1"].seconds) == {"mlflow_result", "optuna_tell"}


def test_a_hook_of_an_object_saved_before_it_had_phases_still_runs():
    """A resumed search's searcher comes back as Tune pickled it, maybe without ``phase_s``."""
    hooks = Hooks()
    del hooks.phase_s
    assert hooks.on_trial_complete("t1") == "t1"
    assert set(hooks.phase_s["t1"].seconds) == {"optuna_tell"}
