"""Optuna behind Tune: pruned trials, persisted studies, objectives, constraints, samplers.

``StudySearcher`` is driven here the way Tune's controller drives it (suggest, results,
completion), on a real sqlite Optuna storage; the study is then read back with Optuna.
"""

from __future__ import annotations

import math
import sqlite3
import warnings

import optuna
import pytest
from optuna.trial import TrialState

from raypeft.config.loading import validate_experiment
from raypeft.config.schema import Bound
from raypeft.errors import ConfigError
from raypeft.search.objectives import (
    Constraints,
    ResolvedObjective,
    resolve_constraints,
    resolve_objectives,
    stops_on_objective,
)
from raypeft.search.outcome import pareto_front
from raypeft.search.searcher import StudySearcher
from raypeft.search.study import (
    DRIVER_ATTR,
    METRICS_ATTR,
    PARENT_RUN_ATTR,
    RERUN_OF_ATTR,
    STOPPED_EARLY_ATTR,
    UNSNAPSHOTTED,
    build_sampler,
    open_storage,
    plan_study,
    prepare_study,
    remaining_grid_points,
    reruns,
    this_driver,
    unrecorded_ends,
)
from raypeft.tracking.stores import search_storage_url
from raypeft.training.result_keys import TRIAL_STEPS_KEY

BASE = {
    "name": "s",
    "model": {"name": "tiny-bert", "max_length": 16},
    "method": {"name": "pt", "prompt_length": 4},
    "train": {"max_steps": 30, "eval_every": 10},
}
TASK_METRICS = ("accuracy", "macro_f1")


def experiment(**search) -> object:
    space = search.pop("space", {"method.lr": {"loguniform": [1e-4, 1e-1]}})
    return validate_experiment({**BASE, "space": space, "search": search}, "exp.yaml")


def define_by_run(trial):
    return {"x": trial.suggest_float("x", 0.0, 1.0)}


def make_search(tmp_path, objectives, constraints=None, prune_stopped=True):
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    search = StudySearcher(
        define_by_run,
        open_storage(url),
        "study",
        optuna.samplers.RandomSampler(seed=0),
        objectives,
        constraints or Constraints({}),
        "parent123",
        prune_stopped=prune_stopped,
    )
    return search, url


ACC = ResolvedObjective("accuracy", "max", "best_val_accuracy")
SPEED = ResolvedObjective("train_samples_per_s", "max", "train_samples_per_s")


def result(step: int, acc: float, length: int = 30, **more) -> dict:
    """A trial's report at ``step`` of its own ``length`` (TRIAL_STEPS_KEY)."""
    return {
        "step": step,
        "training_iteration": step // 10,
        "best_val_accuracy": acc,
        TRIAL_STEPS_KEY: length,
        **more,
    }


def test_scheduler_stop_is_pruned_at_the_step_reached(tmp_path):
    search, url = make_search(tmp_path, [ACC])
    for trial_id in ("a", "b"):
        search.suggest(trial_id)
    search.on_trial_result("a", result(10, 0.5))
    search.on_trial_result("a", result(20, 0.6))
    search.on_trial_complete("a", result(30, 0.7))  # ran to train.max_steps
    search.on_trial_result("b", result(10, 0.4))
    search.on_trial_complete("b", result(20, 0.45))  # ASHA stopped it at step 20

    study = optuna.load_study(study_name="study", storage=url)
    a, b = study.trials
    assert a.state == TrialState.COMPLETE and a.value == 0.7
    assert a.intermediate_values == {10: 0.5, 20: 0.6, 30: 0.7}  # keyed by training step
    assert b.state == TrialState.PRUNED
    assert b.intermediate_values == {10: 0.4, 20: 0.45}  # the stopping result is recorded
    assert b.value == 0.45 and b.user_attrs["raypeft.pruned_at_step"] == 20
    assert b.user_attrs["raypeft.tune_trial_id"] == "b"
    assert b.user_attrs["raypeft.parent_run_id"] == "parent123"
    assert b.user_attrs[METRICS_ATTR]["best_val_accuracy"] == 0.45


def test_a_trial_asked_for_after_tunes_snapshot_is_closed_and_its_configuration_asked_again(
    tmp_path,
):
    """Tune saves the searcher with its experiment; a trial asked for after that snapshot
    (the driver died before the next) is unknown to the restored search. The restored
    searcher closes it FAIL with the reason and the next ask returns its configuration,
    naming it; a trial the snapshot knew is left to continue."""
    search, url = make_search(tmp_path, [ACC])
    search.suggest("a")
    search.save(str(tmp_path / "searcher.json"))  # Tune's last snapshot: "a" only
    late = search.suggest("b")
    resumed, _ = make_search(tmp_path, [ACC])  # the resumed search's driver
    resumed.restore(str(tmp_path / "searcher.json"))

    study = optuna.load_study(study_name="study", storage=url)
    a, b, queued = study.trials
    assert a.state == TrialState.RUNNING  # Tune continues it
    assert b.state == TrialState.FAIL and b.user_attrs["raypeft.error"] == UNSNAPSHOTTED
    assert queued.state == TrialState.WAITING
    assert resumed.suggest("c") == late  # the configuration trains again, as trial "c"
    again = optuna.load_study(study_name="study", storage=url).trials[queued.number]
    assert again.user_attrs[RERUN_OF_ATTR] == b.number
    assert again.user_attrs["raypeft.tune_trial_id"] == "c"
    (rerun,) = reruns(open_storage(url), "study", "parent123")
    assert (rerun.number, rerun.tune_trial_id, rerun.again) == (b.number, "b", "c")
    # resumed again from a snapshot that knows "c": nothing is closed or queued
    resumed.save(str(tmp_path / "searcher.json"))
    third, _ = make_search(tmp_path, [ACC])
    third.restore(str(tmp_path / "searcher.json"))
    states = [t.state for t in optuna.load_study(study_name="study", storage=url).trials]
    assert states == [TrialState.RUNNING, TrialState.FAIL, TrialState.RUNNING]


def test_a_restarted_trials_repeated_steps_are_reported_once_and_quietly(tmp_path):
    """A restarted trial runs steps again: after its checkpoint (a killed worker, Ray's
    restart in the same search) or all of them (a search resumed in a new process, whose
    trial started over because its checkpoint was damaged). The study keeps each step's
    first value and Optuna's warning about a step reported twice is never raised."""
    search, url = make_search(tmp_path, [ACC])
    search.suggest("a")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        search.on_trial_result("a", result(10, 0.5))
        search.on_trial_result("a", result(20, 0.6))
        search.on_trial_result("a", result(20, 0.65))  # restarted from its step-10 checkpoint
        search.save(str(tmp_path / "searcher.json"))
        resumed, _ = make_search(tmp_path, [ACC])  # the resumed search's driver
        resumed.restore(str(tmp_path / "searcher.json"))
        for step, acc in ((10, 0.3), (20, 0.4), (30, 0.7)):  # started over from step 0
            resumed.on_trial_result("a", result(step, acc))
        resumed.on_trial_complete("a", result(30, 0.7))
    assert [str(w.message) for w in caught] == []
    (trial,) = optuna.load_study(study_name="study", storage=url).trials
    assert trial.intermediate_values == {10: 0.5, 20: 0.6, 30: 0.7}
    assert trial.state == TrialState.COMPLETE and trial.value == 0.7

    # what the searcher spares the user: Optuna warns at a step reported again
    study = optuna.load_study(study_name="study", storage=url)
    again = study.ask()
    again.report(0.1, 10)
    with pytest.warns(UserWarning, match="reported value is ignored"):
        again.report(0.2, 10)


def test_failed_trial_is_failed_not_pruned(tmp_path):
    search, url = make_search(tmp_path, [ACC])
    search.suggest("a")
    search.on_trial_result("a", result(10, 0.5))
    search.on_trial_complete("a", None, error=True)
    (trial,) = optuna.load_study(study_name="study", storage=url).trials
    assert trial.state == TrialState.FAIL


def refuse_ends(url: str, loudly: bool = True) -> None:
    """Make the study's sqlite file refuse to record any trial's end, attributes and
    intermediate values still written: a trigger on every change of a trial's state away from
    RUNNING. ``loudly``: it reads a table that does not exist (the storage raises); else it
    aborts the change (a constraint: Optuna's sqlite storage drops the end silently)."""
    body = (
        'SELECT * FROM "this study refuses to record ends"'
        if loudly
        else "SELECT RAISE(ABORT, 'this study refuses to record ends')"
    )
    with sqlite3.connect(url.removeprefix("sqlite:///")) as db:
        db.execute(
            "CREATE TRIGGER refuse_ends BEFORE UPDATE OF state ON trials "
            f"WHEN NEW.state != 'RUNNING' BEGIN {body}; END"
        )


def test_a_failed_tell_is_kept_with_its_reason_and_found_in_the_study(tmp_path):
    """The study refusing a trial's end does not fail the Tune trial (it trained): the
    searcher keeps why, and the study, read back, holds the trial RUNNING though Tune ended
    it: what the search's summary names."""
    search, url = make_search(tmp_path, [ACC])
    refuse_ends(url)
    search.suggest("a")
    search.suggest("b")
    search.on_trial_result("a", result(10, 0.5))
    search.on_trial_complete("a", result(30, 0.7))  # no exception reaches Tune
    ((number, (tune_id, why)),) = search.untold_trials().items()
    assert (number, tune_id) == (0, "a")
    assert why.startswith("StorageInternalError: ")
    assert "no such table: main.this study refuses to record ends" in why and "\n" not in why
    study = optuna.load_study(study_name="study", storage=url)
    assert [t.state for t in study.trials] == [TrialState.RUNNING] * 2
    assert study.trials[0].user_attrs[METRICS_ATTR]["best_val_accuracy"] == 0.7
    # "b" is still training: only what Tune ended is unrecorded
    assert unrecorded_ends(open_storage(url), "study", "parent123", {"a"}) == {0: "a"}
    assert unrecorded_ends(open_storage(url), "study", "another-search", {"a"}) == {}


def test_an_end_the_storage_drops_silently_is_found_in_the_study(tmp_path):
    """Optuna's sqlite storage answers an integrity error at a trial's end by dropping the
    end, and ``study.tell`` returns as if it had recorded it: only the study, read back,
    shows the trial RUNNING."""
    search, url = make_search(tmp_path, [ACC])
    refuse_ends(url, loudly=False)
    search.suggest("a")
    search.on_trial_complete("a", result(30, 0.7))
    assert search.untold_trials() == {}
    assert unrecorded_ends(open_storage(url), "study", "parent123", {"a"}) == {0: "a"}


@pytest.mark.slow
def test_multi_objective_values_and_constraints(tmp_path):
    constraints = Constraints({"trainable_params": Bound(max=100)})
    search, url = make_search(tmp_path, [ACC, SPEED], constraints)
    search.suggest("a")
    search.suggest("b")
    search.on_trial_complete("a", result(30, 0.7, train_samples_per_s=50.0, trainable_params=80))
    search.on_trial_complete("b", result(30, 0.8, train_samples_per_s=40.0, trainable_params=200))
    study = optuna.load_study(study_name="study", storage=url)
    a, b = study.trials
    assert a.values == [0.7, 50.0] and b.values == [0.8, 40.0]
    assert a.system_attrs["constraints:trainable_params<=100"] == -20
    assert b.system_attrs["constraints:trainable_params<=100"] == 100


def test_prepare_study_continues_history_and_clears_dead_trials(tmp_path):
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(study_name="s", storage=url, direction="maximize")
    done = study.ask({"x": optuna.distributions.CategoricalDistribution([1, 2])})
    study.tell(done, 0.5)
    study.ask({"x": optuna.distributions.CategoricalDistribution([1, 2])})  # left RUNNING
    study.enqueue_trial({"x": 2})  # left WAITING
    finished = prepare_study(open_storage(url), "s", ["max"])
    assert finished == [done.params]
    states = [t.state for t in optuna.load_study(study_name="s", storage=url).trials]
    assert states == [TrialState.COMPLETE, TrialState.FAIL, TrialState.FAIL]
    assert prepare_study(open_storage(url), "new", ["max"]) == []  # a new study
    with pytest.raises(ConfigError, match="search.study_name"):
        prepare_study(open_storage(url), "s", ["min"])


def test_prepare_study_leaves_the_trials_of_a_search_running_beside_it(tmp_path):
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(study_name="s", storage=url, direction="maximize")
    dist = {"x": optuna.distributions.CategoricalDistribution([1, 2])}
    host, pid, started = this_driver().rsplit("|", 2)
    drivers = {
        "live": this_driver(),  # a search running now, in this process
        "dead": f"{host}|{pid}|{float(started) - 100}",  # the same pid, started before: reused
        "elsewhere": "another-machine|1|0",  # cannot be checked from here: left alone
    }
    for parent, driver in drivers.items():
        study.set_user_attr(DRIVER_ATTR + parent, driver)
        study.ask(dist).set_user_attr(PARENT_RUN_ATTR, parent)
    study.ask(dist)  # just asked for by a search, not yet tagged with it
    prepare_study(open_storage(url), "s", ["max"])
    states = [t.state for t in optuna.load_study(study_name="s", storage=url).trials]
    assert states == [TrialState.RUNNING, TrialState.FAIL, TrialState.RUNNING, TrialState.RUNNING]


def test_a_search_names_its_process_in_the_study(tmp_path):
    search, url = make_search(tmp_path, [ACC])
    search.suggest("t1")
    study = optuna.load_study(study_name="study", storage=url)
    assert study.user_attrs[DRIVER_ATTR + "parent123"] == this_driver()


def test_remaining_grid_points_skip_what_ran():
    points = [{"a": 1, "b": 1}, {"a": 1, "b": 2}, {"a": 2, "b": 1}]
    finished = [{"a": 1, "b": 2, "c": 7}]
    assert remaining_grid_points(points, finished) == [{"a": 1, "b": 1}, {"a": 2, "b": 1}]


def test_default_storage_is_beside_the_mlflow_store(tmp_path, monkeypatch):
    monkeypatch.delenv("RAYPEFT_SEARCH_STORAGE", raising=False)
    cfg = experiment()
    assert search_storage_url(cfg, f"sqlite:///{tmp_path}/x/mlflow.db") == (
        f"sqlite:///{tmp_path}/x/optuna.db"
    )
    monkeypatch.chdir(tmp_path)
    assert search_storage_url(cfg, "http://mlflow:5000") == f"sqlite:///{tmp_path}/optuna.db"
    # what the file names wins
    named = experiment(storage="sqlite:///x.db")
    assert search_storage_url(named, "http://mlflow:5000") == "sqlite:///x.db"


def test_open_storage_bad_url_is_one_line():
    with pytest.raises(ConfigError, match="search.storage") as info:
        open_storage("nosuchdb://x")
    assert "\n" not in str(info.value)


def test_pareto_front():
    rows = [
        {"a": 0.9, "p": 100},  # front
        {"a": 0.8, "p": 50},  # front
        {"a": 0.8, "p": 60},  # dominated by row 1
        {"a": 0.7, "p": 100},  # dominated by row 0
        {"a": 0.6, "p": 10},  # front
    ]
    objectives = [ResolvedObjective("a", "max", "a"), ResolvedObjective("p", "min", "p")]
    assert pareto_front(rows, objectives) == [0, 1, 4]


def test_constraints_values_and_feasibility():
    c = Constraints({"trainable_params": Bound(max=100), "eval_samples_per_s": Bound(min=5)})
    assert c.named_values({"trainable_params": 80, "eval_samples_per_s": 7}) == {
        "trainable_params<=100": -20,
        "eval_samples_per_s>=5": -2,
    }
    assert c.feasible({"trainable_params": 80, "eval_samples_per_s": 7})
    assert not c.feasible({"trainable_params": 120, "eval_samples_per_s": 7})
    assert not c.feasible({"trainable_params": 80})  # never reported: not feasible
    assert math.isinf(c.named_values({})["trainable_params<=100"])


def test_objectives_resolve_with_modes_and_names():
    cfg = experiment(
        objectives=[{"metric": "accuracy"}, {"metric": "train_samples_per_s"}],
        constraints={"trainable_params": {"max": 500}},
    )
    objectives = resolve_objectives(cfg, TASK_METRICS)
    assert objectives == [
        ResolvedObjective("accuracy", "max", "best_val_accuracy"),
        ResolvedObjective("train_samples_per_s", "max", "train_samples_per_s"),
    ]
    assert resolve_constraints(cfg, TASK_METRICS).bounds == {"trainable_params": Bound(max=500)}
    single = resolve_objectives(experiment(metric="loss"), TASK_METRICS)
    assert single == [ResolvedObjective("loss", "min", "best_val_loss")]
    assert resolve_objectives(experiment(), TASK_METRICS)[0].result_key == "best_val_accuracy"


@pytest.mark.parametrize(
    "search,where",
    [
        ({"metric": "f1"}, "search.metric"),
        ({"objectives": [{"metric": "accuracy"}, {"metric": "speed"}]}, "search.objectives[1]"),
        ({"constraints": {"memory": {"max": 3}}}, "search.constraints.memory"),
    ],
)
def test_unknown_metric_names_are_one_line_errors(search, where):
    with pytest.raises(ConfigError) as info:
        cfg = experiment(**search)
        resolve_objectives(cfg, TASK_METRICS)
        resolve_constraints(cfg, TASK_METRICS)
    assert str(info.value).startswith(f"{where}") and "\n" not in str(info.value)


@pytest.mark.parametrize(
    "search,message",
    [
        ({"objectives": [{"metric": "accuracy"}]}, "at least 2"),
        ({"metric": "loss", "objectives": [{"metric": "accuracy"}, {"metric": "loss"}]}, "differs"),
        ({"objectives": [{"metric": "loss"}, {"metric": "loss"}]}, "repeat"),
        ({"constraints": {"trainable_params": {}}}, "max, min or both"),
        ({"constraints": {"trainable_params": {"min": 5, "max": 1}}}, "min <= max"),
        ({"sampler": "cmaes", "space": {"method.lr": {"choice": [0.1, 0.2]}}}, "cmaes needs"),
        ({"sampler": "grid"}, "space.method.lr is continuous"),
        (
            {"sampler": "grid", "num_samples": 3, "space": {"method.lr": {"grid": [0.1, 0.2]}}},
            "exceed the 2 combinations",
        ),
        ({"scheduler": {"type": "pbt"}}, "search.scheduler.type"),
    ],
)
def test_search_section_errors(search, message):
    with pytest.raises(ConfigError) as info:
        experiment(**search)
    assert message in str(info.value) and "\n" not in str(info.value)
    assert str(info.value).startswith("exp.yaml: search")


def test_samplers():
    assert isinstance(build_sampler(experiment()), optuna.samplers.TPESampler)
    assert isinstance(build_sampler(experiment(sampler="random")), optuna.samplers.RandomSampler)
    assert isinstance(build_sampler(experiment(sampler="cmaes")), optuna.samplers.CmaEsSampler)
    assert isinstance(build_sampler(experiment(sampler="nsga2")), optuna.samplers.NSGAIISampler)
    grid = experiment(
        sampler="grid",
        num_samples=6,
        space={"method.lr": {"grid": [0.1, 0.2]}, "method.prompt_length": {"choice": [2, 4, 8]}},
    )
    sampler = build_sampler(grid)
    assert isinstance(sampler, optuna.samplers.GridSampler)
    study = optuna.create_study(sampler=sampler, direction="maximize")
    seen = set()
    for _ in range(6):  # the grid sampler visits every combination once
        trial = study.ask()
        seen.add(
            (
                trial.suggest_categorical("method.lr", [0.1, 0.2]),
                trial.suggest_categorical("method.prompt_length", [2, 4, 8]),
            )
        )
        study.tell(trial, 0.0)
    assert len(seen) == 6


def test_a_trial_shorter_by_its_own_searched_length_is_complete_not_pruned(tmp_path):
    """train.max_steps searched: a trial of 20 steps that ran them all finished (the file's
    30 steps do not make it pruned), and one stopped at 20 of its 40 was pruned."""
    search, url = make_search(tmp_path, [ACC])
    for trial_id in ("short", "long"):
        search.suggest(trial_id)
    search.on_trial_complete("short", result(20, 0.6, length=20))
    search.on_trial_complete("long", result(20, 0.7, length=40))
    short, long = optuna.load_study(study_name="study", storage=url).trials
    assert short.state == TrialState.COMPLETE and short.value == 0.6
    assert long.state == TrialState.PRUNED


def test_the_schedulers_horizon_is_the_longest_trial_the_space_gives():
    assert experiment().most_evaluations() == 3  # BASE: 30 steps, evaluated every 10
    space = {"train.max_steps": {"choice": [20, 60]}, "train.eval_every": {"grid": [10, 5]}}
    assert experiment(space=space).most_evaluations() == 12


def test_a_trial_stopped_on_another_metric_is_complete_with_its_checkpoints_value(tmp_path):
    """search.scheduler.metric: val_loss under accuracy: ASHA judged the loss, not accuracy.
    The accuracy the trial's checkpoint holds is a real result, so Optuna holds it COMPLETE
    (study.best_trial and the dashboard see it) and notes where it stopped."""
    search, url = make_search(tmp_path, [ACC], prune_stopped=False)
    for trial_id in ("a", "b"):
        search.suggest(trial_id)
    search.on_trial_complete("a", result(30, 0.6))
    search.on_trial_result("b", result(10, 0.5))
    search.on_trial_complete("b", result(20, 0.7))  # stopped by ASHA on val_loss
    study = optuna.load_study(study_name="study", storage=url)
    b = study.trials[1]
    assert b.state == TrialState.COMPLETE and b.value == 0.7
    assert b.user_attrs[STOPPED_EARLY_ATTR] == 20
    assert study.best_trial.number == b.number


def test_which_stops_are_pruning():
    asha = {"type": "asha", "grace_period": 1}
    assert stops_on_objective(experiment(scheduler=asha), ACC)
    on_loss = experiment(scheduler={**asha, "metric": "val_loss"})
    assert not stops_on_objective(on_loss, ACC)
    assert not stops_on_objective(experiment(scheduler={"type": "none"}), ACC)


def test_the_study_names_its_objectives(tmp_path):
    cfg = experiment(storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    plan = plan_study(cfg, "sqlite:///unused.db", [ACC, SPEED])
    study = optuna.load_study(study_name=plan.study_name, storage=plan.storage_url)
    assert study.metric_names == ["accuracy", "train_samples_per_s"]


def test_a_continued_study_draws_new_configurations():
    """The sampler's seed moves on with the study's earlier trials: the same experiment run
    again explores instead of repeating its first search's proposals."""

    def first_proposals(earlier: int) -> list[float]:
        study = optuna.create_study(sampler=build_sampler(experiment(), earlier))
        return [study.ask().suggest_float("x", 0, 1) for _ in range(3)]

    assert first_proposals(0) == first_proposals(0)  # reproducible
    assert first_proposals(0) != first_proposals(3)


def count_statements(storage) -> list[str]:
    """Every SQL statement the storage's engine runs from now on (SQLAlchemy's event)."""
    import sqlalchemy

    seen: list[str] = []
    sqlalchemy.event.listen(
        storage.engine,
        "before_cursor_execute",
        lambda conn, cursor, statement, *rest: seen.append(statement.split()[0].upper()),
    )
    return seen


def run_trials(search, first: int, count: int, results: int) -> None:
    """``count`` trials driven as Tune drives them: suggest, ``results`` evaluations, end."""
    for n in range(first, first + count):
        trial_id = f"t{n}"
        search.suggest(trial_id)
        for k in range(1, results + 1):
            search.on_trial_result(trial_id, result(10 * k, 0.1 * k, length=10 * results))
        search.on_trial_complete(trial_id, result(10 * results, 0.1 * results, 10 * results))


@pytest.mark.slow
def test_the_study_is_read_once_per_trial_not_per_result(tmp_path):
    """What a trial costs the study grows neither with its evaluations nor with the trials run
    before it (issue 41): the trial's stored state is read at its first event only, so an
    evaluation costs the statements of Optuna's own ``Trial.report`` and nothing more (the
    searcher read the trial twice per result before: 183 SELECTs per trial of 8 evaluations
    against 57 now)."""
    search, _ = make_search(tmp_path, [ACC])
    statements = count_statements(search.storage)
    run_trials(search, 0, 10, results=2)
    two = len(statements)
    statements.clear()
    run_trials(search, 10, 10, results=8)  # six more evaluations per trial, ten trials later
    eight = len(statements)
    statements.clear()
    run_trials(search, 20, 10, results=8)
    assert len(statements) == eight, (two, eight, len(statements))  # flat in the trials run
    # one evaluation, reported straight to Optuna: what the searcher may spend per result
    scratch = search.study.ask()
    scratch.report(0.5, 1)
    statements.clear()
    scratch.report(0.6, 2)
    per_report = len(statements)
    extra = eight - two - 10 * 6 * per_report  # what the 60 more evaluations cost beyond that
    assert extra <= 10, (two, eight, per_report)  # a statement per trial at most
