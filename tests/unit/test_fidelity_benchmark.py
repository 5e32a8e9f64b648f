"""``python -m benchmarks.fidelity`` end to end at a tiny setting (tiny random BERT, a dozen
examples per split, 4 steps): the benchmark's three parts, resuming after an interruption
without training a finished run again, --report, and --calibrate; plus its planning rules,
without training."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.fidelity import plan as fidelity_plan

REPO = Path(__file__).resolve().parents[2]
MODULE = "benchmarks.fidelity"
SINGLE = ("mr", "sst2", "mpqa")  # {"sentence", "label"}
PAIRS = ("mrpc", "stsb")  # {"sentence1", "sentence2", "label"}
OTHER = ("trec", "cola")  # tasks of the shared data the benchmark leaves out unless named
NO_TEST = ("sst2", "cola")  # as GLUE ships it: validation is halved into validation and test
WORDS = "good bad fine awful great poor nice dull the a film story".split()


def _write_tiny_data(folder: Path) -> Path:
    """Every task the tiny runs read, in ../shared/data's layout and columns."""
    rng = random.Random(0)
    for task in SINGLE + PAIRS + OTHER:
        splits = ("train", "validation") + (() if task in NO_TEST else ("test",))
        (folder / task).mkdir(parents=True)
        for split in splits:
            rows = [_row(task, i, rng) for i in range(24 if split == "train" else 12)]
            text = "".join(json.dumps(r) + "\n" for r in rows)
            (folder / task / f"{split}.jsonl").write_text(text)
    return folder


def _row(task: str, i: int, rng: random.Random) -> dict:
    words = " ".join(rng.choice(WORDS) for _ in range(6))
    label = round(rng.uniform(0, 5), 2) if task == "stsb" else i % (6 if task == "trec" else 2)
    if task in PAIRS:
        return {"sentence1": words, "sentence2": words[::-1], "label": label}
    return {"sentence": words, "label": label}


def _corpus(folder: Path) -> Path:
    """A two-topic corpus for IPT's table pretraining (instead of BBC News)."""
    for topic, word in (("sport", "match"), ("money", "bank")):
        (folder / topic).mkdir(parents=True)
        for i in range(4):
            (folder / topic / f"{i}.txt").write_text(f"the {word} news number {i} {word}")
    return folder


def _fidelity(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAYPEFT_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run(
        [sys.executable, "-m", MODULE, *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_tiny_benchmark_runs_resumes_and_reports(tmp_path):
    data = _write_tiny_data(tmp_path / "data")
    results = tmp_path / "fidelity.jsonl"
    args = ["--tiny", "--data-dir", str(data), "--results", str(results)]
    args += ["--ipt-corpus", str(_corpus(tmp_path / "corpus")), "--tasks", "mr,stsb"]
    args += ["--seeds", "2", "--curve-tasks", "mr", "--curve-m", "20,60", "--ablation-tasks", "mr"]
    first = _fidelity(tmp_path, *args)
    records = _lines(results)
    # main: 2 tasks × 4 methods × (2 rates at seed 0 + seed 1); curve: m=20 × 2 seeds (m=60 is
    # the main table's DePT); ablations: init (PT, DePT), dropout (PT, DePT, IDPG), low-rank
    # start (DePT), head pooling (all four), each × 2 seeds
    assert len(records) == 24 + 2 + 12 + 8, first.stdout[-3000:]
    assert len({r["key"] for r in records}) == len(records)
    assert all(r["failed"] is None and r["step_s"] > 0 for r in records)
    assert {r["method"] for r in records} == {"PT", "DePT", "M-IDPG-PHM", "IPT"}
    assert "estimated wall time" in first.stdout
    ablated = {(r["method"], tuple(map(tuple, r["variant"]))) for r in records if r["variant"]}
    assert ("DePT", (("method.lowrank_init", "paper"),)) in ablated
    assert ("M-IDPG-PHM", (("train.backbone_dropout", 0),)) in ablated
    assert ("DePT", (("method.prompt_length", 20),)) in ablated
    assert ("IPT", (("model.head_pooling", "first"),)) in ablated
    assert len({r["params"] for r in records if r["method"] == "PT"}) == 1  # one budget
    # every evaluation's validation score (accuracy where the task has it): the learning curve
    assert all(len(r["val_curve"]) == 2 and r["val_curve"][-1][0] == 4 for r in records)

    # an interruption: the last 5 runs lost, the last kept line cut short
    kept = results.read_text().splitlines()[: len(records) - 5]
    results.write_text("\n".join(kept[:-1]) + "\n" + kept[-1][:40])
    again = _fidelity(tmp_path, *args)
    lines = [json.loads(x) for x in results.read_text().splitlines() if _is_json(x)]
    assert len(lines) == len(records)
    assert {r["key"] for r in lines} == {r["key"] for r in records}
    # the finished runs were not trained again: same records, same finishing times
    unchanged = {r["key"]: r["finished_at"] for r in records[: len(records) - 6]}
    assert all(r["finished_at"] == unchanged[r["key"]] for r in lines if r["key"] in unchanged)
    assert "finished before" in again.stdout and again.stdout.count(" steps: val ") == 6

    report = squeezed(_fidelity(tmp_path, *args, "--report").stdout)
    assert "| mr | accuracy |" in report and "| stsb | pearson |" in report
    assert "| DePT ≥ PT |" in report and "| M-IDPG-PHM ≥ PT |" in report
    assert "| 100 | 0 |" in report and "| 20 |" in report  # PT as m=100, DePT m=20
    assert "| lowrank_init: official vs paper | DePT | mr |" in report
    assert "python -m benchmarks.fidelity --data-dir" in report and "--steps 4" in report


def squeezed(text: str) -> str:
    """Text with runs of spaces as one (the tables pad their columns)."""
    return re.sub(r" {2,}", " ", text)


def _is_json(line: str) -> bool:
    try:
        json.loads(line)
    except json.JSONDecodeError:
        return False
    return True


@pytest.mark.slow
def test_tiny_calibration_reports_the_majority_class_and_a_count(tmp_path):
    data = _write_tiny_data(tmp_path / "data")
    results = tmp_path / "fidelity.jsonl"
    args = ["--tiny", "--data-dir", str(data), "--results", str(results), "--calibrate"]
    args += ["--ipt-corpus", str(_corpus(tmp_path / "corpus"))]
    out = squeezed(_fidelity(tmp_path, *args).stdout)
    assert "the full benchmark at 4 steps about" in out
    assert "| steps | sst2 val acc / majority | mpqa val acc / majority |" in out
    assert "Suggested: --steps" in out or "No step count tried" in out
    assert "- sst2 (majority + margin" in out and "lr 0.3 over 2 steps: " in out
    runs = _lines(results)
    assert {r["task"] for r in runs} == {"sst2", "mpqa", "mrpc"}
    assert {r["method"] for r in runs} == {"PT"} and {r["steps"] for r in runs} <= {2, 4}
    assert squeezed(_fidelity(tmp_path, *args, "--report").stdout).count("| 2 |") == 1


@pytest.mark.slow
def test_tiny_benchmark_runs_on_the_shared_data_s_other_tasks(tmp_path):
    """TREC (six classes) and CoLA (Matthews correlation; no labelled test split) when named."""
    data = _write_tiny_data(tmp_path / "data")
    results = tmp_path / "fidelity.jsonl"
    args = ["--tiny", "--data-dir", str(data), "--results", str(results), "--tasks", "trec,cola"]
    args += ["--methods", "PT", "--lrs", "1", "--seeds", "1", "--curve-tasks", ""]
    args += ["--ablation-tasks", ""]
    out = squeezed(_fidelity(tmp_path, *args).stdout)
    runs = _lines(results)
    assert {(r["task"], r["method"]) for r in runs} == {("trec", "PT"), ("cola", "PT")}
    assert all(r["failed"] is None for r in runs)
    assert "| trec | accuracy |" in out and "| cola | matthews_correlation |" in out


def test_an_unknown_task_is_refused_in_one_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", MODULE, "--report", "--tasks", "mr,qqq"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--tasks: unknown ['qqq']" in proc.stderr and "'trec'" in proc.stderr


# ------------------------------------------------------------------ planning, without training


def _setting(fp):
    return fp.Setting("tiny-bert", 16, 100, 3200, 4, 5e-3, 24, 12, 12, 2, "auto")


def _finished(fp, setting, run, val, accuracy=None, majority=0.5) -> dict:
    val_metrics = {"accuracy": val if accuracy is None else accuracy}
    return {
        "key": run.key(setting),
        "val": val,
        "val_metrics": val_metrics,
        "majority": {"validation": {"accuracy": majority}},
    }


def test_the_rate_is_chosen_on_validation_once_its_grid_has_finished():
    fp = fidelity_plan
    setting = _setting(fp)
    plan = fp.Plan(("mr",), ("PT", "DePT"), 2, 3, 10, ("mr",), (20, 60), ("mr",))
    grid = fp.grid_runs(plan)
    assert len(grid) == 4 and fp.benchmark_runs(plan, setting, {}) == grid  # nothing chosen yet
    pt_low, pt_high = (r for r in grid if r.method == "PT")
    records = {pt_low.key(setting): _finished(fp, setting, pt_low, 0.6)}
    assert fp.chosen_lr(plan, setting, records, "mr", "PT") is None  # one rate still running
    records[pt_high.key(setting)] = _finished(fp, setting, pt_high, 0.7)
    assert fp.chosen_lr(plan, setting, records, "mr", "PT") == pt_high.lr
    released = fp.benchmark_runs(plan, setting, records)[len(grid) :]
    # PT's seeds 1 and 2 and its ablations (init, dropout, head pooling: 3 seeds each); DePT's
    # wait
    assert {r.method for r in released} == {"PT"} and len(released) == 2 + 3 + 3 + 3
    assert all(r.lr == pt_high.lr for r in released)
    # a tie goes to the first rate; a diverged run (no val) loses
    records[pt_high.key(setting)] = _finished(fp, setting, pt_high, 0.6)
    assert fp.chosen_lr(plan, setting, records, "mr", "PT") == pt_low.lr
    records[pt_low.key(setting)] = {"key": pt_low.key(setting), "val": None}
    assert fp.chosen_lr(plan, setting, records, "mr", "PT") == pt_high.lr
    # DePT's curve: m=20 at 3 seeds (m=60 is the main table's run)
    full = fp.full_benchmark(plan, setting, records)
    assert sum(dict(r.variant).get("method.prompt_length") == 20 for r in full) == 3
    assert len({r.key(setting) for r in full}) == len(full)


def test_calibration_stops_at_the_first_count_where_pt_left_the_majority_class():
    fp = fidelity_plan
    setting = _setting(fp)
    plan = fp.Plan(("mr",), ("PT",), 1, 1, 10, (), (), (), ("sst2", "mpqa"), (2, 4, 8), 0.02)
    records: dict = {}
    first = fp.calibration_runs(plan, setting, records)
    assert {r.steps for r in first} == {2} and len(first) == 2
    for run in first:  # sst2 left it, mpqa did not: the next count is released
        accuracy = 0.8 if run.task == "sst2" else 0.51
        records[run.key(setting)] = _finished(fp, setting, run, accuracy)
    assert not fp.calibration_passes(plan, setting, records, 2)
    second = fp.calibration_runs(plan, setting, records)
    assert [r.steps for r in second] == [2, 2, 4, 4]
    for run in second[2:]:
        records[run.key(setting)] = _finished(fp, setting, run, 0.8)
    assert fp.calibration_passes(plan, setting, records, 4)
    assert fp.calibration_runs(plan, setting, records) == second  # 8 steps never runs
