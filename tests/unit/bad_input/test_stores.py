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
    Case(
        "tracking-database-does-not-answer-password-redacted",
        exp(tracking={"uri": "postgresql://me:s3cr3t-pw@127.0.0.1:1/mlflow"}),
        ("tracking.uri", "me:***@127.0.0.1", "does not answer", "Connection refused"),
    ),
    Case(
        "optuna-database-does-not-answer",
        exp(search={"num_samples": 2, "storage": "postgresql+psycopg://me@127.0.0.1:1/optuna"}),
        ("search.storage", "does not answer", "Connection refused"),
    ),
    Case(
        "tracking-artifact-location-relative",
        exp(tracking={"artifact_location": "mlruns"}),
        ("tracking.artifact_location", "absolute folder", "must be"),
    ),
    Case(
        "tracking-artifact-location-unknown-scheme",
        exp(tracking={"artifact_location": "ftp://host/mlflow"}),
        ("tracking.artifact_location", "must be a URI of an artifact store", "s3"),
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
