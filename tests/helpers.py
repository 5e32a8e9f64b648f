"""Plain helpers shared by test modules (fixtures live in the conftest.py files).

Test modules import them as ``from tests.helpers import ...`` (pyproject's pytest
``pythonpath`` puts the repository root on ``sys.path``); no test module imports another.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml
from mlflow.tracking import MlflowClient

RAYPEFT = str(Path(sys.executable).with_name("raypeft"))  # the console script of this venv


def tiny_experiment(tmp_path: Path, **sections) -> Path:
    """A 3-trial DePT search on the tiny BERT and the packaged tweets."""
    cfg = {
        "name": "tiny-dept",
        "model": {"name": "tiny-bert", "max_length": 16},
        "task": {"name": "tweet_sentiment", "max_train_examples": 160, "max_eval_examples": 48},
        "method": {"name": "dept", "budget_prompt_length": 10, "prompt_length": 4},
        "train": {"max_steps": 12, "eval_every": 4, "batch_size": 8, "head_lr": 0.01},
        "space": {
            "method.lr_prompt": {"grid": [0.3, 0.5]},
            "method.lr_lowrank": {"grid": [1.0e-3]},
            "method.prompt_length": {"choice": [2, 4, 6]},
        },
        "search": {"num_samples": 3, "scheduler": {"type": "asha", "grace_period": 1}},
        "run": {"storage_path": str(tmp_path / "ray_results")},
    }
    for key, value in sections.items():
        cfg[key] = {**cfg.get(key, {}), **value}
    path = tmp_path / "experiment.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def cli_env() -> dict[str, str]:
    """The environment CLI subprocesses run in: offline, no Ray auth or usage stats, and
    the default MLflow store of their working directory."""
    env = dict(
        os.environ,
        RAY_AUTH_MODE="disabled",
        RAY_USAGE_STATS_ENABLED="0",
        MLFLOW_DISABLE_TELEMETRY="true",
        HF_HUB_OFFLINE="1",
    )
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def run_cli(
    args: list[str], cwd: Path, timeout: int = 600, stdin: str | None = None
) -> subprocess.CompletedProcess:
    """The ``raypeft`` console script in a subprocess, offline, with ``stdin`` as its input."""
    return subprocess.run(
        [RAYPEFT, *args],
        cwd=cwd,
        env=cli_env(),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def children(client: MlflowClient, experiment_id: str, parent_id: str):
    """The MLflow runs nested under ``parent_id`` (a search's trials)."""
    return client.search_runs([experiment_id], f"tags.mlflow.parentRunId = '{parent_id}'")
