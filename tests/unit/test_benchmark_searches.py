"""benchmarks.common.searches: a benchmark's search runs in a folder of its own, and finds
the data it was given relative to where the benchmark started."""

from __future__ import annotations

from pathlib import Path

from benchmarks.common.searches import paths_from_here
from benchmarks.search import replays


def test_relative_data_paths_are_made_absolute_from_where_the_benchmark_started(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    cfg = replays.search_with({})
    relative = cfg.model_copy(
        update={
            "task": cfg.task.model_copy(
                update={"data_dir": Path("data/mr"), "files": {"train": Path("mr/train.jsonl")}}
            )
        }
    )
    moved = paths_from_here(relative)
    assert moved.task.data_dir == tmp_path / "data" / "mr"
    assert moved.task.files == {"train": tmp_path / "mr" / "train.jsonl"}
    assert moved.space == cfg.space and relative.task.data_dir == Path("data/mr")


def test_a_config_without_local_data_is_left_as_it_is():
    cfg = replays.search_with({})
    cfg = cfg.model_copy(update={"task": cfg.task.model_copy(update={"data_dir": None})})
    assert paths_from_here(cfg) == cfg
