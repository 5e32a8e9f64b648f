"""A search on the production stores of a cluster, every one a real server on loopback:
MLflow's backend store and the Optuna study in PostgreSQL (psycopg 3), ``run.storage_path``
and MLflow's artefacts in an S3 API (moto's server) reached through the same ``AWS_*``
variables as AWS itself (tests/servers.py starts them).

The search records through an ``mlflow server`` on PostgreSQL with its artefacts in S3 (the
head's server of docs/cluster.md), and a second one writes to the database directly with
``tracking.artifact_location`` in S3. Each is read back from the stores themselves: SQL on
MLflow's and Optuna's tables, the bucket's object list. Nothing may land in the working
folder. Then ``raypeft report`` and ``raypeft predict`` read them as a user would. While the
servers and each command run, no process's command line holds the database's password (any
local user reads them in /proc): the URLs that hold it go through the environment.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import optuna
import psutil
import psycopg
import pytest
import yaml
from optuna.trial import TrialState

from tests.helpers import RAYPEFT, TINY_SEARCH_BASE, cli_env
from tests.servers import S3, Postgres, mlflow_server, postgres_server, s3_server

pytestmark = pytest.mark.integration

BUCKET = "raypeft-results"
LR_PROMPTS = [0.3, 0.5]  # two grid points: two trials


@dataclass
class Stores:
    postgres: Postgres
    s3: S3
    tracking_uri: str  # the MLflow server on PostgreSQL, artefacts in s3://BUCKET/mlflow
    mlflow_db: str  # its database, as psycopg connects to it
    optuna_url: str

    def env(self) -> dict[str, str]:
        """The CLI's environment: offline, and the S3 API as the AWS endpoint."""
        return dict(cli_env(), **self.s3.env)

    def sql(self, query: str, *args) -> list[tuple]:
        with psycopg.connect(self.mlflow_db) as conn:
            return conn.execute(query, args).fetchall()


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """PostgreSQL (databases mlflow and optuna), the S3 API (one bucket) and an MLflow server
    on them, for the module's searches."""
    work = tmp_path_factory.mktemp("servers")
    with postgres_server(work) as postgres, s3_server(work) as s3:
        mlflow_url = postgres.create_database("mlflow")
        optuna_url = postgres.create_database("optuna")
        s3.create_bucket(BUCKET)
        with mlflow_server(work, mlflow_url, f"s3://{BUCKET}/mlflow", env=s3.env) as server:
            yield Stores(postgres, s3, server.url, postgres.conninfo("mlflow"), optuna_url)


def _experiment(folder: Path, name: str, **sections) -> Path:
    folder.mkdir()
    cfg = {
        "name": name,
        **TINY_SEARCH_BASE,
        "space": {"method.lr_prompt": {"grid": LR_PROMPTS}},
        "search": {"num_samples": len(LR_PROMPTS), "scheduler": {"type": "none"}},
        "run": {"storage_path": f"s3://{BUCKET}/ray_results"},
        **sections,
    }
    path = folder / "experiment.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _raypeft(
    stores: Stores, args: list[str], cwd: Path, stdin: str = "", env: dict | None = None
) -> subprocess.CompletedProcess:
    """``raypeft ARGS`` to success, every process's command line read twice a second while it
    runs (its Ray workers and the servers too): none may hold the database's password."""
    out, err = cwd.parent / f"{cwd.name}.out", cwd.parent / f"{cwd.name}.err"
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen(
            [RAYPEFT, *args],
            cwd=cwd,
            env={**stores.env(), **(env or {})},
            stdin=subprocess.PIPE,
            stdout=stdout,
            stderr=stderr,
            text=True,
        )
        proc.stdin.write(stdin)
        proc.stdin.close()
        seen, leaks = _watch_command_lines(proc, stores.postgres.password)
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out.read_text(), err.read_text())
    assert leaks == [], "the database's password on a command line: " + "; ".join(leaks)
    assert proc.pid in seen  # the watch saw the command itself while it ran
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _watch_command_lines(proc: subprocess.Popen, secret: str) -> tuple[set[int], list[str]]:
    """Until ``proc`` ends (600 s at most): the pids whose command line was read, and each
    one that held ``secret`` (shown without it)."""
    seen, leaks = set(), {}
    deadline = time.monotonic() + 600
    while proc.poll() is None:
        assert time.monotonic() < deadline, f"{proc.args[:3]} still running after 600 s"
        for other in psutil.process_iter(["cmdline"]):
            line = " ".join(other.info["cmdline"] or [])
            seen.add(other.pid)
            if secret in line:
                leaks[other.pid] = f"pid {other.pid}: {line.replace(secret, '***')[:300]}"
        time.sleep(0.5)
    return seen, list(leaks.values())


def test_the_servers_listen_on_loopback_only_and_stop_by_pid(tmp_path):
    with postgres_server(tmp_path / "pg") as postgres, s3_server(tmp_path / "s3") as s3:
        for pid, port in ((postgres.pid, postgres.port), (s3.pid, int(s3.endpoint[-5:]))):
            listening = {
                (c.laddr.ip, c.laddr.port)
                for c in psutil.Process(pid).net_connections("inet")
                if c.status == psutil.CONN_LISTEN
            }
            assert listening == {("127.0.0.1", port)}
        assert postgres.start_s < 30 and s3.start_s < 30  # seconds, measured ~1 s each
    assert not psutil.pid_exists(postgres.pid) and not psutil.pid_exists(s3.pid)


def test_a_search_records_only_into_postgres_and_s3_and_reads_back(stores, tmp_path):
    work = tmp_path / "work"
    path = _experiment(work, "prod-server")
    args = ["tune", "--space", str(path), "--quiet", "--tracking-uri", stores.tracking_uri]
    # the study's URL holds the password: the environment, not --set search.storage=...
    tuned = _raypeft(stores, args, work, env={"RAYPEFT_SEARCH_STORAGE": stores.optuna_url})
    assert f"Ray results: s3://{BUCKET}/ray_results/prod-server-" in tuned.stdout
    assert stores.postgres.password not in tuned.stdout + tuned.stderr
    assert sorted(p.name for p in work.iterdir()) == ["experiment.yaml"]  # nothing local

    trials = _trial_runs_in_postgres(stores, "prod-server")
    _study_is_complete_in_postgres(stores, "prod-server", trials)
    _checkpoints_and_model_in_the_bucket(stores, "prod-server", trials)

    # a user's commands, in another folder, reading through the same server
    reader = tmp_path / "reader"
    reader.mkdir()
    report = _raypeft(
        stores, ["report", "prod-server", "--tracking-uri", stores.tracking_uri], reader
    )
    assert (reader / "reports" / "prod-server" / "trials.csv").is_file(), report.stdout
    predict = ["predict", "--model", "models:/prod-server@champion", "--tracking-uri"]
    predicted = _raypeft(stores, [*predict, stores.tracking_uri], reader, "what a great day\n")
    label, score, text = predicted.stdout.splitlines()[0].split("\t")
    assert text == "what a great day" and 0 <= float(score) <= 1 and label


def _trial_runs_in_postgres(stores: Stores, experiment: str) -> dict[str, str]:
    """The search's trial runs, read from MLflow's tables: finished, with the sampled
    parameter and every evaluation's metric. Returns run id -> lr_prompt."""
    (parent,) = stores.sql(
        "SELECT r.run_uuid FROM runs r JOIN experiments e USING (experiment_id) "
        "JOIN tags t ON t.run_uuid = r.run_uuid WHERE e.name = %s "
        "AND t.key = 'raypeft.role' AND t.value = 'experiment'",
        experiment,
    )
    kids = stores.sql(
        "SELECT r.run_uuid, r.status, p.value FROM runs r "
        "JOIN tags t ON t.run_uuid = r.run_uuid AND t.key = 'mlflow.parentRunId' "
        "JOIN params p ON p.run_uuid = r.run_uuid AND p.key = 'method.lr_prompt' "
        "WHERE t.value = %s",
        parent[0],
    )
    assert sorted(float(lr) for _, _, lr in kids) == LR_PROMPTS
    assert {status for _, status, _ in kids} == {"FINISHED"}
    for run_id, _, _ in kids:
        steps = stores.sql(
            "SELECT step FROM metrics WHERE run_uuid = %s AND key = 'val_accuracy' ORDER BY step",
            run_id,
        )
        assert [s for (s,) in steps] == [4, 8, 12]
    return {run_id: lr for run_id, _, lr in kids}


def _study_is_complete_in_postgres(stores: Stores, name: str, trials: dict[str, str]) -> None:
    study = optuna.load_study(study_name=name, storage=stores.optuna_url)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * len(LR_PROMPTS)
    assert all(0 <= t.value <= 1 for t in study.trials)
    assert sorted(t.params["method.lr_prompt"] for t in study.trials) == LR_PROMPTS


def _checkpoints_and_model_in_the_bucket(
    stores: Stores, experiment: str, trials: dict[str, str]
) -> None:
    """Each trial's checkpoint under run.storage_path, and the champion's model files under
    the MLflow server's artefact destination, are objects in the bucket."""
    keys = stores.s3.keys(BUCKET)
    checkpoints = {k.split("/")[2] for k in keys if "/checkpoint_" in k and k.endswith(".yaml")}
    assert len(checkpoints) == len(trials), sorted(keys)[:40]
    ((source,),) = stores.sql(
        "SELECT v.source FROM model_versions v JOIN registered_model_aliases a "
        "ON a.name = v.name AND a.version = v.version WHERE a.name = %s AND a.alias = 'champion'",
        experiment,
    )
    # the server keeps mlflow-artifacts:/<path> at s3://BUCKET/mlflow/<path>
    prefix = "mlflow/" + source.removeprefix("mlflow-artifacts:/")
    model_files = {k.rsplit("/", 1)[-1] for k in stores.s3.keys(BUCKET, prefix)}
    assert {"MLmodel", "trainable.safetensors", "config.yaml"} <= model_files, source


def test_a_search_on_the_database_directly_keeps_its_artefacts_in_s3(stores, tmp_path):
    """tracking.uri is the database itself (plain postgresql://, psycopg as its driver), and
    tracking.artifact_location puts the artefacts in the bucket, not in ./mlruns."""
    work = tmp_path / "work"
    url = stores.postgres.url("mlflow").replace("postgresql+psycopg://", "postgresql://")
    location = f"s3://{BUCKET}/direct"
    path = _experiment(
        work,
        "prod-direct",
        tracking={"uri": url, "artifact_location": location},
        search={"num_samples": 1, "scheduler": {"type": "none"}, "storage": stores.optuna_url},
    )
    tuned = _raypeft(stores, ["tune", "--space", str(path)], work)  # not quiet: its warnings
    assert "warning" not in tuned.stdout  # artefacts not on one machine's disk
    assert sorted(p.name for p in work.iterdir()) == ["experiment.yaml"]
    ((stored,),) = stores.sql(
        "SELECT artifact_location FROM experiments WHERE name = 'prod-direct'"
    )
    assert stored == location
    assert any(k.endswith("/MLmodel") for k in stores.s3.keys(BUCKET, "direct/"))
    reader = tmp_path / "reader"
    reader.mkdir()
    # the store's URL holds the password: MLFLOW_TRACKING_URI, not --tracking-uri
    predict = ["predict", "--model", "models:/prod-direct@champion"]
    env = {"MLFLOW_TRACKING_URI": url}
    predicted = _raypeft(stores, predict, reader, "what a great day\n", env)
    assert predicted.stdout.splitlines()[0].endswith("\twhat a great day")
    assert list(reader.iterdir()) == []
