"""What a user runs after a big search, timed at 1,000 runs (issue 41, item 4).

One search of ``--trials`` zero-time replayed trials (``resources.trial_runner: replay``, the
table and experiment of :mod:`benchmarks.scale.platform_overhead`, 8 at a time) runs through the
real ``raypeft tune`` into ``--work``; then each command a user runs after it is timed as the user
runs it, a subprocess on that store:

- ``raypeft report`` (figures, report.html, trials.csv, logged to the parent run);
- ``raypeft table`` (the learning-curve table, from Optuna and MLflow);
- ``raypeft predict --experiment`` (the best trial's model on 64 texts);
- ``raypeft ui``: the seconds until it prints its URL, then until headless Chromium shows the
  runs page with the search's parent run and, expanded, its first trial.

Each measurement appends one JSON line to ``--out`` as it ends; a command already there for
this number of trials is skipped, and a finished search in ``--work`` is reused (resumable).

    python -m benchmarks.scale.after_search --trials 1000 --work /tmp/after-search

Time it alone on the machine: a run beside other work is not a timing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks.common.paths import REPO, RESULTS
from benchmarks.common.results import ResultsFile
from benchmarks.common.servers import free_port
from benchmarks.common.tiny_search import REPLAYED, replay_space, replay_table

RAYPEFT = str(Path(sys.executable).with_name("raypeft"))
NAME = "after-search"
COMMANDS = ("tune", "report", "table", "predict", "ui")
ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "HF_HUB_OFFLINE": "1",
    "RAY_AUTH_MODE": "disabled",
}


def experiment(trials: int, work: Path) -> dict[str, Any]:
    """The search: platform_overhead's raypeft cell at C=8, in ``work``'s sqlite stores."""
    return {
        "name": NAME,
        **REPLAYED,
        "space": replay_space(),
        "search": {
            "num_samples": trials,
            "sampler": "random",
            "answer_repeats": False,  # every trial runs (100 configurations, 1,000 trials)
            "max_concurrent": 8,
            "scheduler": {"type": "none"},
        },
        "resources": {"trial_runner": "replay"},
        "replay": {"table": str(work / "table.json"), "time_scale": 0},
        "run": {"storage_path": str(work / "ray_results")},
    }


def run(args: list[str], work: Path, timeout: float = 3600) -> float:
    """``raypeft ARGS`` in ``work``, to success; its wall seconds."""
    start = time.perf_counter()
    proc = subprocess.run(
        [RAYPEFT, *args],
        cwd=work,
        env={**os.environ, **ENV},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise RuntimeError(f"raypeft {args[0]} exited {proc.returncode}: " + " | ".join(tail))
    return time.perf_counter() - start


def searched(work: Path) -> bool:
    """Whether ``work`` holds a finished search (its summary line was written)."""
    return (work / "tune.done").exists()


def tune(trials: int, work: Path) -> dict[str, Any]:
    """The search itself, from scratch (a half-done one is removed first)."""
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    data = experiment(trials, work)
    replay_table(work / "table.json", data)
    (work / "experiment.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    seconds = run(["tune", "experiment.yaml", "--quiet"], work)
    (work / "tune.done").write_text(f"{seconds}\n")
    return {"wall_s": seconds}


def report(work: Path) -> dict[str, Any]:
    seconds = run(["report", NAME, "--out", "report"], work)
    return {"wall_s": seconds, "figures": len(list((work / "report").glob("*.png")))}


def table(work: Path) -> dict[str, Any]:
    seconds = run(["table", NAME, "--out", "table-read.json"], work)
    curves = json.loads((work / "table-read.json").read_text())["curves"]
    return {"wall_s": seconds, "curves": len(curves)}


def predict(work: Path) -> dict[str, Any]:
    texts = [f"the {i}th day of the search was {'good' if i % 2 else 'bad'}" for i in range(64)]
    (work / "texts.txt").write_text("\n".join(texts) + "\n")
    seconds = run(["predict", "--experiment", NAME, "--input", "texts.txt"], work)
    return {"wall_s": seconds, "texts": len(texts)}


def ui(work: Path) -> dict[str, Any]:
    """``raypeft ui``: seconds to its URL, then to the runs page showing the parent run and,
    expanded, a trial, in headless Chromium (the system's, driven by Playwright)."""
    from playwright.sync_api import expect, sync_playwright

    from raypeft.tracking.runs import parent_runs, trial_runs
    from raypeft.tracking.stores import tracking_client

    client = tracking_client(f"sqlite:///{work / 'mlflow.db'}")
    exp_id = client.get_experiment_by_name(NAME).experiment_id
    (parent,) = parent_runs(client, exp_id)
    trial = trial_runs(client, exp_id, parent.info.run_id)[0]
    port = free_port("127.0.0.1")
    start = time.perf_counter()
    proc = subprocess.Popen(
        [RAYPEFT, "ui", NAME, "--port", str(port)],
        cwd=work,
        env={**os.environ, **ENV},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        url = next(ln.split(": ", 1)[1].strip() for ln in proc.stdout if ln.startswith("MLflow UI"))
        served_s = time.perf_counter() - start
        with sync_playwright() as pw:
            browser = pw.chromium.launch(
                executable_path=shutil.which("chromium"),
                headless=True,
                args=["--no-sandbox", "--disable-gpu"],
            )
            page = browser.new_page(viewport={"width": 2400, "height": 1100})
            start = time.perf_counter()
            page.goto(url)
            row = page.locator(f'.ag-pinned-left-cols-container [row-id="{parent.info.run_id}"]')
            expect(row.get_by_role("link", name=NAME, exact=True)).to_be_visible(timeout=600_000)
            parent_s = time.perf_counter() - start
            first = page.get_by_role("link", name=trial.info.run_name, exact=True)
            if not first.is_visible():
                row.locator("button").first.click()
            expect(first).to_be_visible(timeout=600_000)
            expanded_s = time.perf_counter() - start
            browser.close()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    return {
        "wall_s": served_s + expanded_s,
        "served_s": served_s,
        "parent_row_s": parent_s,
        "first_trial_s": expanded_s,
    }


STEPS = {"report": report, "table": table, "predict": predict, "ui": ui}


def measured(row: dict[str, Any]) -> tuple[int, str] | None:
    """What a row measured (a command at a number of trials); None for a failed one."""
    return None if "error" in row else (row["trials"], row["command"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--work", type=Path, default=Path("/tmp/after-search"))
    parser.add_argument("--out", type=Path, default=RESULTS / "after_search.jsonl")
    parser.add_argument("--only", default=",".join(COMMANDS), help="commands, comma-separated")
    args = parser.parse_args(argv)
    work = args.work / str(args.trials)
    results = ResultsFile(args.out, key=measured)
    wanted = [c for c in args.only.split(",") if not results.done((args.trials, c))]
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    steps = [c for c in wanted if c != "tune"]
    if wanted and not searched(work):  # every command reads the search's store
        _append(results, args.trials, commit, {"command": "tune", **tune(args.trials, work)})
    for command in steps:
        try:
            row = {"command": command, **STEPS[command](work)}
        except Exception as exc:  # noqa: BLE001  (a failing step is recorded, the rest go on)
            row = {"command": command, "error": str(exc)[:500]}
        _append(results, args.trials, commit, row)


def _append(results: ResultsFile, trials: int, commit: str, row: dict[str, Any]) -> None:
    row = {"trials": trials, "commit": commit, "date": time.strftime("%Y-%m-%d"), **row}
    print(json.dumps(results.append(row)), flush=True)


if __name__ == "__main__":
    main()
