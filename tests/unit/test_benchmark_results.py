"""benchmarks.common.results: the one resumable results file every study that appends results
uses. A row is on disk as soon as it is appended, a resumed study skips what is stored, a line
an interruption cut short is skipped and the next row starts a line of its own, and a replaced
row leaves the others as they were."""

from __future__ import annotations

import json

import pytest

from benchmarks.common.results import ResultsFile


def by_cell(row: dict) -> tuple:
    return (row["store"], row["size"])


def test_a_row_is_on_disk_once_appended_and_a_resumed_study_skips_it(tmp_path):
    path = tmp_path / "sub" / "out.jsonl"
    results = ResultsFile(path, key=by_cell)
    assert results.rows() == [] and not results.done(("sqlite", 10))
    results.append({"store": "sqlite", "size": 10, "seconds": float("nan")})
    assert json.loads(path.read_text())["size"] == 10  # written before anything else
    resumed = ResultsFile(path, key=by_cell)
    assert resumed.done(("sqlite", 10)) and not resumed.done(("sqlite", 100))
    assert [r["size"] for r in resumed.rows()] == [10]


def test_a_line_cut_short_is_skipped_and_the_next_row_starts_a_new_line(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_text('{"store": "sqlite", "size": 10}\n{"store": "sql')
    results = ResultsFile(path, key=by_cell)
    assert [r["size"] for r in results.rows()] == [10]
    results.append({"store": "postgres", "size": 10})
    assert [by_cell(r) for r in ResultsFile(path, key=by_cell).rows()] == [
        ("sqlite", 10),
        ("postgres", 10),
    ]


def test_replace_drops_the_rows_of_the_same_key_only(tmp_path):
    path = tmp_path / "out.jsonl"
    results = ResultsFile(path, key=by_cell)
    for size, seconds in ((10, 1), (100, 2), (10, 3)):
        results.append({"store": "sqlite", "size": size, "seconds": seconds})
    results.replace({"store": "sqlite", "size": 10, "seconds": 4})
    stored = ResultsFile(path, key=by_cell).rows()
    assert [(r["size"], r["seconds"]) for r in stored] == [(100, 2), (10, 4)]


def test_a_key_returning_none_counts_a_row_as_not_done(tmp_path):
    path = tmp_path / "out.jsonl"
    failed = lambda row: None if "error" in row else row["command"]  # noqa: E731
    ResultsFile(path).append({"command": "report", "error": "boom"})
    assert not ResultsFile(path, key=failed).done("report")


def test_done_without_a_key_says_so(tmp_path):
    with pytest.raises(TypeError, match="was given no key"):
        ResultsFile(tmp_path / "out.jsonl").done("x")
