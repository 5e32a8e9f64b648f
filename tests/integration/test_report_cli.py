"""``raypeft report`` on a real finished search (the session's ``finished_search``).

The report reads the fixture's store with --no-log; logging to the parent run is checked on a
copy of the store (database and artefact folder), so the shared fixture is never written to.
"""

from __future__ import annotations

import csv
import json
import shutil
import sqlite3
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.helpers import run_cli

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("shared_ray")]

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ALWAYS = ("lr_heatmap", "budget_m_r", "learning_curves")


def plotly_traces(path: Path) -> list[dict]:
    """The traces a plotly HTML page draws (the JSON passed to its Plotly.newPlot call)."""
    html = path.read_text()
    call = html[html.rindex("Plotly.newPlot(") + len("Plotly.newPlot(") :]
    call = call[call.index(",") + 1 :].lstrip()  # past the div id
    traces, _ = json.JSONDecoder().raw_decode(call)
    return traces


def search_runs(client: MlflowClient, experiment: str):
    exp = client.get_experiment_by_name(experiment)
    (parent,) = client.search_runs([exp.experiment_id], "tags.`raypeft.role` = 'experiment'")
    kids = client.search_runs(
        [exp.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'"
    )
    return exp, parent, kids


def copy_store(src: Path, dst: Path, client: MlflowClient, experiment: str) -> str:
    """Copy the store in ``src`` (mlflow.db and its artefact folder) to ``dst``, with the
    artefact paths recorded in the copy pointed at the copied folder; returns its URI."""
    exp = client.get_experiment_by_name(experiment)
    root = Path(exp.artifact_location.removeprefix("file://")).resolve()
    assert root.is_relative_to(src.resolve()), root  # MLflow's default: ./mlruns in the cwd
    top = root.relative_to(src.resolve()).parts[0]
    shutil.copy2(src / "mlflow.db", dst / "mlflow.db")
    shutil.copytree(src / top, dst / top)
    db = sqlite3.connect(dst / "mlflow.db")
    with db:
        for table, column in (("experiments", "artifact_location"), ("runs", "artifact_uri")):
            db.execute(
                f"UPDATE {table} SET {column} = replace({column}, ?, ?)",
                (str(src.resolve()), str(dst.resolve())),
            )
    db.close()
    return f"sqlite:///{dst / 'mlflow.db'}"


def test_report_on_the_finished_search(finished_search, tmp_path):
    client = finished_search.client()
    _, parent, kids = search_runs(client, finished_search.experiment)
    before = sorted(p.name for p in finished_search.cwd.iterdir())
    out = tmp_path / "rep"
    proc = run_cli(
        ["report", "tiny-search", "--out", str(out), "--no-log", "--top", "3"],
        cwd=finished_search.cwd,  # the default store: sqlite:///mlflow.db there
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"search {parent.info.run_id} (5 trials, metric accuracy, max)" in proc.stdout
    assert f"Report folder: {out}" in proc.stdout
    assert "Not logged to MLflow (--no-log)" in proc.stdout
    summary = (out / "summary.md").read_text()
    for name in ALWAYS:
        assert (out / f"{name}.png").read_bytes()[:8] == PNG_MAGIC
        assert (out / f"{name}.png").stat().st_size > 8_000
        assert plotly_traces(out / f"{name}.html")
        assert f"`{name}.png`, `{name}.html`" in summary
    assert "- objectives_pareto: skipped: single-objective search" in summary
    # one DePT budget (PT length 10) for every trial: no parameters to trade off
    assert (
        "- params_pareto: skipped: every finished trial has the same parameter budget "
        "(method.budget_prompt_length=10; "
    ) in summary
    assert not (out / "params_pareto.png").exists()
    # the HTML pages share one plotly.js, written beside them
    assert (out / "plotly.min.js").stat().st_size > 1_000_000
    figure_pages = [p for p in out.glob("*.html") if p.name != "report.html"]
    assert figure_pages and all(p.stat().st_size < 100_000 for p in figure_pages)
    # ... and report.html, every figure on one page, carries its own (opens alone)
    assert (out / "report.html").stat().st_size > 1_000_000
    # importances: drawn unless the tiny trials happen to tie (then skipped with that reason)
    assert (out / "importances.png").exists() or "every finished trial has the same score" in (
        summary
    )

    # the heat map's cells are the best best_val_accuracy among the trials of each cell
    scores: dict[tuple[int, float, float], float] = {}
    for kid in kids:
        p = kid.data.params
        cell = (
            int(p["method.prompt_length"]),
            float(p["method.lr_lowrank"]),
            float(p["method.lr_prompt"]),
        )
        value = kid.data.metrics["best_val_accuracy"]
        scores[cell] = max(scores.get(cell, value), value)
    drawn, overall = {}, {}
    for trace in plotly_traces(out / "lr_heatmap.html"):
        name = trace["name"]  # "all m", then "m=2", ...
        for j, y in enumerate(trace["y"]):
            for i, x in enumerate(trace["x"]):
                value = trace["z"][j][i]
                if value is None:
                    continue
                if name == "all m":
                    overall[(float(y), float(x))] = value
                else:
                    drawn[(int(name.removeprefix("m=")), float(y), float(x))] = value
    assert drawn.keys() == scores.keys()
    for cell, value in drawn.items():
        assert value == pytest.approx(scores[cell])
    # with several m, a panel over all of them holds each cell's best whatever its m
    if len({m for m, _, _ in drawn}) > 1:
        for (y, x), value in overall.items():
            assert value == pytest.approx(
                max(v for (_, b, a), v in drawn.items() if (b, a) == (y, x))
            )
        assert overall.keys() == {(y, x) for _, y, x in drawn}
    else:
        assert overall == {}
    # the α1 × α2 joint grid (2 × 2) is run first, whole
    assert {(y, x) for _, y, x in drawn} == {(a2, a1) for a2 in (1e-3, 1e-2) for a1 in (0.3, 0.5)}

    with (out / "trials.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert {r["run_id"] for r in rows} == {k.info.run_id for k in kids}
    assert all(r["method"] == "dept" and r["status"] == "FINISHED" for r in rows)
    assert all(r["stopped_early"] in ("true", "false") for r in rows)
    values = [float(r["best_val_accuracy"]) for r in rows]
    assert values == sorted(values, reverse=True)
    for r in rows:
        assert int(r["derived.trainable_params"]) == int(r["method.prompt_length"]) * 32 + 48 * int(
            r["derived.rank"]
        )

    # the fixture's store was only read
    assert client.list_artifacts(parent.info.run_id, "report") == []
    assert sorted(p.name for p in finished_search.cwd.iterdir()) == before


def test_report_is_logged_to_the_parent_run(finished_search, tmp_path):
    uri = copy_store(finished_search.cwd, tmp_path, finished_search.client(), "tiny-search")
    proc = run_cli(["report", "tiny-search", "--tracking-uri", uri], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "reports" / "tiny-search"  # the default folder, in the cwd
    copy = MlflowClient(tracking_uri=uri)
    _, parent, _ = search_runs(copy, "tiny-search")
    assert f"Logged to MLflow run {parent.info.run_id} under report/" in proc.stdout
    logged = {Path(f.path).name for f in copy.list_artifacts(parent.info.run_id, "report")}
    assert {"trials.csv", "summary.md", "lr_heatmap.png", "report.html"} <= logged
    # the folder less the per-figure pages and their plotly.min.js: report.html holds them
    assert logged == {
        p.name for p in out.iterdir() if p.suffix != ".html" and p.suffix != ".js"
    } | {"report.html"}
    local = copy.download_artifacts(parent.info.run_id, "report/summary.md", str(tmp_path / "dl"))
    assert Path(local).read_text() == (out / "summary.md").read_text()
    # the artefacts went into the copy's folder, not the fixture's
    assert list(tmp_path.glob(f"**/{parent.info.run_id}/artifacts/report/trials.csv"))
    original = finished_search.client()
    assert original.list_artifacts(parent.info.run_id, "report") == []


def test_unknown_experiment_fails_with_one_line(finished_search, tmp_path):
    proc = run_cli(["report", "no-such-search"], cwd=finished_search.cwd)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: experiment 'no-such-search': not found in the MLflow store; "
        "experiments here: tiny-search"
    ]
    # an empty folder: no store is created by reading
    proc = run_cli(["report", "tiny-search"], cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: mlflow.db: no MLflow store here (run a search first, or give --tracking-uri)"
    ]
    assert list(tmp_path.iterdir()) == []
