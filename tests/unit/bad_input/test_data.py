"""Bad input: the task, its files and their rows.

Every error ``tune`` finds when it loads the task, ``validate`` finds too (the same line):
the preflight pipeline loads the data for both.

Each case runs ``raypeft tune`` and then ``raypeft validate`` (conftest.py): exit code 2,
exactly one line ``error: ...`` naming the key or file and what must hold, the same line from
both, nothing created in the working directory, and Ray, MLflow and Optuna never reached.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from raypeft.cli.main import main

from .helpers import Case, exp, files_task, ids, listing, rows, run_in_process, write_jsonl


def _broken_jsonl(tmp: Path) -> dict:
    task = files_task(tmp)
    lines = (tmp / "train.jsonl").read_text().splitlines()
    lines[2] = '{"text": "half a row", "label": '
    (tmp / "train.jsonl").write_text("\n".join(lines) + "\n")
    return exp(task=task)


def _malformed_csv(tmp: Path) -> dict:
    (tmp / "train.csv").write_text(
        "text,label\n"
        + "".join(f"row {i},{'pos' if i % 2 else 'neg'}\n" for i in range(6))
        + "row six,pos,surplus\n"
    )
    task = files_task(tmp)
    task["files"]["train"] = "train.csv"
    return exp(task=task)


def _unreadable_data(tmp: Path) -> dict:
    task = files_task(tmp)
    (tmp / "train.jsonl").chmod(0)
    return exp(task=task)


def _trec_dir(tmp: Path) -> dict:
    """A registered task with fixed labels (TREC: 6 classes) read from a local folder."""
    write_jsonl(tmp / "trec" / "train.jsonl", rows(8, [0, 1, 2, 7], text="sentence"))
    write_jsonl(tmp / "trec" / "validation.jsonl", rows(4, [0, 1], text="sentence", prefix="v"))
    return exp(task={"name": "trec", "data_dir": "trec"})


def _lonely_validation(tmp: Path) -> dict:
    # no test file: validation is halved into validation and test
    return exp(task=files_task(tmp, validation=rows(1, ["pos"], prefix="v")))


def _null_text(tmp: Path) -> dict:
    train = rows(8, ["pos", "neg"])
    train[1]["text"] = None
    return exp(task=files_task(tmp, train=train))


def _empty_train(tmp: Path) -> dict:
    task = files_task(tmp)
    (tmp / "train.jsonl").write_text("")
    return exp(task=task)


CASES: list[Case] = [
    # ---- the task
    Case(
        "unknown-split-in-files",
        exp(task={"name": "files", "files": {"training": "a.jsonl"}, "text_column": "text"}),
        ("task.files.training", "must be one of 'train', 'validation' or 'test'"),
    ),
    Case("unknown-task", exp(task={"name": "glue/nope"}), ("task.name", "'glue/nope'", "must be")),
    Case(
        "column-key-on-a-registered-task",
        exp(task={"name": "tweet_sentiment", "text_column": "tweet"}),
        ("task.text_column", "'tweet_sentiment'", "must be left out"),
    ),
    Case(
        "files-task-without-validation",
        lambda tmp: exp(
            task={**files_task(tmp), "files": {"train": "train.jsonl"}},
        ),
        ("task.files", "train and validation"),
    ),
    # ---- files (found before any data loads)
    Case(
        "empty-data-file",
        _empty_train,
        ("task.files.train", "train.jsonl", "empty", "must hold at least one example"),
    ),
    Case(
        "missing-text-column",
        lambda tmp: exp(task=files_task(tmp, text_column="sentence")),
        ("task.text_column", "column 'sentence'", "train.jsonl", "must name a column"),
    ),
    Case(
        "missing-label-column-in-validation",
        lambda tmp: exp(task=files_task(tmp, validation=[{"text": "v"}, {"text": "w"}])),
        ("task.label_column", "column 'label'", "val.jsonl", "must name a column"),
    ),
    Case(
        "data-dir-missing",
        exp(task={"name": "trec", "data_dir": "no_such_dir"}),
        ("task.data_dir", "no_such_dir", "no such folder"),
    ),
    Case(
        "unreadable-data-file",
        _unreadable_data,
        ("task.files.train", "train.jsonl", "cannot read", "must be readable"),
        needs_non_root=True,
    ),
    Case(
        "broken-jsonl",
        _broken_jsonl,
        ("task.files.train", "train.jsonl", "line 3 is not valid JSON", "must be one JSON object"),
    ),
    Case(
        "malformed-csv",
        _malformed_csv,
        ("task.files.train", "train.csv", "cannot read as CSV", "Expected 2 fields"),
    ),
    # ---- rows and labels
    Case(
        "one-class-training-set",
        lambda tmp: exp(task=files_task(tmp, train=rows(8, ["pos"]), validation=rows(4, ["pos"]))),
        ("task", "train.jsonl", "1 class", "2+ needed", "must see at least 2 classes"),
        in_process=True,
    ),
    Case(
        "label-out-of-range-for-a-registered-task",
        _trec_dir,
        ("task.label_column", "train.jsonl", "must lie in [0, 5]", "'trec' has 6 classes", "row 4"),
    ),
    Case(
        "negative-class-id",
        lambda tmp: exp(
            task=files_task(tmp, train=rows(8, [0, 1, -1]), validation=rows(4, [0, 1]))
        ),
        ("task.label_column", "train.jsonl", "must lie in [0, 1]", "row 3 holds -1"),
    ),
    Case(
        "validation-class-id-beyond-training",
        lambda tmp: exp(task=files_task(tmp, train=rows(8, [0, 1]), validation=rows(4, [0, 3]))),
        ("task.label_column", "val.jsonl", "must lie in [0, 1]", "row 2 holds 3"),
    ),
    Case(
        "validation-class-name-not-in-training",
        lambda tmp: exp(task=files_task(tmp, validation=rows(4, ["pos", "meh"]))),
        ("val.jsonl", "['meh']", "not seen in train", "must appear in the training labels"),
    ),
    Case(
        "regression-label-not-numeric",
        lambda tmp: exp(task=files_task(tmp, problem="regression")),
        ("task.label_column", "train.jsonl", "must hold a finite number", "row 1 holds 'pos'"),
    ),
    Case(
        "fractional-class-id",
        lambda tmp: exp(task=files_task(tmp, train=rows(8, [0, 1, 0.5]))),
        ("task.label_column", "train.jsonl", "class id (integer >= 0)", "row 3 holds 0.5"),
    ),
    Case(
        "missing-text-value",
        _null_text,
        ("task.text_column", "train.jsonl", "must hold a text in every row", "row 2 has none"),
    ),
    Case(
        "class-names-mixed-with-ids",
        lambda tmp: exp(task=files_task(tmp, train=rows(8, ["pos", 1]))),
        ("task.label_column", "train.jsonl", "either class names or class ids", "mixes both"),
    ),
    Case(
        "validation-ids-where-training-has-names",
        lambda tmp: exp(task=files_task(tmp, validation=rows(4, [0, 1], prefix="v"))),
        ("task.label_column", "val.jsonl", "must hold class names as the training split does"),
    ),
    Case(
        "one-class-left-after-max-train-examples",
        lambda tmp: exp(task=files_task(tmp, max_train_examples=1)),
        ("task", "1 class after task.max_train_examples", "2+ needed"),
    ),
    # ---- sizes
    Case(
        "batch-larger-than-the-training-set",
        lambda tmp: exp(task=files_task(tmp), train__batch_size=16),
        ("train.batch_size", "`batch_size <= 8`", "must hold", "got 16"),
    ),
    Case(
        "searched-batch-larger-than-the-training-set",
        lambda tmp: exp(task=files_task(tmp), space={"train.batch_size": {"choice": [4, 32]}}),
        ("train.batch_size", "`batch_size <= 8`", "got 32"),
    ),
    Case(
        "validation-too-small-to-halve",
        _lonely_validation,
        ("validation split", "is empty", "val.jsonl", "must hold at least 2 examples"),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_bad_input_is_one_line_exit_2_and_touches_nothing(case, run_case):
    run_case(case)


IN_PROCESS = [c for c in CASES if c.in_process]


@pytest.mark.parametrize("case", IN_PROCESS, ids=ids(IN_PROCESS))
@pytest.mark.slow
def test_bad_input_in_a_real_process(case, tmp_path):
    run_in_process(case, tmp_path)


def test_validate_accepts_good_data_and_creates_nothing(tmp_path, monkeypatch, guarded):
    """The data stage loads every row and still leaves the working directory as it was."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(exp(task=files_task(tmp_path))))
    before = listing(tmp_path)
    result = CliRunner().invoke(main, ["validate", "exp.yaml"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("exp.yaml: ok (pt on tiny-bert, task files")
    assert listing(tmp_path) == before and not guarded
