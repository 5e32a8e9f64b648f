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
    assert capsys.readouterr().out.strip() == ""  # one size: no interval to cost


def test_growth_is_the_cost_of_each_added_trial():
    """A fixed start cost cancels out: flat is flat however large the start; a platform whose
    trials each cost 0.1 ms more per trial run before them shows it."""
    flat = [(10, 20.0 + 0.05 * 10), (100, 20.0 + 0.05 * 100), (1000, 20.0 + 0.05 * 1000)]
    grows = [(n, 0.05 * n + 0.0001 * n * n / 2) for n in (10, 100, 1000)]
    rows = [
        {"store": "sqlite", "concurrency": 2, "layer": layer, "size": n, "fit_s": fit}
        for layer, points in (("raypeft", flat), ("tune", grows))
        for n, fit in points
    ]
    ours, theirs = platform_overhead.growth(rows)
    assert ours.endswith("10->100: 50.0, 100->1000: 50.0; last against first +0%"), ours
    assert theirs.endswith("10->100: 55.5, 100->1000: 105.0; last against first +89%"), theirs
    (ratio,) = platform_overhead.ratios(rows)
    assert ratio == "sqlite C=2 raypeft per added trial: 0.48x tune"
