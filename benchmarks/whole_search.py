"""What the whole-search benchmarks share (precision_search.py, packing_search.py): one search
of an experiment through ``raypeft.search.run.run_experiment``, timed, in a folder of its own;
the machine's load beside each number; their tables in markdown."""

from __future__ import annotations

import os
import time
from pathlib import Path


def experiment_in(space: Path, name: str, overrides: list[str], folder: Path):
    """The experiment file ``space`` with ``overrides`` (as ``raypeft tune --set``), renamed
    ``name``, its MLflow store and Ray results in ``folder``."""
    from raypeft.config.loading import load_experiment

    return load_experiment(
        space,
        [
            *overrides,
            f"name={name}",
            f"tracking.uri=sqlite:///{folder / 'mlflow.db'}",
            f"run.storage_path={folder / 'ray_results'}",
        ],
    )


def timed_search(cfg, folder: Path):
    """Run the search ``cfg`` with ``folder`` as the working directory (MLflow's sqlite store
    puts artifacts in ./mlruns of it) and shut its Ray down; ``(summary, wall seconds)``."""
    import ray

    from raypeft.search.run import run_experiment

    cwd = os.getcwd()
    os.chdir(folder)
    try:
        start = time.perf_counter()
        summary = run_experiment(cfg, quiet=True)
        wall = time.perf_counter() - start
        ray.shutdown()
    finally:
        os.chdir(cwd)
    return summary, wall


def load_note() -> str:
    """The 1-minute load average: how contended the machine was (2 shared cores here)."""
    try:
        return f" (load {os.getloadavg()[0]:.1f})"
    except OSError:
        return ""


def print_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    """A markdown table, its columns padded to line up in a terminal too."""
    widths = [max(len(str(r[i])) for r in (header, *rows)) for i in range(len(header))]
    for row in (header, tuple("-" * w for w in widths), *rows):
        print("| " + " | ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)) + " |")
