"""``raypeft tune --resume`` of a search whose driver died after its Tune run had finished:
during the test-split evaluation of the best trial, or while the repeats of the top
configurations (``search.repeat_best``) trained. The resumed search completes the missing
phases without training anything again: the finished Tune experiment is restored as it was,
the repeats continue from their checkpoints, and nothing is logged or recorded twice.

The driver is killed at a moment read from the outside, as a user would see it: MLflow's
runs, and the experiment state Ray Tune saves in its folder.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import optuna
import pytest
from mlflow.tracking import MlflowClient

from tests.helpers import (
    assert_each_step_once,
    children,
    kill_session,
    run_cli,
    start_search,
    tiny_experiment,
    wait_for,
)

pytestmark = pytest.mark.integration

NAME = "tiny-dept"


class Search:
    """The records of the one search in ``cwd``, read as they grow: MLflow and Tune's state."""

    def __init__(self, cwd: Path):
        self.cwd = cwd
        self._client: MlflowClient | None = None

    @property
    def client(self) -> MlflowClient:
        if self._client is None:
            self._client = MlflowClient(tracking_uri=f"sqlite:///{self.cwd / 'mlflow.db'}")
        return self._client

    def parent(self):
        experiment = self.client.get_experiment_by_name(NAME)
        if experiment is None:
            return None
        found = self.client.search_runs(
            [experiment.experiment_id], "tags.`raypeft.role` = 'experiment'"
        )
        return found[0] if found else None

    def kids(self, role: str | None = None) -> list:
        parent = self.parent()
        runs = children(self.client, parent.info.experiment_id, parent.info.run_id)
        return [r for r in runs if role is None or r.data.tags.get("raypeft.role") == role]

    def tune_folder(self, suffix: str = "") -> Path:
        return Path(self.parent().data.tags["raypeft.tune_path"] + suffix)

    def tune_trials(self, suffix: str = "") -> dict[str, dict]:
        """The trials of Tune's newest saved experiment state: id -> status and last step."""
        try:
            newest = max(self.tune_folder(suffix).glob("experiment_state-*.json"))
            state = json.loads(newest.read_text())
        except (ValueError, OSError, json.JSONDecodeError):  # none yet, or being written
            return {}
        out = {}
        for trial_json, metadata_json in state["trial_data"]:
            trial, metadata = json.loads(trial_json), json.loads(metadata_json)
            last = metadata.get("last_result") or {}
            out[trial["trial_id"]] = {"status": trial["status"], "step": last.get("step", 0)}
        return out

    def history(self, run_id: str) -> dict[str, list[tuple[int, float]]]:
        """Every metric the run logged, with its steps (train and validation curves)."""
        out = {}
        for key in ("train_loss", "val_accuracy", "best_val_accuracy"):
            out[key] = [(m.step, m.value) for m in self.client.get_metric_history(run_id, key)]
        return out

    def optuna_trials(self) -> list[tuple[int, str, float | None]]:
        study = optuna.load_study(study_name=NAME, storage=f"sqlite:///{self.cwd / 'optuna.db'}")
        return [(t.number, t.state.name, t.value) for t in study.trials]

    def result_lines(self) -> dict[str, int]:
        """How many results each trial folder of the search's Tune experiment holds (a trial
        trained again would add some)."""
        return {
            p.parent.name: len(p.read_text().splitlines())
            for p in self.tune_folder().glob("*/result.json")
        }


def parent_running_after_tune(search: Search, num_samples: int):
    """Tune's experiment ended (its saved state: every trial TERMINATED, the MLflow runs
    FINISHED) and the parent run is still RUNNING: the test evaluation or the repeats."""
    try:
        parent = search.parent()
        if parent is None or parent.info.status != "RUNNING":
            return False
        trials = search.tune_trials()
        if len(trials) < num_samples or any(t["status"] != "TERMINATED" for t in trials.values()):
            return False
        kids = search.kids("trial")
        return len(kids) == num_samples and all(k.info.status == "FINISHED" for k in kids)
    except Exception:  # the store is being written
        return False


def snapshot(search: Search) -> dict:
    """What must stay as it is: the trials' runs, their curves, Optuna's trials."""
    kids = search.kids("trial")
    return {
        "runs": {
            k.data.tags["raypeft.trial_id"]: (
                k.info.run_id,
                k.info.status,
                k.info.end_time,
                search.history(k.info.run_id),
            )
            for k in kids
        },
        "optuna": search.optuna_trials(),
    }


def resume(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    resumed = run_cli(["tune", *args, "--resume"], cwd=cwd, timeout=900)
    (cwd / "resume.log").write_text(resumed.stdout + resumed.stderr)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return resumed


def assert_parent_finished(search: Search, parent_before, num_trials: int) -> dict:
    """The same parent run, FINISHED, with what an uninterrupted search records on it."""
    parent = search.parent()
    assert parent.info.run_id == parent_before.info.run_id
    assert parent.info.status == "FINISHED"
    metrics = parent.data.metrics
    assert metrics["num_trials"] == num_trials and metrics["num_failed_trials"] == 0
    for key in ("accuracy", "macro_f1"):
        assert 0 <= metrics[f"best_val_{key}"] <= 1 and 0 <= metrics[f"test_{key}"] <= 1
    assert 0 < metrics["test_majority_class_accuracy"] <= 1
    best_run = parent.data.tags["raypeft.best_run_id"]
    assert best_run in {k.info.run_id for k in search.kids("trial")}
    best_val = search.client.get_run(best_run).data.metrics["best_val_accuracy"]
    assert metrics["best_val_accuracy"] == pytest.approx(best_val)
    # logged once each: the parent's metrics have a single value
    for key in metrics:
        assert len(search.client.get_metric_history(parent.info.run_id, key)) == 1, key
    return metrics


def assert_trials_untouched(search: Search, before: dict, lines_before: dict[str, int]):
    """The search's own trials: no run added, changed or re-opened, no Tune trial re-run,
    no Optuna trial added or changed."""
    after = snapshot(search)
    assert after["runs"] == before["runs"]
    assert after["optuna"] == before["optuna"]
    assert search.result_lines() == lines_before


def test_driver_killed_during_the_test_evaluation_resumes_without_training(tmp_path):
    num_samples, steps, every = 2, 40, 10
    path = tiny_experiment(
        tmp_path,
        # the packaged tweets' whole test split (2,000): scoring it takes seconds
        train={"max_steps": steps, "eval_every": every},
        search={"num_samples": num_samples, "max_concurrent": 1, "scheduler": {"type": "none"}},
    )
    args = ["--space", str(path), "--quiet"]
    search = Search(tmp_path)
    proc = start_search(args, tmp_path)
    try:
        wait_for(
            lambda: parent_running_after_tune(search, num_samples), "the test phase", 600, proc
        )
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        kill_session(proc)

    parent = search.parent()
    assert parent.info.status == "RUNNING", "killed too late: the search had finished"
    assert "test_accuracy" not in parent.data.metrics
    before, lines_before = snapshot(search), search.result_lines()
    assert len(before["runs"]) == len(lines_before) == num_samples
    assert [state for _, state, _ in before["optuna"]] == ["COMPLETE"] * num_samples

    resumed = resume(args, tmp_path)
    assert f"{num_samples} trials" in resumed.stdout

    assert_parent_finished(search, parent, num_samples)
    assert_trials_untouched(search, before, lines_before)
    for kid in search.kids():
        assert_each_step_once(search.client, kid.info.run_id, steps, every)


def test_driver_killed_during_the_repeats_resumes_them_from_their_checkpoints(tmp_path):
    num_samples, seeds, steps, every = 2, 2, 1000, 100  # ~10-20 s per trial on tiny-bert
    path = tiny_experiment(
        tmp_path,
        train={"max_steps": steps, "eval_every": every},
        search={
            "num_samples": num_samples,
            "max_concurrent": 1,
            "scheduler": {"type": "none"},
            "repeat_best": {"top_k": 1, "seeds": seeds},
        },
    )
    args = ["--space", str(path), "--quiet"]
    search = Search(tmp_path)
    proc = start_search(args, tmp_path)
    try:
        wait_for(lambda: parent_running_after_tune(search, num_samples), "the repeats", 600, proc)

        def repeat_mid_way() -> list[str]:  # Tune saved it past a checkpoint, unfinished
            trials = search.tune_trials("-repeats")
            return [
                t
                for t, s in trials.items()
                if s["status"] == "RUNNING" and 3 * every <= s["step"] < steps - every
            ]

        interrupted = wait_for(repeat_mid_way, "a repeat past a checkpoint", 600, proc)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        kill_session(proc)

    parent = search.parent()
    assert parent.info.status == "RUNNING"
    before, lines_before = snapshot(search), search.result_lines()
    assert len(before["runs"]) == len(lines_before) == num_samples
    repeats_before = {k.data.tags["raypeft.trial_id"]: k for k in search.kids("repeat")}
    assert interrupted[0] in repeats_before
    assert repeats_before[interrupted[0]].info.status == "RUNNING"

    resume(args, tmp_path)

    metrics = assert_parent_finished(search, parent, num_samples)
    # the chosen configuration's seeds: the original trial and each repeat, scored once
    assert metrics["test_accuracy_seeds"] == seeds + 1
    assert {"test_accuracy_mean", "test_accuracy_std", "repeat_0_mean_val_accuracy"} <= set(metrics)
    assert_trials_untouched(search, before, lines_before)

    # one run per repeat, each FINISHED with every step once and no error
    repeats = search.kids("repeat")
    trial_ids = [r.data.tags["raypeft.trial_id"] for r in repeats]
    assert len(repeats) == seeds and len(set(trial_ids)) == seeds, trial_ids
    assert set(repeats_before) <= set(trial_ids)
    tuned = search.tune_trials("-repeats")
    assert set(tuned) == set(trial_ids)
    assert all(t["status"] == "TERMINATED" for t in tuned.values())
    for run in repeats:
        assert run.info.status == "FINISHED"
        assert "raypeft.error" not in run.data.tags, run.data.tags["raypeft.error"]
        assert_each_step_once(search.client, run.info.run_id, steps, every)
    by_trial = {r.data.tags["raypeft.trial_id"]: r for r in repeats}
    # the interrupted repeat continued its own run from a checkpoint, not from step 0: the one
    # the driver's last experiment snapshot named (every second here: start_search), which may
    # be a step or two behind the result the test saw before the kill
    resumed_at = int(by_trial[interrupted[0]].data.tags["raypeft.resumed_from_step"])
    assert every <= resumed_at < steps
    seeds_by_run = sorted(int(r.data.params["train.seed"]) for r in repeats)
    assert seeds_by_run == [43, 44]  # train.seed (42) + 1 .. seeds, each trained once
