"""benchmarks.scale.platform_overhead at tiny sizes: every layer measured through the real Ray
Tune, Optuna and (for raypeft) MLflow, one JSON line per cell, and a second run skips the
cells the file holds (resumable)."""

from __future__ import annotations

import json

import pytest

from benchmarks.common.servers import ServerUnavailable
from benchmarks.scale import platform_overhead


@pytest.mark.slow
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


def test_postgres_that_cannot_run_is_one_line_and_exit_2_before_any_cell(
    tmp_path, monkeypatch, capsys
):
    """Not pytest's Skipped (the benchmark once borrowed the tests' servers), and not after
    the sqlite cells have run."""

    def unavailable():
        raise ServerUnavailable("PostgreSQL is not installed (apt-get install postgresql)")

    monkeypatch.setattr(platform_overhead, "postgres_runnable", unavailable)
    out = tmp_path / "overhead.jsonl"
    with pytest.raises(SystemExit) as exited:
        platform_overhead.main(["--sizes", "2", "--stores", "sqlite,postgres", "--out", str(out)])
    assert exited.value.code == 2
    assert capsys.readouterr().err == (
        "error: --stores postgres: PostgreSQL is not installed (apt-get install postgresql)\n"
    )
    assert not out.exists()


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


def test_pace_reads_growth_inside_one_search():
    """Trials ending every 50 ms are flat whatever the search's start cost; trials each taking
    0.1 ms longer than the one before show the growth in the last tenth."""
    flat = [30.0 + 0.05 * i for i in range(1000)]
    grows = [0.05 * i + 0.0001 * i * i / 2 for i in range(1000)]
    assert platform_overhead.pace(flat) == pytest.approx([50.0, 50.0])
    first, last = platform_overhead.pace(grows)
    assert first == pytest.approx(65.0, rel=0.01) and last == pytest.approx(145.0, rel=0.01)
    rows = [
        {"store": "sqlite", "concurrency": 8, "layer": "raypeft", "size": 1000,
         "pace_ms": platform_overhead.pace(grows)},
        {"store": "sqlite", "concurrency": 8, "layer": "tune", "size": 10, "pace_ms": [1, 2]},
    ]  # fmt: skip
    (line,) = platform_overhead.paces(rows)
    assert line.startswith("sqlite C=8 n=1000 raypeft: ms per trial, 2nd tenth 65.")
    assert line.endswith("(+123%)"), line
    assert platform_overhead.pace(flat[:19]) == []  # too few ends for two tenths
