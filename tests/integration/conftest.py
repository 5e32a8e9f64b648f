"""Fixtures shared by the integration tests: one small finished search, run once per session."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from filelock import FileLock
from mlflow.tracking import MlflowClient

from tests.helpers import TINY_SEARCH_BASE, run_cli


@dataclass
class FinishedSearch:
    """A finished ``raypeft tune`` run in its own working directory."""

    cwd: Path  # holds mlflow.db (the default store) and ray_results/
    experiment: str
    tracking_uri: str
    stdout: str

    def client(self) -> MlflowClient:
        return MlflowClient(tracking_uri=self.tracking_uri)

    def parent_run(self):
        """The search's MLflow parent run."""
        client = self.client()
        exp = client.get_experiment_by_name(self.experiment)
        (parent,) = client.search_runs([exp.experiment_id], "tags.`raypeft.role` = 'experiment'")
        return parent


@pytest.fixture(scope="session")
def finished_search(tmp_path_factory) -> FinishedSearch:
    """A DePT search on tiny BERT: the α1 × α2 joint grid (2 × 2), m sampled, ASHA on.

    Shared by the report, predict, export and ui tests, which read it back from MLflow only.
    Do not write into its store from a test: copy it first. Under pytest-xdist each worker is
    a session of its own: the first worker that needs the search runs it, in the folder all
    workers of the run share, and the others wait for it and read it.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if worker else base  # pytest-N/, above each worker's popen-gwK/
    with FileLock(str(shared / "finished-search.lock")):
        cwd = shared / "finished-search"
        done = cwd / "stdout.txt"
        if not done.exists():
            _run_finished_search(cwd)
    return FinishedSearch(
        cwd=cwd,
        experiment="tiny-search",
        tracking_uri=f"sqlite:///{cwd / 'mlflow.db'}",
        stdout=done.read_text(),
    )


def _run_finished_search(cwd: Path) -> None:
    """Run the shared search in ``cwd``; its output goes to ``cwd/stdout.txt`` once it
    succeeded (the mark that it is done)."""
    cwd.mkdir(exist_ok=True)
    cfg = {
        "name": "tiny-search",
        **TINY_SEARCH_BASE,
        "space": {
            "method.lr_prompt": {"grid": [0.3, 0.5]},
            "method.lr_lowrank": {"grid": [1.0e-3, 1.0e-2]},
            "method.prompt_length": {"choice": [2, 4, 6]},
        },
        "search": {"num_samples": 5, "scheduler": {"type": "asha", "grace_period": 1}},
        "run": {"storage_path": str(cwd / "ray_results")},
    }
    path = cwd / "experiment.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = run_cli(["tune", "--space", str(path), "--quiet"], cwd=cwd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (cwd / "stdout.txt").write_text(proc.stdout)
