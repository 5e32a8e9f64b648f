"""``raypeft report`` on a synthetic MLflow store (temp sqlite) shaped like raypeft's searches.

The store holds one experiment with two searches: an older DePT search (α1 × α2 grid, m
chosen, one trial stopped early, one failed) and a newer multi-method search tagged with two
objectives; and a second experiment with a single scored trial, where most figures must be
skipped with a reason. The real command runs in-process (CliRunner) and writes real files.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from raypeft.cli.main import main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FIGURES = ("lr_heatmap", "budget_m_r", "params_pareto", "learning_curves", "importances")
RANK = {2: 5, 4: 4}  # DePT's derived r per prompt length m at the synthetic budget
PARAMS = {2: 304, 4: 320}  # derived.trainable_params per m


def dept_score(lr_prompt: float, lr_lowrank: float, m: int) -> float:
    """The synthetic search's best validation accuracy: α1 matters most, then α2, then m."""
    return 0.5 + 0.2 * (lr_prompt == 0.5) + 0.1 * (lr_lowrank == 0.01) + 0.05 * (m == 4)


class StoreBuilder:
    def __init__(self, folder: Path):
        self.uri = f"sqlite:///{folder / 'mlflow.db'}"
        self.client = MlflowClient(tracking_uri=self.uri)
        self.artifacts = folder / "artifacts"  # never the default ./mlruns of the cwd

    def experiment(self, name: str) -> str:
        return self.client.create_experiment(name, artifact_location=str(self.artifacts / name))

    def parent(self, exp: str, start: int, tags: dict, params: dict) -> str:
        run = self.client.create_run(
            exp, start_time=start, tags={"raypeft.role": "experiment", **tags}
        )
        self._params(run.info.run_id, params)
        return run.info.run_id

    def trial(
        self,
        exp: str,
        parent: str,
        trial_id: str,
        method: str,
        params: dict,
        score: float | None,
        stopped_early: bool = False,
        samples_per_s: float = 100.0,
    ) -> str:
        run = self.client.create_run(
            exp,
            tags={
                "mlflow.parentRunId": parent,
                "raypeft.role": "trial",
                "raypeft.trial_id": trial_id,
                "raypeft.method": method,
            },
        )
        run_id = run.info.run_id
        self._params(run_id, {"method.name": method, "train.seed": 0, **params})
        if score is None:  # failed before its first evaluation: no metrics
            self.client.set_tag(run_id, "raypeft.error", "NonFiniteLossError: loss is nan")
            self.client.set_terminated(run_id, "FAILED")
            return run_id
        steps = [4] if stopped_early else [4, 8, 12]
        for n, step in enumerate(steps):
            value = score - 0.1 * (len(steps) - 1 - n)
            metrics = {
                "val_accuracy": value,
                "best_val_accuracy": value,
                "val_macro_f1": value - 0.05,
                "val_loss": 1 - value,
                "train_loss": 1.2 - value,
                "train_samples_per_s": samples_per_s,
                "eval_samples_per_s": 3 * samples_per_s,
                "trainable_params": float(params.get("derived.trainable_params", 0)),
                "peak_memory_mb": 512.0,
                "wall_time_s": 2.0 * step,
            }
            self.client.log_batch(
                run_id, metrics=[Metric(k, v, 1000 + step, step) for k, v in metrics.items()]
            )
        self.client.set_tag(run_id, "raypeft.stopped_early", str(stopped_early).lower())
        self.client.set_terminated(run_id, "FINISHED")
        return run_id

    def finish(self, parent: str, best_run: str, best_trial: str) -> None:
        self.client.log_batch(
            parent,
            tags=[
                RunTag("raypeft.best_run_id", best_run),
                RunTag("raypeft.best_trial_id", best_trial),
            ],
        )
        self.client.set_terminated(parent, "FINISHED")

    def _params(self, run_id: str, params: dict) -> None:
        self.client.log_batch(run_id, params=[Param(k, str(v)) for k, v in params.items()])


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """The synthetic store; tests log reports only onto search B, and read A with --no-log."""
    folder = tmp_path_factory.mktemp("report-store")
    b = StoreBuilder(folder)
    exp = b.experiment("synth")
    # A: the DePT search (space entries both as JSON and as a Python repr, as older runs)
    a = b.parent(
        exp,
        1_000_000,
        {"raypeft.metric": "accuracy", "raypeft.mode": "max", "raypeft.method": "dept"},
        {
            "method.name": "dept",
            "method.budget_prompt_length": 10,
            "train.max_steps": 12,
            "space.method.lr_prompt": json.dumps({"grid": [0.3, 0.5]}),
            "space.method.lr_lowrank": str({"grid": [0.001, 0.01]}),
            "space.method.prompt_length": json.dumps({"choice": [2, 4]}),
            "space.train.warmup_ratio": str({"uniform": [0.0, 0.2]}),
        },
    )
    a_trials = {}
    n = 0
    for lr_prompt in (0.3, 0.5):
        for lr_lowrank in (0.001, 0.01):
            for m in (2, 4):
                tid = f"a{n:04d}"
                params = {
                    "method.lr_prompt": lr_prompt,
                    "method.lr_lowrank": lr_lowrank,
                    "method.prompt_length": m,
                    "method.rank": RANK[m],
                    "train.warmup_ratio": 0.05 * (n % 3),
                    "derived.rank": RANK[m],
                    "derived.trainable_params": PARAMS[m],
                }
                stopped = (lr_prompt, lr_lowrank, m) == (0.3, 0.001, 2)
                score = dept_score(lr_prompt, lr_lowrank, m)
                a_trials[tid] = b.trial(exp, a, tid, "dept", params, score, stopped)
                n += 1
    b.trial(exp, a, "a_failed", "dept", {"method.lr_prompt": 0.5}, None)
    b.finish(a, a_trials["a0007"], "a0007")
    # B: newer, several methods, two objectives (accuracy and training throughput)
    objectives = [
        {"metric": "accuracy", "mode": "max"},
        {"metric": "train_samples_per_s", "mode": "max"},
    ]
    bid = b.parent(
        exp,
        2_000_000,
        {
            "raypeft.metric": "accuracy",
            "raypeft.mode": "max",
            "raypeft.objectives": json.dumps(objectives),
        },
        {
            "method.name": "pt",
            "space.method.name": json.dumps({"grid": ["pt", "dept"]}),
            "space.methods.dept.lr_prompt": json.dumps({"choice": [0.3, 0.5]}),
        },
    )
    pt = {"method.lr": 0.3, "derived.trainable_params": 640}
    b.trial(exp, bid, "b0000", "pt", {**pt, "method.name": "pt"}, 0.62, samples_per_s=200.0)
    b.trial(exp, bid, "b0001", "pt", {**pt, "method.name": "pt"}, 0.58, samples_per_s=150.0)
    for tid, lr, score, speed in (("b0002", 0.3, 0.66, 120.0), ("b0003", 0.5, 0.70, 90.0)):
        params = {
            "method.name": "dept",
            "methods.dept.lr_prompt": lr,
            "method.lr_prompt": lr,
            "method.lr_lowrank": 0.001,
            "method.prompt_length": 2,
            "derived.rank": 5,
            "derived.trainable_params": 304,
        }
        best_b = b.trial(exp, bid, tid, "dept", params, score, samples_per_s=speed)
    b.finish(bid, best_b, "b0003")
    # a second experiment: one scored trial and one failed, no raypeft.metric tag
    lonely = b.experiment("lonely")
    c = b.parent(
        lonely,
        3_000_000,
        {},
        {"method.name": "pt", "search.metric": "None", "space.method.lr": "{'choice': [0.3]}"},
    )
    only = b.trial(
        lonely, c, "c0000", "pt", {"method.lr": 0.3, "derived.trainable_params": 640}, 0.6
    )
    b.trial(lonely, c, "c0001", "pt", {"method.lr": 0.3}, None)
    b.finish(c, only, "c0000")
    return {"uri": b.uri, "client": b.client, "a": a, "b": bid, "c": c, "folder": folder}


def invoke(*args: str):
    return CliRunner().invoke(main, ["report", *args])


def plotly_traces(path: Path) -> list[dict]:
    """The traces a plotly HTML page draws (the JSON passed to its Plotly.newPlot call)."""
    html = path.read_text()
    call = html[html.rindex("Plotly.newPlot(") + len("Plotly.newPlot(") :]
    call = call[call.index(",") + 1 :].lstrip()  # past the div id
    traces, _ = json.JSONDecoder().raw_decode(call)
    return traces


def check_figure(out: Path, name: str) -> list[dict]:
    png, html = out / f"{name}.png", out / f"{name}.html"
    assert png.read_bytes()[:8] == PNG_MAGIC
    assert png.stat().st_size > 8_000, f"{name}.png looks empty"
    traces = plotly_traces(html)
    assert traces, f"{name}.html draws nothing"
    return traces


def read_csv(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_dept_search_report_writes_every_figure(store, tmp_path):
    out = tmp_path / "rep"
    args = ["synth", "--tracking-uri", store["uri"], "--run", store["a"], "--out", str(out)]
    result = invoke(*args, "--top", "3", "--no-log", "--plotly-js", "cdn")
    assert result.exit_code == 0, result.output
    assert f"search {store['a']} (9 trials, metric accuracy, max)" in result.output
    for name in FIGURES:
        assert f"wrote   {name}.png, {name}.html" in result.output
    assert "skipped objectives_pareto: single-objective search" in result.output
    assert not (out / "objectives_pareto.png").exists()

    # heat map: one panel per m; cell values are the best score; the stopped-early cell starred
    heat = check_figure(out, "lr_heatmap")
    assert [t["name"] for t in heat] == ["m=2", "m=4"]
    m2 = heat[0]
    assert m2["x"] == ["0.3", "0.5"] and m2["y"] == ["0.001", "0.01"]
    assert [pytest.approx(row) for row in m2["z"]] == [[0.5, 0.7], [0.6, 0.8]]
    assert m2["text"][0][0] == "0.500*" and m2["text"][1][1] == "0.800"
    assert heat[1]["z"][1][1] == pytest.approx(0.85)

    budget = {t["name"]: t for t in check_figure(out, "budget_m_r")}
    assert set(budget) == {"trials", "stopped early", "best per m"}
    assert budget["best per m"]["x"] == ["m=2 / r=5", "m=4 / r=4"]
    assert budget["best per m"]["y"] == pytest.approx([0.8, 0.85])
    assert len(budget["trials"]["y"]) == 7 and budget["stopped early"]["y"] == [0.5]

    pareto = {t["name"]: t for t in check_figure(out, "params_pareto")}
    assert set(pareto) == {"dept", "Pareto front"}
    # fewer parameters (m=2: 304) reach 0.80, more (m=4: 320) reach 0.85: both on the front
    assert pareto["Pareto front"]["x"] == [304, 320]
    assert pareto["Pareto front"]["y"] == pytest.approx([0.8, 0.85])

    curves = check_figure(out, "learning_curves")
    assert [t["name"] for t in curves] == [
        "a0007 (dept) 0.8500",
        "a0006 (dept) 0.8000",
        "a0005 (dept) 0.7500",
    ]
    assert curves[0]["x"] == [4, 8, 12] and curves[0]["y"] == pytest.approx([0.65, 0.75, 0.85])

    (bars,) = check_figure(out, "importances")
    importance = dict(zip(bars["y"], bars["x"], strict=True))
    assert set(importance) == {
        "method.lr_prompt",
        "method.lr_lowrank",
        "method.prompt_length",
        "train.warmup_ratio",
    }
    assert max(importance, key=importance.get) == "method.lr_prompt"
    assert sum(importance.values()) == pytest.approx(1.0)

    rows = read_csv(out / "trials.csv")
    assert len(rows) == 9
    assert [r["trial_id"] for r in rows[:2]] == ["a0007", "a0006"]
    best = rows[0]
    assert best["best_val_accuracy"] == "0.85" and best["method.prompt_length"] == "4"
    assert best["derived.rank"] == "4" and best["derived.trainable_params"] == "320"
    assert best["train_samples_per_s"] == "100" and best["stopped_early"] == "false"
    for column in ("method.lr_prompt", "method.lr_lowrank", "train.warmup_ratio", "wall_time_s"):
        assert column in best
    failed = rows[-1]
    assert failed["trial_id"] == "a_failed" and failed["status"] == "FAILED"
    assert failed["best_val_accuracy"] == "" and "NonFiniteLossError" in failed["error"]
    assert [r["stopped_early"] for r in rows].count("true") == 1

    summary = (out / "summary.md").read_text()
    assert "| 1 | a0007 | dept | 0.8500 | no |" in summary
    assert summary.count("| dept |") == 3  # --top 3
    assert "- objectives_pareto: skipped: single-objective search" in summary
    assert "`lr_heatmap.png`, `lr_heatmap.html`" in summary
    # --no-log: nothing went to the parent run
    assert store["client"].list_artifacts(store["a"], "report") == []


def test_newest_search_is_reported_and_logged_to_its_parent_run(store, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default output folder is reports/<experiment> here
    result = invoke("synth", "--tracking-uri", store["uri"])
    assert result.exit_code == 0, result.output
    out = tmp_path / "reports" / "synth"
    assert f"search {store['b']} (4 trials" in result.output
    assert f"Report folder: {out}" in result.output
    assert f"Logged to MLflow run {store['b']} under report/" in result.output

    pareto = {t["name"]: t for t in check_figure(out, "params_pareto")}
    assert set(pareto) == {"pt", "dept", "Pareto front"}
    assert pareto["Pareto front"]["x"] == [304]  # DePT: fewer parameters and a better score
    objectives = {t["name"]: t for t in check_figure(out, "objectives_pareto")}
    # throughput 200 at 0.62 (pt), 120 at 0.66 and 90 at 0.70 (dept): 0.58 at 150 is dominated
    front = objectives["Pareto front"]
    assert front["x"] == pytest.approx([0.62, 0.66, 0.70])
    assert front["y"] == pytest.approx([200.0, 120.0, 90.0])
    (bars,) = check_figure(out, "importances")
    assert bars["y"] == ["method.name"]  # methods.dept.* is searched only in DePT trials
    summary = (out / "summary.md").read_text()
    assert "methods.dept.lr_prompt (not in every trial)" in summary
    assert len((out / "importances.html").read_bytes()) > 1_000_000  # plotly.js embedded

    client = store["client"]
    logged = {Path(f.path).name for f in client.list_artifacts(store["b"], "report")}
    assert {"trials.csv", "summary.md", "objectives_pareto.png", "importances.html"} <= logged
    local = client.download_artifacts(store["b"], "report/trials.csv", str(tmp_path / "dl"))
    assert Path(local).read_text() == (out / "trials.csv").read_text()


def test_figures_the_data_cannot_support_are_skipped_with_a_reason(store, tmp_path):
    out = tmp_path / "lonely"
    result = invoke("lonely", "--tracking-uri", store["uri"], "--out", str(out), "--no-log")
    assert result.exit_code == 0, result.output
    assert "metric accuracy, max" in result.output  # inferred from the trials' best_val_*
    expected = {
        "lr_heatmap": "no finished DePT trial",
        "budget_m_r": "no finished DePT trial",
        "importances": "needs at least 2 finished trials (has 1)",
    }
    for name, reason in expected.items():
        assert f"skipped {name}: {reason}" in result.output
        assert f"- {name}: skipped: {reason}" in (out / "summary.md").read_text()
        assert not (out / f"{name}.png").exists() and not (out / f"{name}.html").exists()
    check_figure(out, "params_pareto")
    check_figure(out, "learning_curves")
    rows = read_csv(out / "trials.csv")
    assert [(r["trial_id"], r["status"]) for r in rows] == [
        ("c0000", "FINISHED"),
        ("c0001", "FAILED"),
    ]


def test_unknown_experiment_is_a_one_line_error_and_creates_no_store(store, tmp_path, monkeypatch):
    result = invoke("nope", "--tracking-uri", store["uri"], "--out", str(tmp_path / "x"))
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        "error: experiment 'nope': not found in the MLflow store; experiments here: lonely, synth"
    ]
    assert not (tmp_path / "x").exists()
    # no store in the cwd and none given: the default sqlite:///mlflow.db is not created
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    result = invoke("nope")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: mlflow.db: no MLflow store here")
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "mlflow.db").exists()


def test_missing_store_and_foreign_run_are_user_errors(store, tmp_path):
    missing = tmp_path / "none.db"
    result = invoke("synth", "--tracking-uri", f"sqlite:///{missing}")
    assert result.exit_code == 2 and "no MLflow store here" in result.stderr
    assert not missing.exists()
    # a trial run is not a search; a search of another experiment neither
    trial = store["client"].search_runs(
        [store["client"].get_experiment_by_name("lonely").experiment_id],
        "tags.`raypeft.role` = 'trial'",
    )[0]
    for run_id in (trial.info.run_id, store["a"]):
        result = invoke("lonely", "--tracking-uri", store["uri"], "--run", run_id, "--no-log")
        assert result.exit_code == 2
        assert result.stderr == (
            f"error: run {run_id!r}: not a search (parent run) of experiment 'lonely'\n"
        )
    result = invoke("synth", "--tracking-uri", store["uri"], "--run", "0" * 32)
    assert result.exit_code == 2 and "not found in the MLflow store" in result.stderr
