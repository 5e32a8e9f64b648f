"""``raypeft report`` on a synthetic MLflow store (temp sqlite) shaped like raypeft's searches.

The store holds one experiment with two searches: an older DePT search (α1 × α2 grid, m
chosen, at one parameter budget, one trial stopped early, one failed) and a newer
multi-method search tagged with two objectives; and a second experiment with a single scored
trial, where most figures must be skipped with a reason. A store of its own holds a search
with long names (metric, keys), whose titles are the longest. The real command runs
in-process (CliRunner) and writes real files; figures are also drawn directly, to measure
them.
"""

from __future__ import annotations

import csv
import html
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from raypeft.cli.main import main
from raypeft.cli.report import command as report_command
from raypeft.data.metrics import format_metric
from raypeft.reporting import (
    FIGURES,
    PLOTLY_BUNDLE,
    PLOTLY_JS,
    REPORT_PAGE,
    Skip,
    load_search,
    lr_heatmap,
)
from raypeft.reporting.drawing import HTML_TITLE_CHARS, HTML_TITLE_PAD_PX

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# the DePT search's figures (its params_pareto is skipped: one budget)
DEPT_FIGURES = ("lr_heatmap", "budget_m_r", "learning_curves", "importances")
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
        metric: str = "accuracy",
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
                f"val_{metric}": value,
                f"best_val_{metric}": value,
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
                    # every trial logs its method's settings: one budget for all
                    "method.budget_prompt_length": 10,
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


@pytest.fixture(scope="module")
def long_names(tmp_path_factory):
    """A store with one search of long names: a long metric, long searched keys (the titles
    and tick labels are at their widest), three methods of different sizes."""
    b = StoreBuilder(tmp_path_factory.mktemp("report-long-names"))
    exp = b.experiment("long-names")
    metric = "matthews_correlation"
    parent = b.parent(
        exp,
        1_000_000,
        {"raypeft.metric": metric, "raypeft.mode": "max"},
        {
            "space.train.warmup_ratio": json.dumps({"uniform": [0.0, 0.2]}),
            "space.train.backbone_dropout": json.dumps({"choice": [0.0, 0.1]}),
        },
    )
    runs = []
    for n, (method, size) in enumerate((("pt", 640), ("dept", 304), ("ipt", 1_280)) * 2):
        params = {
            "train.warmup_ratio": 0.05 * n,
            "train.backbone_dropout": 0.1 * (n % 2),
            "derived.trainable_params": size,
        }
        score = 0.3 + 0.04 * n + 0.1 * (n % 2)
        runs.append(b.trial(exp, parent, f"t{n:04d}", method, params, score, metric=metric))
    b.finish(parent, runs[-1], "t0005")
    return {"uri": b.uri, "experiment": "long-names", "run": parent}


def invoke(*args: str):
    return CliRunner().invoke(main, ["report", *args])


def plotly_traces(path: Path) -> list[dict]:
    """The traces a plotly HTML page draws (the JSON passed to its Plotly.newPlot call)."""
    html = path.read_text()
    call = html[html.rindex("Plotly.newPlot(") + len("Plotly.newPlot(") :]
    call = call[call.index(",") + 1 :].lstrip()  # past the div id
    traces, _ = json.JSONDecoder().raw_decode(call)
    return traces


def plotly_layout(path: Path) -> dict:
    """The layout of a plotly HTML page (the JSON after the traces in Plotly.newPlot)."""
    html = path.read_text()
    call = html[html.rindex("Plotly.newPlot(") + len("Plotly.newPlot(") :]
    call = call[call.index(",") + 1 :].lstrip()  # past the div id
    decoder = json.JSONDecoder()
    _, end = decoder.raw_decode(call)  # the traces
    layout, _ = decoder.raw_decode(call[end:].lstrip().removeprefix(",").lstrip())
    return layout


def drawn_figures(search, folder: Path) -> dict:
    """Every figure the search supports, drawn as ``raypeft report`` draws it, its PNG
    written to ``folder``: name -> the pair."""
    figures = {}
    for name, (_, draw) in FIGURES.items():
        try:
            pair = draw(search, 3) if name == "learning_curves" else draw(search)
        except Skip:
            continue
        pair.png.savefig(folder / f"{name}.png", dpi=120)
        figures[name] = pair
    return figures


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


@pytest.mark.slow
def test_dept_search_report_writes_every_figure(store, tmp_path):
    out = tmp_path / "rep"
    args = ["synth", "--tracking-uri", store["uri"], "--run", store["a"], "--out", str(out)]
    result = invoke(*args, "--top", "3", "--no-log", "--plotly-js", "cdn")
    assert result.exit_code == 0, result.output
    assert f"search {store['a']} (9 trials, metric accuracy, max)" in result.output
    for name in DEPT_FIGURES:
        assert f"wrote   {name}.png, {name}.html" in result.output
    assert "skipped objectives_pareto: single-objective search" in result.output
    assert not (out / "objectives_pareto.png").exists()
    # every trial at one budget (PT length 10): their counts differ by its slack, no trade-off
    same_budget = (
        "every finished trial has the same parameter budget (method.budget_prompt_length=10; "
        "304 to 320 trainable parameters): nothing to trade off"
    )
    assert f"skipped params_pareto: {same_budget}" in result.output
    assert not (out / "params_pareto.png").exists() and not (out / "params_pareto.html").exists()

    # heat map: a panel over all m, then one per m; cell values are the best score, written
    # as the summary writes scores; the stopped-early cell starred
    heat = check_figure(out, "lr_heatmap")
    assert [t["name"] for t in heat] == ["all m", "m=2", "m=4"]
    every, m2, m4 = heat
    assert m2["x"] == ["0.3", "0.5"] and m2["y"] == ["0.001", "0.01"]
    assert [pytest.approx(row) for row in m2["z"]] == [[0.5, 0.7], [0.6, 0.8]]
    assert m2["text"][0][0] == "0.5000*" and m2["text"][1][1] == "0.8000"
    assert m4["z"][1][1] == pytest.approx(0.85)
    # all m: the best of each cell whatever m, with the m it came from (m=4 wins every cell)
    assert [pytest.approx(row) for row in every["z"]] == [[0.55, 0.75], [0.65, 0.85]]
    assert every["text"][1][1] == "0.8500<br>m=4" and every["text"][0][0] == "0.5500<br>m=4"

    budget = {t["name"]: t for t in check_figure(out, "budget_m_r")}
    assert set(budget) == {"trials", "stopped early", "best per m"}
    assert budget["best per m"]["x"] == ["m=2 / r=5", "m=4 / r=4"]
    assert budget["best per m"]["y"] == pytest.approx([0.8, 0.85])
    assert len(budget["trials"]["y"]) == 7 and budget["stopped early"]["y"] == [0.5]

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
    assert f"- params_pareto: skipped: {same_budget}" in summary
    assert "`lr_heatmap.png`, `lr_heatmap.html`" in summary
    assert not (out / PLOTLY_BUNDLE).exists()  # --plotly-js cdn
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
    assert f"Report folder: {out} (trials.csv, summary.md, plotly.min.js" in result.output

    assert "report.html: every figure on one page)" in result.output

    # logged: report.html (every figure, plotly.js inside) in place of the per-figure pages
    # and their shared plotly.min.js, which the MLflow UI's viewer cannot load
    client = store["client"]
    logged = {Path(f.path).name for f in client.list_artifacts(store["b"], "report")}
    pngs = {f"{name}.png" for name in FIGURES}
    assert logged == pngs | {"trials.csv", "summary.md", REPORT_PAGE}
    assert f"open report/{REPORT_PAGE} in the run's Artifacts tab" in result.output
    local = client.download_artifacts(store["b"], "report/trials.csv", str(tmp_path / "dl"))
    assert Path(local).read_text() == (out / "trials.csv").read_text()
    page = Path(client.download_artifacts(store["b"], f"report/{REPORT_PAGE}", str(tmp_path)))
    text = page.read_text()
    assert 4_000_000 < page.stat().st_size < 6_000_000  # one plotly.js (~4.8 MB) for all six
    assert not re.findall(r"<script[^>]* src=", text)  # loads nothing from beside it or a CDN
    assert text.count("Plotly.newPlot(") == len(FIGURES)
    for name, (caption, _) in FIGURES.items():
        assert f'id="{name}"' in text and html.escape(caption) in text


def test_figures_the_data_cannot_support_are_skipped_with_a_reason(store, tmp_path):
    out = tmp_path / "lonely"
    result = invoke("lonely", "--tracking-uri", store["uri"], "--out", str(out), "--no-log")
    assert result.exit_code == 0, result.output
    assert "metric accuracy, max" in result.output  # inferred from the trials' best_val_*
    expected = {
        "lr_heatmap": "no finished DePT trial",
        "budget_m_r": "no finished DePT trial",
        "importances": "needs at least 2 finished trials (has 1)",
        "params_pareto": "every finished trial has 640 trainable parameters: nothing to trade off",
    }
    for name, reason in expected.items():
        assert f"skipped {name}: {reason}" in result.output
        assert f"- {name}: skipped: {reason}" in (out / "summary.md").read_text()
        assert not (out / f"{name}.png").exists() and not (out / f"{name}.html").exists()
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


@pytest.mark.slow
def test_titles_fit_their_figures(store, long_names, tmp_path):
    """No title is cut off: in the PNG nothing drawn reaches past the figure's edges (the
    importances title used to lose its closing "trials)"), and each line of an HTML title
    is short enough for a narrow window, with room made for all its lines."""
    searches = {
        "dept": load_search(store["uri"], "synth", store["a"]),
        "methods": load_search(store["uri"], "synth", store["b"]),  # a one-panel heat map
        "long": load_search(long_names["uri"], long_names["experiment"], long_names["run"]),
    }
    drawn = {label: drawn_figures(search, tmp_path) for label, search in searches.items()}
    assert set(drawn["long"]) == {"params_pareto", "learning_curves", "importances"}
    overflowing = []
    for label, figures in drawn.items():
        for name, pair in figures.items():
            fig = pair.png
            fig.canvas.draw()
            ink = fig.get_tightbbox(fig.canvas.get_renderer())  # inches
            width, height = fig.get_size_inches()
            if ink.x0 < 0 or ink.y0 < 0 or ink.x1 > width or ink.y1 > height:
                overflowing.append(f"{label} {name}: ink {ink.bounds}, figure {width}x{height}")
    assert overflowing == []
    full_title = "importance for best validation matthews_correlation (max) (fANOVA over 6 trials)"
    png_title = drawn["long"]["importances"].png.get_suptitle()
    assert png_title.replace("\n", " ") == full_title  # whole, on as many lines as it needs

    out = tmp_path / "long"
    args = ["long-names", "--tracking-uri", long_names["uri"], "--out", str(out), "--no-log"]
    assert invoke(*args).exit_code == 0
    for name in drawn["long"]:
        layout = plotly_layout(out / f"{name}.html")
        title = layout["title"]
        lines = title["text"].split("<br>")
        assert all(len(line) <= HTML_TITLE_CHARS for line in lines), (name, lines)
        assert title["automargin"] is True, name
        # hung from the page's top, with a top margin that holds every line (where each
        # title is drawn in a browser: tests/integration/test_report_browser.py)
        assert (title["yref"], title["y"], title["yanchor"]) == ("container", 1, "top"), name
        assert layout["margin"]["t"] >= HTML_TITLE_PAD_PX + 23 * len(lines), name
    html_title = plotly_layout(out / "importances.html")["title"]["text"]
    assert html_title.replace("<br>", " ") == full_title


def test_heat_map_axis_labels_do_not_overlap(store, tmp_path):
    """Each panel's x label is wrapped to its panel: a label wider than the panel ran into
    the next panel's label and tick labels."""
    pair = lr_heatmap(load_search(store["uri"], "synth", store["a"]))
    fig = pair.png
    fig.savefig(tmp_path / "lr_heatmap.png", dpi=120)
    renderer = fig.canvas.get_renderer()
    panels = [ax for ax in fig.axes if ax.get_xlabel()]
    assert len(panels) == 3  # all m, m=2, m=4
    boxes = []
    for ax in panels:
        boxes.append(("x label", ax.xaxis.label.get_window_extent(renderer)))
        for tick in ax.get_yticklabels():
            boxes.append(("y tick", tick.get_window_extent(renderer)))
    labels = [b for kind, b in boxes if kind == "x label"]
    for i, a in enumerate(labels):
        for b in labels[i + 1 :]:
            assert not a.overlaps(b), (a, b)
        for kind, b in boxes:
            if kind == "y tick":
                assert not a.overlaps(b), (a, b)
    assert panels[0].get_xlabel() == "α1\n(method.lr_prompt)"  # wrapped, never cut


def test_stopped_early_curves_are_drawn_as_the_title_says(store):
    """A trial stopped at its first evaluation is one point: drawn as an open marker (and a
    dashed line where it has more), named "stopped at step N"; the title says so only when
    such a trial is drawn."""
    from raypeft.reporting import learning_curves

    search = load_search(store["uri"], "synth", store["a"])
    every = learning_curves(search, 20)
    title = every.html.layout.title.text.replace("<br>", " ")
    assert title.endswith("(dashed, open markers: stopped early)")
    traces = {t.name: t for t in every.html.data}
    (stopped,) = [t for name, t in traces.items() if "stopped" in name]
    assert stopped.name == "a0000 (dept) 0.5000, stopped at step 4"
    assert list(stopped.x) == [4] and stopped.marker.symbol == "circle-open"
    assert stopped.line.dash == "dash" and stopped.mode == "lines+markers"
    for name, trace in traces.items():
        if trace is not stopped:
            assert trace.marker.symbol == "circle" and trace.line.dash == "solid", name
    (line,) = [ln for ln in every.png.axes[0].lines if "stopped" in ln.get_label()]
    assert line.get_linestyle() == "--" and line.get_markerfacecolor() == "white"
    top = learning_curves(search, 3)  # none of the top 3 stopped early: no such promise
    assert "stopped" not in top.html.layout.title.text


def test_heat_map_writes_scores_as_the_summary_does(store, tmp_path):
    """The α1 × α2 cells (PNG text, HTML text and hover) use the summary's formatter."""
    assert format_metric(0.70754) == "0.7075"  # what `raypeft tune` prints, not 0.708
    pair = lr_heatmap(load_search(store["uri"], "synth", store["a"]))
    pair.png.savefig(tmp_path / "lr_heatmap.png")
    cell_texts = [text.get_text() for ax in pair.png.axes for text in ax.texts]
    assert len(cell_texts) == 3 * 4  # three panels (all m, m=2, m=4) of 2 × 2 cells
    assert "0.5000*" in cell_texts and "0.8500\nm=4" in cell_texts
    assert all(re.fullmatch(r"0\.\d{4}\*?(\nm=\d)?", text) for text in cell_texts), cell_texts
    for trace in pair.html.data:
        assert "%{z:.4f}" in trace.hovertemplate
        for row_z, row_text in zip(trace.z, trace.text, strict=True):
            for value, text in zip(row_z, row_text, strict=True):
                if value is not None:
                    assert text.split("<br>")[0].rstrip("*") == format_metric(value)


def test_html_pages_share_one_plotly_bundle(store, tmp_path):
    """By default plotly.js is written once into the folder and every page loads it from
    there (small pages, offline: no CDN); a bundle left by an earlier report is replaced."""
    from plotly.offline import get_plotlyjs

    out = tmp_path / "shared"
    out.mkdir()
    (out / PLOTLY_BUNDLE).write_text("/* an older report's plotly.js */")
    args = ["synth", "--tracking-uri", store["uri"], "--run", store["b"], "--out", str(out)]
    result = invoke(*args, "--no-log")
    assert result.exit_code == 0, result.output
    pages = sorted(p for p in out.glob("*.html") if p.name != REPORT_PAGE)
    assert len(pages) == 6  # every figure of the multi-method search
    for page in pages:
        assert page.stat().st_size < 100_000, page
        # one script loads plotly.js, from beside the page
        assert re.findall(r'<script[^>]* src="([^"]+)"', page.read_text()) == [PLOTLY_BUNDLE]
    assert [p.name for p in out.rglob("*.js")] == [PLOTLY_BUNDLE]
    assert (out / PLOTLY_BUNDLE).read_text(encoding="utf-8") == get_plotlyjs()

    # the command offers exactly the ways write_report knows
    (option,) = [p for p in report_command.params if p.name == "plotly_js"]
    assert set(option.type.choices) == set(PLOTLY_JS)

    # inline: each page carries plotly.js and no bundle is left beside them
    args = ["lonely", "--tracking-uri", store["uri"], "--out", str(out), "--no-log"]
    assert invoke(*args, "--plotly-js", "inline").exit_code == 0
    assert not (out / PLOTLY_BUNDLE).exists()
    assert (out / "learning_curves.html").stat().st_size > 1_000_000
