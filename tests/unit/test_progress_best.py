"""The live table's "best" names a finished trial only (issue 12, item 6).

Real Tune ``Trial`` objects (``stub=True``: no registered trainable needed), moved through the
statuses Tune gives them and fed results shaped like a trial's reports.
"""

from __future__ import annotations

from ray.tune.experiment import Trial

from raypeft.search.progress import ProgressPrinter
from raypeft.training.result_keys import FAILURE_KEY

METRIC = "best_val_accuracy"


def tune_trial(status: str, lr: float, reports: list[dict]) -> Trial:
    """A trial that ran, reported ``reports`` (one per evaluation), and is now ``status``."""
    trial = Trial("trial_in_process", config={"method.lr": lr}, stub=True)
    trial.set_status(Trial.RUNNING)
    for i, report in enumerate(reports, start=1):
        trial.update_last_result(
            {**report, "training_iteration": i, "done": False, "trial_id": trial.trial_id}
        )
    trial.set_status(status)
    return trial


def evals(*values: float, every: int = 10) -> list[dict]:
    """Reports of a trial evaluated every ``every`` steps, its best value so far each time."""
    best = 0.0
    out = []
    for i, value in enumerate(values, start=1):
        best = max(best, value)
        out.append({"step": i * every, "val_accuracy": value, METRIC: best, "val_loss": 1 - value})
    return out


def printer(mode: str = "max") -> ProgressPrinter:
    return ProgressPrinter(["method.lr"], METRIC, mode, num_samples=6)


def best_line(table: str) -> str:
    return table.splitlines()[0].split("; ", 1)[1]


def test_best_is_a_finished_trial_not_a_running_one():
    finished = tune_trial(Trial.TERMINATED, 0.1, evals(0.5, 0.55, 0.6))
    running = [
        tune_trial(Trial.RUNNING, 0.2, evals(0.8)),
        tune_trial(Trial.RUNNING, 0.3, evals(0.7, 0.9)),
    ]
    table = printer().table([finished, *running])
    assert best_line(table) == f"best {METRIC} 0.6 ({finished})"
    # running trials still show first, with what they reported so far
    names = [row.split()[0] for row in table.splitlines()[2:]]
    assert names == [str(running[0]), str(running[1]), str(finished)]


def test_restarted_errored_and_diverged_trials_are_not_best():
    """A trial Tune restarts after its worker died is PENDING with its earlier results; an
    errored trial and a diverged one (ends normally with FAILURE_KEY) are failures."""
    finished = tune_trial(Trial.TERMINATED, 0.1, evals(0.6, 0.62, 0.61))
    stopped_early = tune_trial(Trial.TERMINATED, 0.2, evals(0.58))  # ASHA: ended, counts
    restarted = tune_trial(Trial.PENDING, 0.3, evals(0.95))
    errored = tune_trial(Trial.ERROR, 0.4, evals(0.97))
    diverged_reports = evals(0.99, 0.5)
    diverged_reports[-1][FAILURE_KEY] = "loss is nan at step 20"
    diverged = tune_trial(Trial.TERMINATED, 0.5, diverged_reports)
    queued = Trial("trial_in_process", config={"method.lr": 0.6}, stub=True)  # PENDING
    trials = [finished, stopped_early, restarted, errored, diverged, queued]
    table = printer().table(trials)
    assert best_line(table) == f"best {METRIC} 0.62 ({finished})"
    names = [row.split()[0] for row in table.splitlines()[2:]]
    assert names == [str(restarted), str(finished), str(stopped_early)]


def test_best_in_min_mode_and_none_before_any_trial_ends():
    running = tune_trial(Trial.RUNNING, 0.1, evals(0.9))
    assert "best" not in printer().table([running]).splitlines()[0]
    low = tune_trial(Trial.TERMINATED, 0.2, evals(0.3))
    high = tune_trial(Trial.TERMINATED, 0.3, evals(0.4))
    assert best_line(printer("min").table([running, high, low])) == f"best {METRIC} 0.3 ({low})"


def test_a_resumed_search_shows_the_earlier_searchs_trials_as_they_ended():
    """Resumed, the search's table holds the trials the paused one finished (TERMINATED when
    first seen): finished or stopped early, not interrupted; a trial this search saw training
    and that ended without completing (a new pause) is interrupted."""
    earlier = tune_trial(
        Trial.TERMINATED, 0.1, [{**r, "trial_max_steps": 30} for r in evals(0.5, 0.6, 0.7)]
    )
    live = tune_trial(Trial.RUNNING, 0.2, evals(0.6))
    shown = printer()
    shown.table([earlier, live])  # the first table of the resumed search
    live.set_status(Trial.TERMINATED)  # paused again before it completed
    rows = {row.split()[0]: row.split()[1] for row in shown.table([earlier, live]).splitlines()[2:]}
    assert rows == {str(earlier): "finished", str(live): "interrupted"}


def test_a_resumed_search_counts_the_trials_its_first_run_ended():
    """The trials a paused search ended are restored as Tune ended them; the resumed search's
    first trial end is numbered after them ([3/6] after 2), not [1/6]."""
    lines = []
    progress = ProgressPrinter(["method.lr"], METRIC, "max", num_samples=6, echo=lines.append)
    ended = [tune_trial(Trial.TERMINATED, 0.1, evals(0.5)), tune_trial(Trial.ERROR, 0.2, [])]
    resumed = tune_trial(Trial.PENDING, 0.3, evals(0.6))
    progress.on_step_begin(0, [*ended, resumed])
    resumed.set_status(Trial.RUNNING)
    resumed.update_last_result({**evals(0.6, 0.7)[-1], "training_iteration": 2, "done": True})
    resumed.set_status(Trial.TERMINATED)
    progress.on_step_begin(1, [*ended, resumed])  # later steps change nothing
    progress.on_trial_complete(1, [*ended, resumed], resumed)
    assert lines == [f"[3/6] {resumed} stopped early at step 20: {METRIC} 0.7"]


def test_a_new_search_counts_from_one():
    lines = []
    progress = ProgressPrinter(["method.lr"], METRIC, "max", num_samples=6, echo=lines.append)
    progress.on_step_begin(0, [])
    trial = tune_trial(Trial.TERMINATED, 0.1, evals(0.5))
    progress.on_trial_error(1, [trial], trial)
    assert lines == [f"[1/6] {trial} FAILED (see its MLflow run)"]
