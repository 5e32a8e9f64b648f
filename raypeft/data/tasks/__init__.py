"""Registered tasks and how their splits are loaded.

A task is a Hugging Face dataset (``glue/rte``), a local folder of jsonl files with Hugging Face
column names (``task.data_dir``, e.g. ../shared/data/rte), local files with a column mapping
(``task.name: files``), or the packaged tweet-sentiment demo (``tweet_sentiment``, offline).

Splits follow DePT's convention: the search uses validation; the test split is only evaluated
for the chosen configuration. Where a task has no labelled test split, validation is halved
(sets under 10k examples) or 1,000 training examples are held out as validation.

``specs`` says what a task is, ``loading`` reads its splits, ``rows`` checks what they hold,
``file_checks`` checks local files cheaply before anything loads; everything is imported from
here (``from raypeft.data.tasks import load_splits``).
"""

from raypeft.data.tasks.file_checks import check_readable, check_task_files
from raypeft.data.tasks.loading import (
    load_splits,
    packaged_tweets_path,
    split_origins,
    split_sources,
)
from raypeft.data.tasks.rows import check_batch_fits, class_label_names, infer_labels
from raypeft.data.tasks.specs import (
    CUSTOM_TASKS,
    SPLIT_NAMES,
    TASKS,
    TaskSpec,
    resolve_task_spec,
)

__all__ = [
    "CUSTOM_TASKS",
    "SPLIT_NAMES",
    "TASKS",
    "TaskSpec",
    "check_batch_fits",
    "check_readable",
    "check_task_files",
    "class_label_names",
    "infer_labels",
    "load_splits",
    "packaged_tweets_path",
    "resolve_task_spec",
    "split_origins",
    "split_sources",
]
