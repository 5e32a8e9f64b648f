"""Whole searches, as ``raypeft tune`` runs them (:func:`raypeft.search.run.run_experiment`):
an experiment in a folder of its own, timed, with the seconds its phases took as the search
reports them (``SearchSummary.phase_s``)."""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from pathlib import Path


def quiet_and_local() -> None:
    """No usage stats, telemetry or tokenizer thread pools: a benchmark measures the search."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


def experiment_in(space: Path, name: str, overrides: list[str], folder: Path):
    """The experiment file ``space`` with ``overrides`` (as ``raypeft tune --set``), renamed
    ``name``, its MLflow store and Ray results in ``folder``."""
    from raypeft.config.loading import load_experiment  # why: --help starts fast

    return load_experiment(
        space,
        [
            *overrides,
            f"name={name}",
            f"tracking.uri=sqlite:///{folder / 'mlflow.db'}",
            f"run.storage_path={folder / 'ray_results'}",
        ],
    )


@contextmanager
def working_directory(folder: Path):
    """Run in ``folder``: MLflow's sqlite store puts artifacts in ./mlruns of it."""
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(cwd)


def paths_from_here(cfg):
    """``cfg`` with its local data paths (``task.data_dir``, ``task.files``) made absolute
    from the current folder: a search run in a folder of its own would otherwise look for a
    relative path there."""
    task = cfg.task
    update = {}
    if task.data_dir is not None:
        update["data_dir"] = task.data_dir.resolve()
    if task.files:
        update["files"] = {split: path.resolve() for split, path in task.files.items()}
    return cfg.model_copy(update={"task": task.model_copy(update=update)})


def timed_search(cfg, folder: Path):
    """Run the search ``cfg`` in ``folder`` and shut its Ray down, as one ``raypeft tune``
    would; ``(summary, wall seconds)``."""
    import ray  # why: the step benchmarks run where Ray is absent

    from raypeft.search.run import run_experiment

    cfg = paths_from_here(cfg)
    with working_directory(folder):
        start = time.perf_counter()
        summary = run_experiment(cfg, quiet=True)
        wall = time.perf_counter() - start
        ray.shutdown()
    return summary, wall


def phases_line(summary) -> str:
    """Where the search's time went, phase by phase: ``prepare 3.1 s, open_records ...``."""
    return ", ".join(f"{name} {seconds:.1f} s" for name, seconds in summary.phase_s.items())
