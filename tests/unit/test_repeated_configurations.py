"""Early stopping's levers: a configuration already run is answered from the study, not
trained again; the scheduler decides on its own metric.

``StudySearcher`` is driven the way Tune's controller drives it (suggest, results,
completion) on a real sqlite Optuna storage, with Optuna's real samplers; which configuration
Optuna proposes next is set with ``study.enqueue_trial``.
"""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, MedianStoppingRule
from ray.tune.search import Searcher

from raypeft.config.loading import validate_experiment
from raypeft.errors import ConfigError
from raypeft.search.objectives import Constraints, ResolvedObjective, resolve_objectives
from raypeft.search.searcher import StudySearcher, discrete_space
from raypeft.search.study import ANSWERED_FROM_ATTR, METRICS_ATTR, open_storage
from raypeft.search.tuner import scheduler
from raypeft.training.result_keys import TRIAL_STEPS_KEY

ACC = ResolvedObjective("accuracy", "max", "best_val_accuracy")
BASE = {
    "name": "s",
    "model": {"name": "tiny-bert", "max_length": 16},
    "method": {"name": "pt", "prompt_length": 4},
    "train": {"max_steps": 30, "eval_every": 10},
}


def experiment(space=None, **search) -> object:
    space = space or {"method.lr": {"choice": [0.1, 0.2]}}
    return validate_experiment({**BASE, "space": space, "search": search}, "exp.yaml")


def define_by_run(trial):
    return {"x": trial.suggest_categorical("x", [1, 2])}


def make_search(url, parent="parent123", answer=True):
    return StudySearcher(
        define_by_run,
        open_storage(url),
        "study",
        optuna.samplers.TPESampler(seed=0),
        [ACC],
        Constraints({}),
        parent,
        answer_repeats=answer,
    )


def result(step: int, acc: float) -> dict:
    """A report at ``step`` of a trial 30 steps long."""
    return {
        "step": step,
        "training_iteration": step // 10,
        "best_val_accuracy": acc,
        TRIAL_STEPS_KEY: 30,
    }


def propose(search, *xs) -> None:
    """Make Optuna's next proposals the configurations ``xs``, in order."""
    for x in xs:
        search.study.enqueue_trial({"x": x})


def run(search, trial_id, *accs, until=30) -> None:
    """A trial reports ``accs`` at steps 10, 20, ...; it ends at step ``until``."""
    for i, acc in enumerate(accs[:-1]):
        search.on_trial_result(trial_id, result(10 * (i + 1), acc))
    search.on_trial_complete(trial_id, result(until, accs[-1]))


def trials(url):
    return optuna.load_study(study_name="study", storage=url).trials


@pytest.fixture
def url(tmp_path):
    return f"sqlite:///{tmp_path / 'optuna.db'}"


def test_a_finished_configuration_is_answered_not_trained(url):
    search = make_search(url)
    propose(search, 1, 1, 2)
    assert search.suggest("a") == {"x": 1}
    run(search, "a", 0.5, 0.6, 0.7)
    assert search.suggest("b") == {"x": 2}  # the repeat of x=1 was answered, then x=2 asked
    first, repeat, new = trials(url)
    assert repeat.state == TrialState.COMPLETE and repeat.value == 0.7
    assert repeat.intermediate_values == first.intermediate_values == {10: 0.5, 20: 0.6, 30: 0.7}
    assert repeat.user_attrs[ANSWERED_FROM_ATTR] == first.number
    assert repeat.user_attrs[METRICS_ATTR] == first.user_attrs[METRICS_ATTR]
    assert "raypeft.tune_trial_id" not in repeat.user_attrs  # no Tune trial, no MLflow run
    assert new.params == {"x": 2} and new.state == TrialState.RUNNING


def test_a_pruned_configuration_is_answered_pruned_at_the_same_step(url):
    search = make_search(url)
    propose(search, 1, 1, 2)
    search.suggest("a")
    run(search, "a", 0.5, 0.55, until=20)  # the scheduler stopped it at step 20
    assert search.suggest("b") == {"x": 2}
    first, repeat, _ = trials(url)
    assert first.state == repeat.state == TrialState.PRUNED
    assert repeat.intermediate_values == {10: 0.5, 20: 0.55}
    assert repeat.user_attrs["raypeft.pruned_at_step"] == 20


def test_a_repeat_of_a_training_configuration_waits_for_its_end(url):
    search = make_search(url)
    propose(search, 1, 1, 2)
    search.suggest("a")
    assert search.suggest("b") == {"x": 2}  # x=1 is training: its repeat waits, x=2 runs
    waiting = trials(url)[1]
    assert waiting.state == TrialState.RUNNING and waiting.user_attrs[ANSWERED_FROM_ATTR] == 0
    run(search, "a", 0.5, 0.6, 0.7)
    assert trials(url)[1].state == TrialState.COMPLETE and trials(url)[1].value == 0.7


def test_a_waiting_repeat_survives_the_searchers_save_and_restore(url, tmp_path):
    search = make_search(url)
    propose(search, 1, 1, 2)
    search.suggest("a")
    search.suggest("b")
    search.save(str(tmp_path / "searcher.pkl"))  # what Tune keeps for --resume
    restored = make_search(url)
    restored.restore(str(tmp_path / "searcher.pkl"))
    run(restored, "a", 0.5, 0.6, 0.7)
    assert trials(url)[1].state == TrialState.COMPLETE and trials(url)[1].value == 0.7


def test_a_later_search_of_the_study_trains_its_configurations_again(url):
    earlier = make_search(url, parent="first")
    propose(earlier, 1)
    earlier.suggest("a")
    run(earlier, "a", 0.5, 0.6, 0.7)
    later = make_search(url, parent="second")  # e.g. the same search run again
    propose(later, 1)
    assert later.suggest("a") == {"x": 1}  # trained, not answered from the first search
    assert all(ANSWERED_FROM_ATTR not in t.user_attrs for t in trials(url))


@pytest.mark.slow
def test_a_sampler_stuck_on_known_configurations_explores_then_ends(url):
    search = make_search(url)
    propose(search, 1, 1, 1, 1)
    search.suggest("a")
    run(search, "a", 0.5, 0.6, 0.7)
    # three repeats in a row: the configuration not yet run is drawn instead
    assert search.suggest("b") == {"x": 2}
    run(search, "b", 0.4, 0.5, 0.6)
    answered = [t for t in trials(url) if ANSWERED_FROM_ATTR in t.user_attrs]
    assert len(answered) == StudySearcher.MAX_REPEATS
    assert all(t.state == TrialState.COMPLETE and t.value == 0.7 for t in answered)
    assert search.suggest("c") == Searcher.FINISHED  # both configurations have run


def test_without_answering_a_repeat_is_trained(url):
    search = make_search(url, answer=False)
    propose(search, 1, 1)
    search.suggest("a")
    run(search, "a", 0.5, 0.6, 0.7)
    assert search.suggest("b") == {"x": 1}


def test_a_failed_configuration_is_trained_again(url):
    search = make_search(url)
    propose(search, 1, 1)
    search.suggest("a")
    search.on_trial_complete("a", None, error=True)  # maybe a lost machine: try again
    assert search.suggest("b") == {"x": 1}


def test_discrete_space():
    assert discrete_space(experiment())
    grid = {"method.lr": {"grid": [0.1, 0.2]}, "train.seed": {"choice": [0, 1]}}
    assert discrete_space(experiment(grid, trial_seed="per_trial"))  # the seed is searched
    assert not discrete_space(experiment(trial_seed="per_trial"))
    assert not discrete_space(experiment({"method.lr": {"loguniform": [1e-4, 1e-1]}}))


@pytest.mark.parametrize("kind", ["asha", "hyperband", "median"])
def test_the_scheduler_decides_on_its_own_metric(kind):
    cfg = experiment(scheduler={"type": kind, "metric": "val_loss"})
    resolve_objectives(cfg, ("accuracy",))  # a name the task reports: accepted
    sched = scheduler(cfg, "best_val_accuracy", "max")
    assert isinstance(sched, MedianStoppingRule if kind == "median" else ASHAScheduler)
    assert (sched._metric, sched._mode) == ("val_loss", "min")
    cfg = experiment(scheduler={"type": kind, "metric": "accuracy", "mode": "max"})
    assert scheduler(cfg, "best_val_accuracy", "max")._metric == "val_accuracy"
    default = scheduler(experiment(scheduler={"type": kind}), "best_val_accuracy", "max")
    assert (default._metric, default._mode) == ("best_val_accuracy", "max")
    assert isinstance(scheduler(experiment(scheduler={"type": "none"}), "m", "max"), FIFOScheduler)


def test_an_unknown_scheduler_metric_is_a_one_line_error():
    cfg = experiment(scheduler={"type": "asha", "metric": "val_perplexity"})
    with pytest.raises(ConfigError) as info:
        resolve_objectives(cfg, ("accuracy",))
    message = str(info.value)
    assert message.startswith("search.scheduler.metric: 'val_perplexity'") and "\n" not in message
    assert "val_loss" in message
