"""Bad input: the MLflow tracking store, Optuna's storage and Ray Tune's storage path.

Each case runs ``raypeft tune`` and then ``raypeft validate`` (conftest.py): exit code 2,
exactly one line ``error: ...`` naming the key or file and what must hold, the same line from
both, nothing created in the working directory, and Ray, MLflow and Optuna never reached.
An object store is real: a closed port of loopback (nothing answers), moto's S3 server.
"""

from __future__ import annotations

import socket

import optuna
import pytest
import yaml
from click.testing import CliRunner

from raypeft.cli.main import main
from tests.servers import s3_env, s3_server

from .helpers import Case, check_result, exp, ids, listing, run_in_process

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
    Case(
        "storage-path-scheme-pyarrow-cannot-open",
        exp(run={"storage_path": "ftp://host/x"}),
        ("run.storage_path", "'ftp://host/x'", "no filesystem for 'ftp'", "must be"),
    ),
    Case(
        "storage-path-s3-without-a-bucket",
        exp(run={"storage_path": "s3:///ray_results"}),
        ("run.storage_path", "must name a bucket"),
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


# ----------------------------------------------------------------------------- object stores

S3_REFUSES = Case(
    "storage-path-object-store-refuses-connections",
    exp(run={"storage_path": "s3://a-bucket/x"}),
    (
        "run.storage_path",
        "'s3://a-bucket/x'",
        "does not answer",
        "Could not connect",
        "must answer",
    ),
    in_process=True,
)


@pytest.fixture
def closed_endpoint(monkeypatch) -> str:
    """AWS clients pointed (``AWS_ENDPOINT_URL``) at a loopback port nobody listens on: bound,
    its number taken, closed."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{sock.getsockname()[1]}"
    for key, value in s3_env(endpoint, "us-east-1").items():
        monkeypatch.setenv(key, value)
    return endpoint


def test_an_object_store_that_refuses_connections_is_one_line(closed_endpoint, run_case):
    line = run_case(S3_REFUSES)
    assert closed_endpoint.rsplit(":", 1)[1] in line  # the port it tried


@pytest.mark.slow
def test_an_object_store_that_refuses_in_a_real_process(closed_endpoint, tmp_path):
    run_in_process(S3_REFUSES, tmp_path)


@pytest.mark.slow
def test_an_object_store_that_answers_passes_and_a_missing_bucket_is_one_line(
    tmp_path, monkeypatch
):
    """moto's S3 server: a bucket that exists passes (nothing written to it), one that does not
    is one line (Ray Tune writes under a bucket, it does not create one)."""
    monkeypatch.chdir(tmp_path)
    with s3_server(tmp_path / "s3") as s3:
        s3.create_bucket("runs")
        for key, value in s3.env.items():
            monkeypatch.setenv(key, value)
        runner = CliRunner()
        for name, path in (("good.yaml", "s3://runs/search"), ("bad.yaml", "s3://nope/search")):
            (tmp_path / name).write_text(yaml.safe_dump(exp(run={"storage_path": path})))
        good = runner.invoke(main, ["validate", "good.yaml"])
        assert good.exit_code == 0, good.output
        bad = runner.invoke(main, ["validate", "bad.yaml"])
        assert bad.exit_code == 2, bad.output
        (line,) = bad.stderr.splitlines()
        assert "run.storage_path: 's3://nope/search': the bucket 'nope' does not exist" in line
        assert s3.keys("runs") == []


def test_a_study_created_for_other_directions_is_refused_by_validate_as_by_tune(
    tmp_path, monkeypatch
):
    """The search would refuse to continue a study that minimises what it maximises, once
    its stores are open; the preflight reads the existing study (creating nothing) first."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(exp()))
    optuna.create_study(study_name="bad-input", storage="sqlite:///optuna.db")  # minimise
    before = listing(tmp_path)
    case = Case("study-of-other-directions", None, ("search.study_name", "['min']", "['max']"))
    lines = [
        check_result(CliRunner().invoke(main, [command, "exp.yaml"]), case, before, tmp_path, [])
        for command in ("tune", "validate")
    ]
    assert lines[0] == lines[1]
