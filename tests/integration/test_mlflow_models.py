"""From a search to a served model, for real: the registry (versions, the champion alias, its
tags), dataset inputs and system metrics on the runs, ``mlflow.pyfunc.load_model`` and
``mlflow models serve`` (a served process on a free loopback port, an HTTP request) giving
exactly what ``raypeft predict`` prints, for an encoder (the shared tiny DePT search) and a
seq2seq model (a tiny-t5 search of its own, run twice: a repeat adds a version, and the alias
moves only when the new best is better).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml
from helpers import RAYPEFT, cli_env, run_cli
from mlflow.tracking import MlflowClient

from raypeft.tracking.runs import parent_runs, trial_runs

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("shared_ray")]

SERVE_TIMEOUT_S = 180
TEXTS = [
    "what a great day",
    "this is the worst service ever",
    "meh",
    "I can't believe it's already Monday again...",
    "love love love this song ❤️",
    "the café was closed, so sad",
    "ok",
    "best. concert. ever!!!",
    "traffic again, late for work",
    "not bad at all",
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def model_env(tracking_uri: str) -> dict[str, str]:
    """The CLI environment, with the store and the venv's scripts (uvicorn) on PATH."""
    env = cli_env()
    env["MLFLOW_TRACKING_URI"] = tracking_uri
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "false"
    return env


def predict_cli(model_uri: str, tracking_uri: str, cwd: Path) -> list[dict]:
    """``raypeft predict --model URI`` on TEXTS, as jsonl records."""
    path = cwd / "texts.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    proc = run_cli(
        ["predict", "--model", model_uri, "--tracking-uri", tracking_uri, "--input", str(path),
         "--output-format", "jsonl", "--batch-size", "4"],
        cwd=cwd,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


PYFUNC_SCRIPT = """
import json, sys
import mlflow, pandas as pd
model = mlflow.pyfunc.load_model(sys.argv[1])
out = model.predict(pd.DataFrame({"text": json.loads(sys.argv[2])}), params={"batch_size": 4})
print(json.dumps(out.to_dict(orient="records")))
"""


def pyfunc_predictions(model_uri: str, tracking_uri: str, cwd: Path) -> list[dict]:
    """``mlflow.pyfunc.load_model(URI).predict(df)`` in a fresh process (as a user runs it)."""
    proc = subprocess.run(
        [sys.executable, "-c", PYFUNC_SCRIPT, model_uri, json.dumps(TEXTS)],
        cwd=cwd,
        env=model_env(tracking_uri),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@contextmanager
def served(model_uri: str, tracking_uri: str, cwd: Path, through_raypeft: str | None = None):
    """``mlflow models serve -m URI --env-manager local`` on a free loopback port; its base
    URL once it answers /ping; its process group stopped after. ``through_raypeft``: an
    experiment name, served instead by ``raypeft serve --experiment NAME``, which checks the
    model's files and then becomes ``mlflow models serve`` itself (on a plain PATH)."""
    port = free_port()
    log = cwd / f"serve-{port}.log"
    if through_raypeft is None:
        command = [str(Path(sys.executable).with_name("mlflow")), "models", "serve"]
        command += ["-m", model_uri, "--env-manager", "local", "-h", "127.0.0.1", "-p", str(port)]
        env = model_env(tracking_uri)
    else:
        command = [RAYPEFT, "serve", "--experiment", through_raypeft, "--port", str(port)]
        env = {**cli_env(), "MLFLOW_TRACKING_URI": tracking_uri}
    with log.open("w") as out:
        proc = subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVE_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"{command[:2]} exited ({proc.returncode}):\n{log.read_text()}")
            try:
                with urllib.request.urlopen(f"{base}/ping", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"{command[:2]} did not answer:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield base
    finally:
        stop_group(proc)
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0, "the model server still listens"


def stop_group(proc: subprocess.Popen, grace_s: float = 30) -> None:
    """SIGTERM the server's process group (the CLI and its uvicorn workers), wait until every
    member is gone, SIGKILL what is left after ``grace_s``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            proc.poll()  # reap the leader
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                proc.wait()
                return
            time.sleep(0.2)
    proc.wait()


def invocations(base: str, body: dict) -> list[dict]:
    request = urllib.request.Request(
        f"{base}/invocations",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.load(response)["predictions"]


def check_equal_to_cli(cli: list[dict], rows: list[dict], head: bool) -> None:
    """Served or pyfunc rows say exactly what ``raypeft predict`` printed: one schema (the
    CLI's rows are the served ones with the input text first), the same values bit for bit."""
    assert [r["text"] for r in cli] == TEXTS
    assert [{k: v for k, v in r.items() if k != "text"} for r in cli] == rows
    if head:  # the predicted class's probability, among every class's
        for row in rows:
            assert set(row) == {"label", "label_id", "score", "probabilities"}
            assert row["probabilities"][row["label"]] == row["score"]
            assert row["score"] == max(row["probabilities"].values())
    else:  # seq2seq: generated text, no probability
        assert all(set(r) == {"label", "label_id"} for r in rows)


# ----------------------------------------------------------------------------- the encoder


def test_search_leaves_registry_lineage_and_system_metrics(finished_search):
    client = finished_search.client()
    exp = client.get_experiment_by_name(finished_search.experiment)
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    view = json.loads(exp.tags["mlflow.sharedViewState.raypeft"])
    assert "metrics.`best_val_accuracy`" in view["selectedColumns"]
    (parent,) = parent_runs(client, exp.experiment_id)
    trials = trial_runs(client, exp.experiment_id, parent.info.run_id)
    best_id = parent.data.tags["raypeft.best_run_id"]

    # the registry: version 1 of the experiment's name, the champion, its tags
    (registered,) = client.search_registered_models(f"name = '{finished_search.experiment}'")
    assert {k: str(v) for k, v in registered.aliases.items()} == {"champion": "1"}
    version = client.get_model_version_by_alias(finished_search.experiment, "champion")
    best = client.get_run(best_id)
    assert version.run_id == best_id
    tags = version.tags
    assert tags["raypeft.search_run_id"] == parent.info.run_id
    assert (tags["raypeft.metric"], tags["raypeft.mode"]) == ("accuracy", "max")
    assert tags["raypeft.method"] == "dept" and tags["raypeft.backbone"] == "tiny-bert"
    assert float(tags["raypeft.metric_value"]) == best.data.metrics["best_val_accuracy"]
    assert int(tags["raypeft.trainable_params"]) == best.data.metrics["trainable_params"]
    assert float(tags["raypeft.test_metric_value"]) == parent.data.metrics["test_accuracy"]
    assert parent.data.tags["raypeft.registered_model"] == f"{finished_search.experiment}/1"
    assert f"Registered model '{finished_search.experiment}' version 1" in finished_search.stdout
    assert "alias 'champion' -> version 1 (the first champion)" in finished_search.stdout

    # the chosen trial's python_function model (only that one: log_models defaults to best)
    model = client.get_logged_model(parent.data.tags["raypeft.best_model_id"])
    assert model.source_run_id == best_id and str(model.status) == "READY"
    assert version.source == model.artifact_location  # the version copies nothing
    assert model.params["method.name"] == "dept"  # the trial's params travel with it
    assert {m.key for m in model.metrics} >= {"val_accuracy", "best_val_accuracy"}
    models = client.search_logged_models([exp.experiment_id])
    assert [m.model_id for m in models] == [model.model_id]

    # dataset inputs (no data copied) on the parent and every trial
    names = {"tweet_sentiment-train", "tweet_sentiment-validation", "tweet_sentiment-test"}
    for run in [parent, *trials]:
        inputs = client.get_run(run.info.run_id).inputs.dataset_inputs
        assert {i.dataset.name for i in inputs} == names, run.info.run_name
        contexts = {i.dataset.name: [t.value for t in i.tags] for i in inputs}
        assert contexts["tweet_sentiment-train"] == ["training"]
        assert contexts["tweet_sentiment-test"] == ["test"]
        profile = json.loads(next(i for i in inputs if "-test" in i.dataset.name).dataset.profile)
        assert profile["num_rows"] == 48

    # system metrics on every trial run, at the steps the trial reported
    for trial in trials:
        metrics = trial.data.metrics
        for key in ("cpu_utilization_percentage", "system_memory_usage_megabytes"):
            assert f"system/{key}" in metrics, trial.info.run_name
        assert 0 <= metrics["system/cpu_utilization_percentage"] <= 100
        steps = [m.step for m in client.get_metric_history(trial.info.run_id, "train_loss")]
        history = client.get_metric_history(trial.info.run_id, "system/cpu_utilization_percentage")
        assert sorted(m.step for m in history) == sorted(steps)
    assert not any(k.startswith("system/") for k in parent.data.metrics)


def test_champion_loads_and_serves_what_raypeft_predict_prints(finished_search, tmp_path):
    uri, name = finished_search.tracking_uri, finished_search.experiment
    champion = f"models:/{name}@champion"
    cli = predict_cli(champion, uri, tmp_path)
    # the same model as the experiment's best trial, and label names, not ids
    by_experiment = run_cli(
        ["predict", "--experiment", name, "--tracking-uri", uri, "--batch-size", "4"],
        cwd=tmp_path,
        stdin="\n".join(TEXTS) + "\n",
    )
    assert by_experiment.returncode == 0, by_experiment.stderr[-3000:]
    assert [line.split("\t")[0] for line in by_experiment.stdout.splitlines()] == [
        r["label"] for r in cli
    ]
    assert {r["label"] for r in cli} <= {"negative", "neutral", "positive"}

    check_equal_to_cli(cli, pyfunc_predictions(champion, uri, tmp_path), head=True)
    # `raypeft serve --experiment` (files checked first) serves the same model as MLflow would
    with served(champion, uri, tmp_path, through_raypeft=name) as base:
        rows = invocations(
            base,
            {"dataframe_records": [{"text": t} for t in TEXTS], "params": {"batch_size": 4}},
        )
        check_equal_to_cli(cli, rows, head=True)
        # the other input formats of the scoring server give the same
        split = invocations(
            base, {"dataframe_split": {"columns": ["text"], "data": [[t] for t in TEXTS]}}
        )
        assert [r["label"] for r in split] == [r["label"] for r in rows]
        # a wrong column is the server's one-line schema error, not a crash
        request = urllib.request.Request(
            f"{base}/invocations",
            data=json.dumps({"dataframe_records": [{"txt": "x"}]}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(request, timeout=60)
        assert err.value.code == 400 and "missing inputs ['text']" in err.value.read().decode()


# ----------------------------------------------------------------------------- seq2seq


def t5_experiment(tmp_path: Path) -> Path:
    """A 2-trial DePT search on the tiny T5: every trial logged as a pyfunc model."""
    cfg = {
        "name": "tiny-t5-search",
        "model": {"name": "tiny-t5", "max_length": 16},
        "task": {
            "name": "tweet_sentiment",
            "max_train_examples": 64,
            "max_eval_examples": 24,
            "max_test_examples": 24,
        },
        "method": {"name": "dept", "budget_prompt_length": 8, "prompt_length": 4},
        "train": {"max_steps": 6, "eval_every": 3, "batch_size": 8},
        "space": {"method.lr_prompt": {"grid": [0.3, 0.5]}},
        "search": {"num_samples": 2, "scheduler": {"type": "none"}},
        "tracking": {"register_model": "t5-sentiment", "log_models": "all"},
        "run": {"storage_path": str(tmp_path / "ray_results")},
    }
    path = tmp_path / "t5.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_seq2seq_search_registers_serves_and_keeps_the_better_champion(tmp_path):
    space = t5_experiment(tmp_path)
    first = run_cli(["tune", "--space", str(space), "--quiet"], cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("tiny-t5-search")
    (parent,) = parent_runs(client, exp.experiment_id)
    trials = trial_runs(client, exp.experiment_id, parent.info.run_id)
    # log_models: all: every trial run holds a pyfunc model; the best one is registered
    models = client.search_logged_models([exp.experiment_id])
    assert sorted(m.source_run_id for m in models) == sorted(t.info.run_id for t in trials)
    assert parent.data.tags["raypeft.best_model_id"] in {m.model_id for m in models}
    assert str(client.get_model_version_by_alias("t5-sentiment", "champion").version) == "1"

    champion = "models:/t5-sentiment@champion"
    cli = predict_cli(champion, uri, tmp_path)
    assert {r["label"] for r in cli} <= {"negative", "neutral", "positive", "<unmatched>"}
    check_equal_to_cli(cli, pyfunc_predictions(champion, uri, tmp_path), head=False)
    with served(champion, uri, tmp_path) as base:
        rows = invocations(base, {"inputs": {"text": TEXTS}, "params": {"batch_size": 4}})
        check_equal_to_cli(cli, rows, head=False)
        assert all(isinstance(r["label_id"], int) for r in rows)

    # the same search again: a new version; the alias moves only if it is better
    second = run_cli(["tune", "--space", str(space), "--quiet"], cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    v1 = client.get_model_version("t5-sentiment", "1")
    v2 = client.get_model_version("t5-sentiment", "2")
    better = float(v2.tags["raypeft.metric_value"]) > float(v1.tags["raypeft.metric_value"])
    champion_now = str(client.get_model_version_by_alias("t5-sentiment", "champion").version)
    assert champion_now == ("2" if better else "1")
    assert ("-> version 2" if better else "stays on version 1") in second.stdout
    assert v2.tags["raypeft.search_run_id"] != v1.tags["raypeft.search_run_id"]

    # export reads the registered model too (DePT has no peft form: refused as such)
    proc = run_cli(
        ["export", "--model", champion, "--format", "peft", "--out", str(tmp_path / "a"),
         "--tracking-uri", uri],
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: method 'dept' has no peft equivalent")
    # and unknown aliases are one line
    proc = run_cli(
        ["predict", "--model", "models:/t5-sentiment@prod", "--tracking-uri", uri],
        cwd=tmp_path,
        stdin="x\n",
    )
    assert proc.returncode == 2 and "not in the model registry" in proc.stderr

    # the champion's model folder swapped whole for another trial's, its digests.json
    # included: checked against what the source run recorded, every command refuses it
    run_id = swap_in_another_trials_model(client, "t5-sentiment", "champion")
    expected = (
        f"model {champion} (logged from run {run_id}): "
        f"artifacts/raypeft_model/trainable.safetensors: damaged or replaced",
        f"run {run_id} recorded when it trained",
    )
    out = tmp_path / "swapped"
    for args in (
        ["predict", "--model", champion, "--input", "-"],
        ["serve", "--model", champion, "--port", str(free_port())],
        ["export", "--model", champion, "--format", "peft", "--out", str(out)],
    ):
        proc = run_cli([*args, "--tracking-uri", uri], cwd=tmp_path, stdin="good\n")
        assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
        (line,) = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        assert line.startswith("error: ") and all(text in line for text in expected), line
    assert not out.exists()


def swap_in_another_trials_model(client: MlflowClient, name: str, alias: str) -> str:
    """Replace the files of the model version ``name@alias`` names with those of a logged
    model of another trial that trained other tensors (``digests.json`` included, so the
    folder agrees with itself); returns the version's source run."""
    version = client.get_model_version_by_alias(name, alias)
    digest_tag = "raypeft.sha256.trainable.safetensors"
    mine = client.get_run(version.run_id).data.tags[digest_tag]
    experiment_id = client.get_run(version.run_id).info.experiment_id
    other = next(
        m
        for m in client.search_logged_models([experiment_id])
        if client.get_run(m.source_run_id).data.tags[digest_tag] != mine
    )

    def folder(location: str) -> Path:
        return Path(location.removeprefix("file://")) / "artifacts" / "raypeft_model"

    target = folder(client.get_model_version_download_uri(name, version.version))
    assert (target / "digests.json").is_file()
    shutil.rmtree(target)
    shutil.copytree(folder(other.artifact_location), target)
    return version.run_id
