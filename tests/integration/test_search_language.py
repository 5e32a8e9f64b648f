"""The search language through the real CLI: pruned trials in the persisted Optuna study, a
continued study, multi-objective search with constraints, repeated seeds, other samplers and
schedulers, and --quiet."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
import yaml
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState

from tests.helpers import children, run_cli, tiny_experiment

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("shared_ray")]


def _parent(client: MlflowClient, name: str, index: int = 0):
    experiment = client.get_experiment_by_name(name)
    runs = client.search_runs(
        [experiment.experiment_id],
        "tags.`raypeft.role` = 'experiment'",
        order_by=["attributes.start_time ASC"],
    )
    return experiment, runs[index]


def test_pruned_trials_reach_the_persisted_study_which_a_second_search_continues(tmp_path):
    path = tiny_experiment(
        tmp_path,
        train={"max_steps": 24, "eval_every": 4},
        # a space with an integer range: proposals are not deduplicated (only all-discrete
        # spaces are; test_repeated_configurations.py), so the study holds 6 trained trials
        space={"method.prompt_length": {"int": [2, 6]}},
        # validation loss varies between trials even on the tiny model, so ASHA stops some
        search={
            "num_samples": 6,
            "metric": "loss",
            "scheduler": {"type": "asha", "grace_period": 1, "reduction_factor": 3},
        },
    )
    proc = run_cli(["tune", "--space", str(path), "--progress-interval", "5"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "stopped early at step" in proc.stdout  # a progress line per finished trial
    assert "--- " in proc.stdout  # the live table was printed at least once (and at the end)

    storage = f"sqlite:///{tmp_path / 'optuna.db'}"  # beside mlflow.db, by default
    study = optuna.load_study(study_name="tiny-dept", storage=storage)
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment, parent = _parent(client, "tiny-dept")
    assert parent.data.tags["raypeft.optuna_storage"] == storage
    assert parent.data.tags["raypeft.optuna_study"] == "tiny-dept"
    kids = {
        k.data.tags["raypeft.trial_id"]: k
        for k in children(client, experiment.experiment_id, parent.info.run_id)
    }
    trials = study.trials
    assert len(trials) == 6
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert pruned and complete, [t.state for t in trials]
    for trial in trials:
        kid = kids[trial.user_attrs["raypeft.tune_trial_id"]]
        steps = [m.step for m in client.get_metric_history(kid.info.run_id, "val_loss")]
        # Optuna holds one intermediate value per evaluation, keyed by training step
        assert sorted(trial.intermediate_values) == steps
        if trial.state == TrialState.PRUNED:
            assert max(steps) < 24 and trial.user_attrs["raypeft.pruned_at_step"] == max(steps)
            assert trial.value == trial.intermediate_values[max(steps)]
            assert kid.data.tags["raypeft.stopped_early"] == "true"
        else:
            assert max(steps) == 24 and trial.value == pytest.approx(
                float(kid.data.metrics["best_val_loss"])
            )
        for key in (
            "trainable_params",
            "train_samples_per_s",
            "eval_samples_per_s",
            "peak_memory_mb",
            "wall_time_s",
        ):
            assert key in kid.data.metrics and kid.data.metrics[key] > 0  # efficiency logged
            assert key in trial.user_attrs["raypeft.metrics"]

    # the same experiment again: the study keeps its history; grid points already run are
    # not enqueued again; another sampler and scheduler work on the same study
    again = run_cli(
        [
            "tune",
            "--space",
            str(path),
            "--set",
            "search.num_samples=2",
            "--set",
            "search.sampler=random",
            "--set",
            "search.scheduler.type=median",
        ],
        cwd=tmp_path,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert "continuing Optuna study 'tiny-dept'" in again.stdout
    assert "6 earlier trials, 2 grid points already run" in again.stdout
    study = optuna.load_study(study_name="tiny-dept", storage=storage)
    assert len(study.trials) == 8
    _, second = _parent(client, "tiny-dept", 1)
    assert {t.user_attrs["raypeft.parent_run_id"] for t in study.trials[6:]} == {second.info.run_id}


def test_multi_objective_with_constraints_and_repeated_seeds(tmp_path):
    path = tiny_experiment(
        tmp_path,
        space={
            "method.lr_prompt": {"loguniform": [0.01, 0.5]},
            "method.prompt_length": {"choice": [2, 4, 6, 8]},
        },
        search={
            "num_samples": 4,
            "objectives": [{"metric": "loss"}, {"metric": "trainable_params"}],
            "constraints": {"trainable_params": {"max": 400}},
            "repeat_best": {"top_k": 2, "seeds": 1},
            "trial_seed": "per_trial",
            "scheduler": {"type": "hyperband", "grace_period": 1, "brackets": 2},
        },
    )
    proc = run_cli(["tune", "--space", str(path)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Pareto front (loss vs trainable_params)" in proc.stdout
    assert "repeated seeds (mean ± std of validation loss)" in proc.stdout
    assert "test over its 2 seeds" in proc.stdout

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment, parent = _parent(client, "tiny-dept")
    assert json.loads(parent.data.tags["raypeft.objectives"]) == [
        {"metric": "loss", "mode": "min"},
        {"metric": "trainable_params", "mode": "min"},
    ]
    local = Path(client.download_artifacts(parent.info.run_id, "", str(tmp_path / "art")))
    front = json.loads((local / "pareto_front.json").read_text())
    repeats = json.loads((local / "repeats.json").read_text())
    assert front and all(p["trainable_params"] <= 400 for p in front)
    assert len(repeats) == 2 and all(len(r["scores_by_seed"]) == 2 for r in repeats)
    for key in ("test_accuracy_mean", "test_accuracy_std", "repeat_0_mean_val_loss"):
        assert key in parent.data.metrics

    runs = children(client, experiment.experiment_id, parent.info.run_id)
    trials = [r for r in runs if r.data.tags["raypeft.role"] == "trial"]
    repeat_runs = [r for r in runs if r.data.tags["raypeft.role"] == "repeat"]
    assert len(trials) == 4 and len(repeat_runs) == 2
    seeds = sorted(int(r.data.params["train.seed"]) for r in trials)
    assert len(set(seeds)) == 4  # per_trial: each trial its own seed
    by_trial = {r.data.tags["raypeft.trial_id"]: r for r in trials}
    for run in repeat_runs:
        original = by_trial[run.data.tags["raypeft.repeat_of"]]
        assert int(run.data.params["train.seed"]) == int(original.data.params["train.seed"]) + 1
        assert run.data.params["method.lr_prompt"] == original.data.params["method.lr_prompt"]
    on_front = {
        r.data.tags["raypeft.trial_id"]
        for r in trials
        if r.data.tags.get("raypeft.pareto_front") == "true"
    }
    assert on_front == {p["trial_id"] for p in front}


def test_cmaes_with_median_stopping_quiet(tmp_path):
    path = tiny_experiment(
        tmp_path,
        space={
            "method.lr_prompt": {"loguniform": [0.01, 0.5]},
            "method.lr_lowrank": {"loguniform": [1.0e-4, 1.0e-2]},
        },
        search={
            "num_samples": 3,
            "sampler": "cmaes",
            "metric": "loss",
            "scheduler": {"type": "median", "grace_period": 1, "min_samples_required": 1},
        },
    )
    proc = run_cli(["tune", "--space", str(path), "--quiet"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # --quiet: the final summary only - no progress lines, no Ray or Optuna chatter
    assert proc.stdout.lstrip().startswith("Search finished: 3 trials")
    assert "[1/3]" not in proc.stdout and "WARNING" not in proc.stdout + proc.stderr
    study = optuna.load_study(study_name="tiny-dept", storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    assert len(study.trials) == 3 and all(
        t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in study.trials
    )


def test_bad_search_section_fails_before_anything_starts(tmp_path):
    path = tiny_experiment(
        tmp_path, search={"objectives": [{"metric": "accuracy"}, {"metric": "speed"}]}
    )
    proc = run_cli(["tune", "--space", str(path)], cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"error: {path}: search.objectives[1].metric: 'speed' is not reported for this task; "
        "choose one of ('accuracy', 'macro_f1', 'loss', 'trainable_params', "
        "'train_samples_per_s', 'eval_samples_per_s', 'peak_memory_mb', 'wall_time_s')"
    )
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "optuna.db").exists()
    data = yaml.safe_load(path.read_text())
    assert data["search"]["objectives"][1]["metric"] == "speed"  # the file is untouched
