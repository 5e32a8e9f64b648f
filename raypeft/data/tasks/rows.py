"""The rows of loaded splits checked: a text in every row, labels that fit the task (class
ids in range, names seen in training, numbers for regression), 2+ training classes, and
enough training examples for a batch."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from raypeft.config.schema import ExperimentConfig
from raypeft.data.tasks.specs import SPLIT_NAMES, TaskSpec
from raypeft.errors import ConfigError

if TYPE_CHECKING:  # annotations only: datasets loads on use (see load_splits)
    import datasets


def is_unlabelled_test(labels: list) -> bool:
    """Labels of a test split whose labels are hidden: GLUE's test splits on the Hub carry
    label -1 (treated as no test split)."""
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) and v < 0 for v in labels)


def check_values(raw: datasets.DatasetDict, spec: TaskSpec, sources: dict[str, str]) -> None:
    """Texts and labels of every split that will be used, row by row (rows count from 1)."""
    label_col = spec.label_column
    kinds: dict[str, str] = {}  # split -> "name" | "id" (classification)
    values: dict[str, list] = {}
    for split in SPLIT_NAMES:
        ds = raw.get(split)
        if ds is None:
            continue
        where = sources[split]
        for key, col in (
            ("task.text_column", spec.text_column),
            ("task.text_pair_column", spec.text_pair_column),
        ):
            if not col:
                continue
            for row, text in enumerate(column(ds, col), 1):
                if not isinstance(text, str):
                    what = "has none" if text is None else f"holds {text!r}, not text"
                    raise ConfigError(
                        f"{key}: column {col!r} of {where} must hold a text in every row, "
                        f"but row {row} {what}"
                    )
        if label_col not in ds.column_names:
            continue  # an unlabelled test split (the column check allowed it)
        labels = column(ds, label_col)
        if split == "test" and is_unlabelled_test(labels):
            continue
        values[split] = labels
        for row, label in enumerate(labels, 1):
            bad = _bad_label(label, spec.problem)
            if bad:
                raise ConfigError(
                    f"task.label_column: column {label_col!r} of {where} must hold "
                    f"{_LABEL_RULE[spec.problem]} in every row, but row {row} {bad}"
                )
        if spec.problem == "classification":
            names = {isinstance(v, str) for v in labels}
            if len(names) > 1:
                row = 1 + next(i for i, v in enumerate(labels) if isinstance(v, str))
                raise ConfigError(
                    f"task.label_column: column {label_col!r} of {where} must hold either class "
                    f"names or class ids, but mixes both (row {row} holds {labels[row - 1]!r})"
                )
            kinds[split] = "name" if names == {True} else "id"
    if spec.problem == "classification":
        _check_classes(values, kinds, spec, sources)


def _check_classes(
    values: dict[str, list], kinds: dict[str, str], spec: TaskSpec, sources: dict[str, str]
) -> None:
    """Class labels across splits: one kind (names or ids) as in training, 2+ training
    classes, every name seen in training, every id in range."""
    label_col = spec.label_column
    train = values["train"]
    if len(kinds) > 1 and len(set(kinds.values())) > 1:
        split = next(s for s, k in kinds.items() if k != kinds["train"])
        raise ConfigError(
            f"task.label_column: column {label_col!r} of {sources[split]} must hold class "
            f"{kinds['train']}s as the training split does, but holds class {kinds[split]}s"
        )
    classes = sorted(set(train), key=str)
    if len(classes) < 2:
        raise ConfigError(
            f"task: the training labels (column {label_col!r} of {sources['train']}) have "
            f"{len(classes)} class ({classes}); 2+ needed: a classifier must see at least 2 "
            "classes"
        )
    if kinds["train"] == "name":
        for split, labels in values.items():
            unknown = sorted(set(labels) - set(train))
            if unknown:
                raise ConfigError(
                    f"task: {split} labels {unknown[:3]} of {sources[split]} not seen in train: "
                    f"every class name must appear in the training labels {classes[:10]}"
                )
        return
    declared = spec.num_labels
    top = declared - 1 if declared else int(max(train))
    why = f"task {spec.name!r} has {declared} classes" if declared else "the training ids"
    for split, labels in values.items():
        for row, label in enumerate(labels, 1):
            if not 0 <= label <= top:
                raise ConfigError(
                    f"task.label_column: class ids in column {label_col!r} of {sources[split]} "
                    f"must lie in [0, {top}] ({why}), but row {row} holds {label!r}"
                )


def column(ds: datasets.Dataset, name: str) -> list:
    """A column as a list (``ds[name]`` is a lazy column that reads row by row: 100x slower)."""
    return ds[name][:]


def check_batch_fits(cfg: ExperimentConfig, train_examples: int) -> None:
    """Every trial needs at least one full global batch of training examples (the largest
    ``train.batch_size`` the space can sample, when it searches the batch size)."""
    searched = cfg.space.get("train.batch_size")
    largest = searched.largest() if searched else cfg.train.batch_size
    if largest > train_examples:
        raise ConfigError(
            f"train.batch_size: `batch_size <= {train_examples}` (the training examples) must "
            f"hold, but got {largest}"
        )


_LABEL_RULE = {
    "classification": "a class name (string) or class id (integer >= 0)",
    "regression": "a finite number (task.problem: regression)",
}


def _bad_label(label, problem: str) -> str | None:
    """Why one label cannot be used (None: it can)."""
    if label is None:
        return "has none"
    if problem == "regression":
        if isinstance(label, bool) or not isinstance(label, (int, float)):
            return f"holds {label!r}"
        return None if math.isfinite(label) else f"holds {label!r}"
    if isinstance(label, str):
        return None
    if isinstance(label, bool):
        return None  # False/True: ids 0 and 1
    if isinstance(label, float) and not (math.isfinite(label) and label.is_integer()):
        return f"holds {label!r} (for numeric targets set task.problem: regression)"
    if not isinstance(label, (int, float)):
        return f"holds {label!r}"
    return None


def infer_labels(splits: datasets.DatasetDict, spec: TaskSpec) -> tuple[TaskSpec, list[str] | None]:
    """Check labels and fix ``num_labels``; string labels become ids (sorted names)."""
    if spec.problem == "regression":
        return spec, None
    train_labels = column(splits["train"], spec.label_column)
    by_name = isinstance(train_labels[0], str)
    names = sorted(set(train_labels)) if by_name else class_label_names(splits, spec)
    num = spec.num_labels or (len(names) if names else int(max(train_labels)) + 1)
    distinct = len(set(train_labels))
    if distinct < 2:
        raise ConfigError(
            f"task: {spec.name!r} training labels have {distinct} class after "
            f"task.max_train_examples; 2+ needed: a classifier must see at least 2 classes"
        )
    for split, ds in splits.items():
        labels = column(ds, spec.label_column)
        if by_name:
            unknown = set(labels) - set(names)
            if unknown:
                raise ConfigError(
                    f"task: {split} labels {sorted(unknown)[:3]} not seen in train "
                    "(after task.max_train_examples): every class must appear in training"
                )
        elif min(labels) < 0 or max(labels) >= num:
            raise ConfigError(
                f"task: {split} labels must lie in [0, {num - 1}], "
                f"got [{min(labels)}, {max(labels)}]"
            )
    return replace(spec, num_labels=num), names


def class_label_names(splits: datasets.DatasetDict, spec: TaskSpec) -> list[str] | None:
    """The class names of integer labels, where the dataset declares them (a ``ClassLabel``
    column: GLUE on the Hub, the packaged tweets); None otherwise."""
    import datasets  # imported on use: the training core imports this module without it

    feature = splits["train"].features.get(spec.label_column)
    if isinstance(feature, datasets.ClassLabel) and feature.names:
        return [str(name) for name in feature.names]
    return None
