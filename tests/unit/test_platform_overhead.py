"""benchmarks.platform_overhead at tiny sizes: every layer measured through the real Ray
Tune, Optuna and (for raypeft) MLflow, one JSON line per cell, and a second run skips the
cells the file holds (resumable)."""

from __future__ import annotations

import json

from benchmarks import platform_overhead


def test_the_benchmark_measures_every_layer_and_resumes(tmp_path, capsys):
    out = tmp_path / "overhead.jsonl"
    args = ["--sizes", "2", "--concurrency", "2", "--stores", "sqlite", "--out", str(out)]
    platform_overhead.main(args)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["layer"] for r in rows] == list(platform_overhead.LAYERS)
    for row in rows:
        assert "error" not in row, row
        assert row["trials"] == 2 and row["per_trial_ms"] > 0 and row["driver_peak_mb"] > 0
    by_layer = {r["layer"]: r for r in rows}
    # two trials of three evaluations each, in Optuna's store and in MLflow's
    assert by_layer["tune_optuna"]["optuna_rows"]["trials"] == 2
    assert by_layer["raypeft"]["optuna_rows"]["trials"] == 2
    assert by_layer["raypeft"]["optuna_rows"]["trial_intermediate_values"] == 6
    assert by_layer["raypeft"]["mlflow_rows"]["runs"] == 3  # the parent and two trials
    capsys.readouterr()

    platform_overhead.main(args)  # everything measured already: nothing runs again
    assert len(out.read_text().splitlines()) == 3
    assert len(capsys.readouterr().out.strip().splitlines()) == 3  # the growth lines only


def test_growth_is_the_slope_of_time_per_trial_against_trials():
    rows = [
        {"store": "sqlite", "concurrency": 2, "layer": "raypeft", "size": n, "per_trial_ms": ms}
        for n, ms in [(10, 50.0), (100, 50.0), (1000, 50.0)]
    ] + [
        {"store": "sqlite", "concurrency": 2, "layer": "tune", "size": n, "per_trial_ms": n / 10}
        for n in (10, 100, 1000)
    ]
    flat, grows = platform_overhead.growth(rows)
    assert flat.endswith("slope 0.00") and "10: 50.0, 100: 50.0, 1000: 50.0" in flat
    assert grows.endswith("slope 100.00")  # 0.1 ms more per trial for each trial run
