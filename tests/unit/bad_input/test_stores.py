"""Bad input: the MLflow tracking store and Optuna's storage.

Each case runs ``raypeft tune`` and then ``raypeft validate`` (conftest.py): exit code 2,
exactly one line ``error: ...`` naming the key or file and what must hold, the same line from
both, nothing created in the working directory, and Ray, MLflow and Optuna never reached.
"""

from __future__ import annotations

import pytest

from .helpers import Case, exp, ids

CASES: list[Case] = [
    # ---- stores
    Case(
        "tracking-uri-with-an-unknown-scheme",
        exp(tracking={"uri": "bogus://host/x"}),
        ("tracking.uri", "unknown scheme 'bogus'", "must be an MLflow tracking URI"),
    ),
    Case(
        "tracking-sqlite-in-a-missing-folder",
        exp(tracking={"uri": "sqlite:///no/such/dir/mlflow.db"}),
        ("tracking.uri", "does not exist", "must exist"),
    ),
    Case(
        "tracking-uri-option-with-an-unknown-scheme",
        exp(),
        ("tracking.uri", "unknown scheme 'bogus'"),
        args=("--tracking-uri", "bogus://host"),
        tune_only=True,
    ),
    Case(
        "tracking-uri-is-a-file-store",
        exp(tracking={"uri": "./mlruns"}),
        ("tracking.uri", "file store", "MLFLOW_ALLOW_FILE_STORE", "must be"),
    ),
    Case(
        "optuna-storage-driver-missing-password-redacted",
        exp(
            search={
                "num_samples": 2,
                "storage": "postgresql+nosuchdriver://me:s3cr3t-pw@db.example/optuna",
            }
        ),
        ("search.storage", "me:***@db.example", "driver must be installed"),
    ),
    Case("empty-study-name", exp(search__study_name=""), ("search.study_name", "at least 1")),
    Case(
        "resume-with-no-search-to-resume",
        exp(),
        ("--resume", "no MLflow store here"),
        args=("--resume",),
        tune_only=True,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_bad_input_is_one_line_exit_2_and_touches_nothing(case, run_case):
    run_case(case)
