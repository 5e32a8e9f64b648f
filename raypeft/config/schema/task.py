"""The ``task`` section: a registered task, any Hub dataset or local files, and how
many examples of each split a search uses."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from raypeft.config.space import StrictModel


class TaskConfig(StrictModel):
    """The labelled task: a registered one, any Hub dataset (`hub`) or local files (`files`)."""

    name: str = Field(
        "tweet_sentiment",
        description="registered task (tweet_sentiment, glue/rte, ...), or `hub` (any Hugging Face "
        "dataset, with `dataset` and the columns) or `files` (local files, with the columns)",
    )
    dataset: str | None = Field(
        None, description="hub tasks: dataset id (or a local dataset folder) for load_dataset"
    )
    dataset_config: str | None = Field(None, description="hub tasks: the dataset's config name")
    validation_split: str = Field("validation", description="hub tasks: split used as validation")
    data_dir: Path | None = Field(
        None, description="folder with train/validation[/test].jsonl instead of the Hub"
    )
    files: dict[Literal["train", "validation", "test"], Path] | None = Field(
        None, description="local jsonl/csv/parquet files per split (task name: files)"
    )
    text_column: str | None = Field(None, description="first text column (files tasks)")
    text_pair_column: str | None = Field(None, description="second text column, if pairs")
    label_column: str = Field("label", description="label column (files tasks)")
    problem: Literal["classification", "regression"] | None = Field(
        None, description="files tasks: classification (default) or regression"
    )
    max_train_examples: int | None = Field(None, ge=1, description="cap on training examples")
    max_eval_examples: int | None = Field(None, ge=1, description="cap on validation examples")
    max_test_examples: int | None = Field(None, ge=1, description="cap on test examples")
    split_seed: int = Field(0, description="seed of subsampling and of derived splits")
    seq2seq_scoring: Literal["generate", "rank"] = Field(
        "generate",
        description="how a seq2seq backbone (T5) answers a classification task: generate "
        "(greedy text, mapped to the class it names; text that names none counts as wrong, "
        "as DePT's code) or rank (each class's verbalizer scored by its log-likelihood under "
        "the decoder, the most likely one predicted: always a class). Regression tasks "
        "always generate; other backbones use their head",
    )
