"""Fixtures of the bad-input suite: Ray, MLflow and Optuna guarded, and one case run through
``raypeft tune`` and ``raypeft validate``."""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner

from raypeft.cli.main import main

from .helpers import Case, Reached, build, check_result, listing


@pytest.fixture
def guarded(monkeypatch):
    """Ray, MLflow and Optuna entry points that a rejected input must never reach."""
    import mlflow.tracking
    import optuna
    import ray

    hits: list[str] = []

    def guard(name: str):
        def reached(*args, **kwargs):
            hits.append(name)
            raise Reached(f"{name} reached")

        return reached

    monkeypatch.setattr(ray, "init", guard("ray.init"))
    client = mlflow.tracking.MlflowClient
    monkeypatch.setattr(client, "create_experiment", guard("MlflowClient.create_experiment"))
    monkeypatch.setattr(client, "create_run", guard("MlflowClient.create_run"))
    monkeypatch.setattr(optuna, "create_study", guard("optuna.create_study"))
    monkeypatch.setattr(optuna.storages.RDBStorage, "__init__", guard("optuna RDBStorage"))
    # opening a sqlite MLflow store creates its file (mlflow.db); MLflow caches the engine per
    # URI, so a fresh map makes every case open its own, as a new process would
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    monkeypatch.setattr(SqlAlchemyStore, "_engine_map", {})
    monkeypatch.setattr(SqlAlchemyStore, "__init__", guard("MLflow SqlAlchemyStore (mlflow.db)"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return hits


def _skip_if_unrunnable(case: Case) -> None:
    if case.needs_non_root and hasattr(os, "geteuid") and os.geteuid() == 0:
        pytest.skip("root reads files whatever their mode")
    if case.needs_no_gpu:
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has a GPU")


@pytest.fixture
def run_case(tmp_path, monkeypatch, guarded):
    """Run a case through ``raypeft tune`` (click's CliRunner, in a fresh working directory),
    then, unless the command line is tune's alone, through ``raypeft validate``: the same
    error line, the same exit code, nothing created."""

    def run(case: Case) -> str:
        _skip_if_unrunnable(case)
        monkeypatch.chdir(tmp_path)
        space = build(case, tmp_path)
        before = listing(tmp_path)
        runner = CliRunner()
        result = runner.invoke(main, ["tune", "--space", str(space), *case.args])
        line = check_result(result, case, before, tmp_path, guarded)
        if not case.tune_only:
            again = runner.invoke(main, ["validate", str(space), *case.args])
            assert check_result(again, case, before, tmp_path, guarded) == line
        return line

    return run
