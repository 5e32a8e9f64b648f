"""Bad input: the experiment file itself, and command lines.

Each case runs ``raypeft tune`` and then ``raypeft validate`` (conftest.py): exit code 2,
exactly one line ``error: ...`` naming the key or file and what must hold, the same line from
both, nothing created in the working directory, and Ray, MLflow and Optuna never reached.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from .helpers import BASE, Case, exp, ids, run_in_process


def _unreadable_experiment(tmp: Path) -> None:
    path = tmp / "exp.yaml"
    path.write_text(yaml.safe_dump(BASE))
    path.chmod(0)


def _binary_experiment(tmp: Path) -> None:
    (tmp / "exp.yaml").write_bytes(b"\xff\xfe\x00name: x\n")


CASES: list[Case] = [
    # ---- the experiment file itself
    Case("missing-experiment-file", None, ("nope.yaml", "file not found"), file="nope.yaml"),
    Case(
        "unreadable-experiment-file",
        _unreadable_experiment,
        ("exp.yaml", "cannot read", "must be readable"),
        needs_non_root=True,
    ),
    Case("experiment-file-not-utf8", _binary_experiment, ("exp.yaml", "not UTF-8", "must be")),
    Case("not-yaml", "model: [unclosed\nname: x\n", ("exp.yaml", "not valid YAML", "line")),
    Case(
        "duplicate-key",
        "train: {max_steps: 20}\ntrain: {max_steps: 30}\nmethod: {name: pt}\n",
        ("exp.yaml", "line 2", "duplicate key 'train'", "must appear once"),
    ),
    Case(
        "yaml-list-at-top-level", "- model\n- task\n", ("exp.yaml", "top level must be a mapping")
    ),
    Case(
        "experiment-file-is-a-folder",
        None,
        ("'--space'", "is a directory"),
        file=".",
        tune_only=True,
    ),
    # ---- command lines
    Case(
        "set-without-equals",
        exp(),
        ("exp.yaml", "--set 'train.max_steps'", "expected key=value"),
        args=("--set", "train.max_steps"),
        in_process=True,
    ),
    Case(
        "set-unknown-key",
        exp(),
        ("train.learning_rate: unknown key",),
        args=("--set", "train.learning_rate=0.1"),
    ),
    Case(
        "set-invalid-value",
        exp(),
        ("search.num_samples", "must be >= 1", "(got 0)"),
        args=("--set", "search.num_samples=0"),
    ),
    Case(
        "set-inside-a-scalar",
        exp(),
        ("train.max_steps.inner", "not a section"),
        args=("--set", "train.max_steps.inner=1"),
    ),
    Case(
        "unknown-command-line-option",
        exp(),
        ("No such option '--spaec'", "tune --help"),
        args=("--spaec", "x.yaml"),
        tune_only=True,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_bad_input_is_one_line_exit_2_and_touches_nothing(case, run_case):
    run_case(case)


IN_PROCESS = [c for c in CASES if c.in_process]


@pytest.mark.parametrize("case", IN_PROCESS, ids=ids(IN_PROCESS))
@pytest.mark.slow
def test_bad_input_in_a_real_process(case, tmp_path):
    run_in_process(case, tmp_path)
