"""Bad input: the model, and every method setting the space can produce on it.

Each case runs ``raypeft tune`` and then ``raypeft validate`` (conftest.py): exit code 2,
exactly one line ``error: ...`` naming the key or file and what must hold, the same line from
both, nothing created in the working directory, and Ray, MLflow and Optuna never reached.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .helpers import Case, exp, ids


def _model_file(tmp: Path) -> dict:
    (tmp / "model").mkdir()
    (tmp / "model" / "weights.bin").write_bytes(b"\0")
    return exp(model={"name": "./model", "max_length": 16})


CASES: list[Case] = [
    # ---- the model
    Case(
        "unknown-model-path",
        exp(model={"name": "./models/nope", "max_length": 16}),
        ("model.name", "./models/nope", "no such folder", "must be a local model folder"),
    ),
    Case(
        "model-folder-without-config",
        _model_file,
        ("model.name", "./model", "config.json", "must be"),
    ),
    Case(
        "unknown-model-id-offline",  # HF_HUB_OFFLINE=1 (tests/conftest.py): never the Hub
        exp(model={"name": "nobody/no-such-model", "max_length": 16}),
        ("model.name", "'nobody/no-such-model'", "HF_HUB_OFFLINE", "must be"),
    ),
    Case(
        "prompt-and-input-beyond-the-position-embeddings",
        exp(model={"name": "tiny-bert", "max_length": 510}),
        ("method", "`model.max_length + prompt_length <= 512` must hold", "510 + 4 = 514"),
    ),
    Case(
        "mean-head-pooling-on-a-decoder",
        exp(model={"name": "tiny-gpt2", "max_length": 16, "head_pooling": "mean"}),
        ("model.head_pooling", "mean", "tiny-gpt2 is a decoder", "use first or auto"),
    ),
    # ---- impossible budgets and sizes
    Case(
        "dept-m-not-below-l",
        exp(method={"name": "dept", "prompt_length": 10, "budget_prompt_length": 10}),
        ("method", "`prompt_length < budget_prompt_length` must hold"),
    ),
    Case(
        "dept-derived-rank-below-1",  # d=32, s=16: r = (10-9)·32 // 48 = 0
        exp(method={"name": "dept", "prompt_length": 9, "budget_prompt_length": 10}),
        ("method", "`r >= 1` must hold"),
    ),
    Case(
        "dept-rank-below-1-inside-an-int-range",
        exp(
            method={"name": "dept", "prompt_length": 2, "budget_prompt_length": 10},
            space={"method.prompt_length": {"int": [2, 9]}},
        ),
        ("method.prompt_length=9", "`r >= 1` must hold"),
    ),
    Case(
        "idpg-phm-n-not-dividing",
        exp(method={"name": "idpg", "generator": "phm", "phm_n": 5, "generator_hidden": 10}),
        ("method", "`phm_n` must divide", "phm_n=5"),
    ),
    Case(
        "idpg-phm-n-from-the-space",
        exp(
            method={"name": "idpg", "generator": "phm", "phm_n": 4, "generator_hidden": 8},
            space={"method.phm_n": {"choice": [4, 6]}},
        ),
        ("method.phm_n=6", "`phm_n` must divide"),
    ),
    Case(
        "budget-too-small",
        exp(budget_params=10, method={"name": "idpg", "generator": "dnn"}),
        ("budget_params >=", "must hold"),
    ),
    # ---- what a method reads before trials start
    Case(
        "ipt-corpus-missing",
        exp(method={"name": "ipt", "strategy": "pretrained", "corpus": "no_corpus"}),
        ("method.corpus", "no_corpus", "no such file or folder"),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_bad_input_is_one_line_exit_2_and_touches_nothing(case, run_case):
    run_case(case)
