"""The tiny search: DePT on the tiny BERT and a few of the packaged tweets, 12 steps evaluated
every 4. The tests' small real searches train it (tests/helpers.py), benchmarks.device's
trial_phases times it, and the scale studies replay it: :func:`replay_table` records a table
of 100 configurations of it (10 x 10 values of two learning rates) whose trials a search then
replays in zero time (``resources.trial_runner: replay``), so only the platform is measured.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

TINY_SEARCH: dict[str, Any] = {  # the space and search are each user's
    "model": {"name": "tiny-bert", "max_length": 16},
    "task": {
        "name": "tweet_sentiment",
        "max_train_examples": 160,
        "max_eval_examples": 48,
        "max_test_examples": 48,
    },
    "method": {"name": "dept", "budget_prompt_length": 10, "prompt_length": 4},
    "train": {"max_steps": 12, "eval_every": 4, "batch_size": 8, "head_lr": 0.01},
}
# The replayed search, as the scale studies recorded it (2026-11): the test split uncut (a
# replayed search scores none, but its driver tokenises it: kept as measured).
REPLAYED: dict[str, Any] = {
    **TINY_SEARCH,
    "task": {k: v for k, v in TINY_SEARCH["task"].items() if k != "max_test_examples"},
}
REPLAY_STEPS = [4, 8, 12]  # three evaluations per trial (train.max_steps 12, eval_every 4)
VALUES = [round(0.1 * i, 1) for i in range(1, 11)]  # ten values per searched key
SEARCHED = ("method.lr_prompt", "method.lr_lowrank")


def replay_space() -> dict[str, dict]:
    """The replayed search's space: ten values of each searched key."""
    return {key: {"choice": VALUES} for key in SEARCHED}


def replay_table(path: Path, experiment: dict[str, Any]) -> None:
    """A table of 100 configurations (10 x 10), one seed each, three evaluations."""
    from raypeft.search.simulate.table import Curve, CurveTable  # why: tests read TINY_SEARCH alone

    curves = [
        Curve(
            {"method.lr_prompt": a, "method.lr_lowrank": b},
            0,
            list(REPLAY_STEPS),
            {"val_loss": [1 - a * b] * 3, "val_accuracy": [a * b / 3, a * b / 2, a * b]},
            [1.0, 2.0, 3.0],
        )  # fmt: skip
        for a in VALUES
        for b in VALUES
    ]
    CurveTable(experiment, "accuracy", "max", {}, curves).save(path)
