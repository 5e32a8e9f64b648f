"""Fixtures of the unit tests that replay searches. Imports are inside them: this file is
loaded by every unit test's collection, and the replay pulls in Ray Tune and Optuna."""

from __future__ import annotations

import dataclasses

import pytest

LR_PROMPT, LR_LOWRANK, LENGTHS = [0.3, 0.4, 0.5], [1e-4, 5e-4, 1e-3, 5e-3], [20, 40, 60, 80]
STEPS = [40, 80, 120, 160]  # the shipped dept.yaml's evaluations


def curve(a1: float, a2: float, m: int, seed: int):
    """A synthetic curve: best near α1 0.4, α2 1e-3, m 40; seeds shift it slightly."""
    from raypeft.search.simulate.table import Curve

    top = 0.8 - abs(a1 - 0.4) - 10 * abs(a2 - 1e-3) - 0.001 * abs(m - 40) + 0.003 * seed
    accuracy = [0.4 + (top - 0.4) * s / 160 for s in STEPS]
    return Curve(
        params={"method.lr_prompt": a1, "method.lr_lowrank": a2, "method.prompt_length": m},
        seed=seed,
        steps=list(STEPS),
        values={"val_accuracy": accuracy, "val_loss": [1.2 - a for a in accuracy]},
        wall_s=[s * 0.5 for s in STEPS],
    )


@pytest.fixture
def dept_table_file(tmp_path):
    """A synthetic learning-curve table over the shipped DePT search's space (its 48
    configurations, seeds 0 and 1, the shipped evaluations), saved as ``raypeft table`` saves
    one; recorded two at a time."""
    from benchmarks.search import replays
    from raypeft.config.loading import validate_experiment
    from raypeft.methods import BackboneDims
    from raypeft.search.simulate import CurveTable

    space = {
        "method.lr_prompt": {"grid": LR_PROMPT},
        "method.lr_lowrank": {"grid": LR_LOWRANK},
        "method.prompt_length": {"grid": LENGTHS},
    }
    recorded = replays.search_with({}).model_dump(mode="json")
    recorded |= {"space": space, "search": {"sampler": "grid", "seeds": [0, 1], "num_samples": 96}}
    cfg = validate_experiment(recorded, "recorded.yaml")
    table = CurveTable(
        experiment=cfg.model_dump(mode="json"),
        metric="accuracy",
        mode="max",
        dims=dataclasses.asdict(BackboneDims(384, 6, 30522, 64)),
        curves=[
            curve(a1, a2, m, s)
            for a1 in LR_PROMPT
            for a2 in LR_LOWRANK
            for m in LENGTHS
            for s in (0, 1)
        ],  # fmt: skip
        source={"experiment": "synthetic", "concurrency": 2},
    )
    path = tmp_path / "table.json"
    table.save(path)
    return path


@pytest.fixture
def local_ray():
    """A local Ray for this test (two CPUs, no dashboard), unless the process has one."""
    import ray  # why: only the tests that ask for it start Ray

    started = not ray.is_initialized()
    if started:
        ray.init(
            address="local",
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            logging_level="ERROR",
        )
    yield
    if started:
        ray.shutdown()
