"""The real ``raypeft tune`` CLI on a tiny model: real Ray (local), real MLflow (temp sqlite).

Each test runs the console script in a subprocess from a temp working directory, then reads
the MLflow store back and checks the parent run, one nested child per trial, per-evaluation
metrics and the trained artefacts.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient
from safetensors.torch import load_file

from tests.helpers import RAYPEFT, children, cli_env, run_cli, tiny_experiment

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("shared_ray")]


def check_search_logged(tmp_path: Path, expected_trials: int) -> tuple[MlflowClient, object, list]:
    """The MLflow store in tmp_path holds the parent run and its trials, completely."""
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("tiny-dept")
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id], "tags.`raypeft.role` = 'experiment'")
    assert len(runs) == 1
    parent = runs[0]
    assert parent.info.status == "FINISHED"
    for key in ("test_accuracy", "best_val_accuracy", "test_majority_class_accuracy"):
        assert key in parent.data.metrics
    assert parent.data.params["method.name"] == "dept"
    kids = children(client, experiment.experiment_id, parent.info.run_id)
    assert len(kids) == expected_trials
    for kid in kids:
        params = kid.data.params
        assert float(params["method.lr_prompt"]) in (0.3, 0.5)
        m = int(params["method.prompt_length"])
        rank = int(params["derived.rank"])
        # tiny-bert: d=32, s=16, l=10 -> r = floor((10-m)*32/48)
        assert rank == (10 - m) * 32 // 48
        assert int(params["method.rank"]) == rank  # the resolved method config is logged
        assert int(params["derived.trainable_params"]) == m * 32 + (16 + 32) * rank
        history = client.get_metric_history(kid.info.run_id, "val_accuracy")
        steps = [h.step for h in history]
        assert steps and steps == sorted(steps) and steps[0] == 4  # every evaluation, by step
        assert kid.info.status == "FINISHED"
        files = {f.path for f in client.list_artifacts(kid.info.run_id, "model")}
        assert {"model/trainable.safetensors", "model/config.yaml"} <= files
    # the best trial's artefacts load and hold only the trainable tensors
    best_id = parent.data.tags["raypeft.best_run_id"]
    local = client.download_artifacts(best_id, "model", str(tmp_path / "download"))
    tensors = load_file(str(Path(local) / "trainable.safetensors"))
    assert set(tensors) == {
        "method.prompt",
        "method.lora_a",
        "method.lora_b",
        "head.classifier.weight",
        "head.classifier.bias",
    }
    resolved = yaml.safe_load((Path(local) / "config.yaml").read_text())
    assert resolved["method"]["rank"] == tensors["method.lora_a"].shape[1]
    return client, parent, kids


def test_tune_in_process_trials_logged_to_mlflow(tmp_path):
    """As README's first command runs on a new machine: Ray's default authentication (token
    auth on, no token yet: Ray makes one) and no warning about it."""
    path = tiny_experiment(tmp_path)
    home = tmp_path / "home"  # no ~/.ray/auth_token yet
    home.mkdir()
    env = {k: v for k, v in cli_env().items() if k != "RAY_AUTH_MODE"} | {"HOME": str(home)}
    proc = subprocess.run(
        [RAYPEFT, "tune", "--space", str(path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (home / ".ray" / "auth_token").is_file()  # token authentication was on
    assert "Token authentication" not in proc.stdout + proc.stderr
    assert "Best trial" in proc.stdout and "majority-class accuracy" in proc.stdout
    assert "sqlite:///mlflow.db" in proc.stdout  # MLflow's default store, in the cwd
    _, _, kids = check_search_logged(tmp_path, expected_trials=3)
    # the joint grid (2 × 1 points) is run first, whole; Optuna samples the third trial
    assert {float(k.data.params["method.lr_prompt"]) for k in kids} == {0.3, 0.5}


def test_bad_file_fails_fast_and_creates_nothing(tmp_path):
    path = tiny_experiment(tmp_path)
    data = yaml.safe_load(path.read_text())
    data["method"]["learning_rate"] = 0.1  # unknown key
    path.write_text(yaml.safe_dump(data))
    before = set(os.listdir(tmp_path))
    proc = run_cli(["tune", "--space", str(path)], cwd=tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "method.learning_rate" in lines[0] and str(path) in lines[0]
    assert "Traceback" not in proc.stderr
    assert set(os.listdir(tmp_path)) == before  # no mlflow.db, no ray_results


def test_search_whose_trials_all_diverge_fails_with_one_line(tmp_path):
    # an absurd learning rate makes the loss non-finite within a few steps
    path = tiny_experiment(
        tmp_path,
        train={"head_lr": 1.0e30, "warmup_ratio": 0.0},
        space={"method.lr_prompt": {"grid": [1.0e30]}},
        search={"num_samples": 1, "scheduler": {"type": "none"}},
    )
    proc = run_cli(["tune", "--space", str(path), "--quiet"], cwd=tmp_path)
    assert proc.returncode == 1
    error = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(error) == 1 and "1 of 1 trials failed" in error[0], proc.stderr[-2000:]
    assert "NonFiniteLossError" in error[0]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("tiny-dept")
    (parent,) = client.search_runs([experiment.experiment_id], "tags.`raypeft.role` = 'experiment'")
    assert parent.info.status == "FAILED"
    (kid,) = children(client, experiment.experiment_id, parent.info.run_id)
    assert kid.info.status == "FAILED"
    assert "NonFiniteLossError" in kid.data.tags["raypeft.error"]
