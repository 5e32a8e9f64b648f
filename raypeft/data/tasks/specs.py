"""What a task is: its columns, problem, metrics and source (:class:`TaskSpec`), the
registered tasks (GLUE, SentEval-style local tasks, the packaged tweets), and the spec of a
``files`` or ``hub`` task built from the experiment file's columns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from raypeft.config.schema import TaskConfig
from raypeft.errors import ConfigError

SPLIT_NAMES = ("train", "validation", "test")  # what a search uses of a task


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
