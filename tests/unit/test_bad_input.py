"""Bad input: malformed or inconsistent experiment files, data and command lines.

Every case runs the real ``raypeft tune`` (click's CliRunner, in a fresh working directory)
with Ray, MLflow and Optuna guarded: any of ``ray.init``, ``MlflowClient.create_experiment``
/ ``create_run``, MLflow's sqlite store (it creates ``mlflow.db``), ``optuna.create_study`` or
``RDBStorage`` reached fails the case. Each must
exit with code 2 and print exactly one line, ``error: ...``, naming the key or file and what
must hold, and leave the working directory as it found it. Cases that need no data also run
through ``raypeft validate`` (same line, same code). A few run as real subprocesses, with
``RAY_TMPDIR`` pointing at a folder that must never appear (no Ray session).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from raypeft.cli.main import main

RAYPEFT = Path(sys.executable).parent / "raypeft"
CPUS = os.cpu_count() or 1

# A valid experiment: tiny model, tiny search. Each case breaks one thing.
BASE: dict[str, Any] = {
    "name": "bad-input",
    "model": {"name": "tiny-bert", "max_length": 16},
    "method": {"name": "pt", "prompt_length": 4},
    "train": {"max_steps": 20, "eval_every": 10, "batch_size": 4},
    "search": {"num_samples": 2},
    "run": {"storage_path": "ray_results"},  # in the working directory, where it is watched
}


def exp(**sections: Any) -> dict[str, Any]:
    """BASE with sections replaced (``method={...}``) or one key set (``train__eval_every=3``)."""
    data = copy.deepcopy(BASE)
    for key, value in sections.items():
        if "__" in key:
            section, leaf = key.split("__", 1)
            data.setdefault(section, {})[leaf] = value
        else:
            data[key] = value
    return data


# ----------------------------------------------------------------------------- data files


def rows(n: int, labels: list, text: str = "text", prefix: str = "t") -> list[dict]:
    return [
        {text: f"{prefix} example {i} is here", "label": labels[i % len(labels)]} for i in range(n)
    ]


def write_jsonl(path: Path, data: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in data))


def files_task(
    tmp: Path,
    train: list[dict] | None = None,
    validation: list[dict] | None = None,
    **task: Any,
) -> dict[str, Any]:
    """A ``files`` task (train.jsonl, val.jsonl in the working directory); pass a list to
    write it, or leave the default valid rows."""
    write_jsonl(tmp / "train.jsonl", rows(8, ["pos", "neg"]) if train is None else train)
    write_jsonl(
        tmp / "val.jsonl", rows(4, ["neg", "pos"], prefix="v") if validation is None else validation
    )
    return {
        "name": "files",
        "files": {"train": "train.jsonl", "validation": "val.jsonl"},
        "text_column": "text",
        "label_column": "label",
        **task,
    }


# ----------------------------------------------------------------------------- cases


Builder = Callable[[Path], "dict | str | None"]


@dataclass
class Case:
    id: str
    experiment: dict | str | Builder | None  # None: no file is written
    expect: tuple[str, ...]  # substrings of the error line: the key or file, and the rule
    args: tuple[str, ...] = ()
    data: bool = False  # the error needs the loaded data: `validate` does not see it
    tune_only: bool = False  # a command line only `tune` takes
    needs_no_gpu: bool = False
    needs_non_root: bool = False
    file: str = "exp.yaml"


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


def _unreadable_experiment(tmp: Path) -> None:
    path = tmp / "exp.yaml"
    path.write_text(yaml.safe_dump(BASE))
    path.chmod(0)


def _binary_experiment(tmp: Path) -> None:
    (tmp / "exp.yaml").write_bytes(b"\xff\xfe\x00name: x\n")


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


def _model_file(tmp: Path) -> dict:
    (tmp / "model").mkdir()
    (tmp / "model" / "weights.bin").write_bytes(b"\0")
    return exp(model={"name": "./model", "max_length": 16})


CASES: list[Case] = [
    # ---- the experiment file itself
    Case("missing-experiment-file", None, ("nope.yaml", "file not found"), file="nope.yaml"),
    Case(
        "unreadable-experiment-file",
        _unreadable_experiment,
        ("exp.yaml", "cannot read", "must be readable"),
        needs_non_root=True,
    ),
    Case("experiment-file-not-utf8", _binary_experiment, ("exp.yaml", "not UTF-8", "must be")),
    Case("not-yaml", "model: [unclosed\nname: x\n", ("exp.yaml", "not valid YAML", "line")),
    Case(
        "duplicate-key",
        "train: {max_steps: 20}\ntrain: {max_steps: 30}\nmethod: {name: pt}\n",
        ("exp.yaml", "line 2", "duplicate key 'train'", "must appear once"),
    ),
    Case(
        "yaml-list-at-top-level", "- model\n- task\n", ("exp.yaml", "top level must be a mapping")
    ),
    # ---- keys and types
    Case("unknown-top-level-key", exp(bogus=1), ("exp.yaml: bogus: unknown key", "the keys there")),
    Case(
        "unknown-nested-key",
        exp(search={"scheduler": {"type": "asha", "grace": 1}}),
        ("search.scheduler.grace: unknown key", "did you mean search.scheduler.grace_period"),
    ),
    Case(
        "typo-suggests-the-key",
        exp(train__max_stepz=30),
        ("train.max_stepz: unknown key", "did you mean train.max_steps?"),
    ),
    Case(
        "typo-in-a-method-knob",
        exp(method={"name": "dept", "prompt_lenght": 4, "budget_prompt_length": 10}),
        ("method.prompt_lenght: unknown key", "did you mean method.prompt_length"),
    ),
    Case(
        "string-for-int",
        exp(train__max_steps="many"),
        ("train.max_steps", "must be an integer", "'many'"),
    ),
    Case("list-for-mapping", exp(model=["tiny-bert"]), ("model", "must be a mapping")),
    Case(
        "fraction-for-int",
        exp(train__batch_size=2.5),
        ("train.batch_size", "must be an integer", "2.5"),
    ),
    Case(
        "unknown-split-in-files",
        exp(task={"name": "files", "files": {"training": "a.jsonl"}, "text_column": "text"}),
        ("task.files.training", "must be one of 'train', 'validation' or 'test'"),
    ),
    # ---- unknown method / task / model
    Case(
        "unknown-method", exp(method={"name": "lora"}), ("method", "unknown method 'lora'", "'pt'")
    ),
    Case(
        "method-without-name",
        exp(method={"prompt_length": 4}),
        ("method", "must name the method", "pt"),
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
    Case(
        "unknown-model-path",
        exp(model={"name": "./models/nope", "max_length": 16}),
        ("model.name", "./models/nope", "no such folder", "must be a local model folder"),
    ),
    Case(
        "model-folder-without-config",
        _model_file,
        ("model.name", "./model", "config.json", "must be"),
    ),
    Case(
        "unknown-model-id-offline",  # HF_HUB_OFFLINE=1 (tests/conftest.py): never the Hub
        exp(model={"name": "nobody/no-such-model", "max_length": 16}),
        ("model.name", "'nobody/no-such-model'", "HF_HUB_OFFLINE", "must be"),
    ),
    # ---- impossible budgets and sizes
    Case(
        "dept-m-not-below-l",
        exp(method={"name": "dept", "prompt_length": 10, "budget_prompt_length": 10}),
        ("method", "`prompt_length < budget_prompt_length` must hold"),
    ),
    Case(
        "dept-derived-rank-below-1",  # d=32, s=16: r = (10-9)·32 // 48 = 0
        exp(method={"name": "dept", "prompt_length": 9, "budget_prompt_length": 10}),
        ("method", "`r >= 1` must hold"),
    ),
    Case(
        "dept-rank-below-1-inside-an-int-range",
        exp(
            method={"name": "dept", "prompt_length": 2, "budget_prompt_length": 10},
            space={"method.prompt_length": {"int": [2, 9]}},
        ),
        ("method.prompt_length=9", "`r >= 1` must hold"),
    ),
    Case(
        "idpg-phm-n-not-dividing",
        exp(method={"name": "idpg", "generator": "phm", "phm_n": 5, "generator_hidden": 10}),
        ("method", "`phm_n` must divide", "phm_n=5"),
    ),
    Case(
        "idpg-phm-n-from-the-space",
        exp(
            method={"name": "idpg", "generator": "phm", "phm_n": 4, "generator_hidden": 8},
            space={"method.phm_n": {"choice": [4, 6]}},
        ),
        ("method.phm_n=6", "`phm_n` must divide"),
    ),
    Case(
        "budget-too-small",
        exp(budget_params=10, method={"name": "idpg", "generator": "dnn"}),
        ("budget_params >=", "must hold"),
    ),
    # ---- the search space
    Case(
        "grid-and-distribution-on-one-key",
        exp(space={"method.lr": {"grid": [0.1], "loguniform": [0.01, 0.1]}}),
        ("`method.lr` must have exactly one of", "['grid', 'loguniform']"),
    ),
    Case(
        "space-key-names-no-field",
        exp(space={"method.learning_rate": {"choice": [0.1, 0.2]}}),
        ("space.method.learning_rate", "unknown key, not a config field"),
    ),
    Case(
        "space-key-not-searchable",
        exp(space={"model.max_length": {"choice": [16, 32]}}),
        ("space.model.max_length", "only method, methods.<name>, train and budget_params"),
    ),
    Case(
        "empty-choice",
        exp(space={"train.batch_size": {"choice": []}}),
        ("space.train.batch_size.choice", "must have at least 1 item"),
    ),
    Case(
        "loguniform-low-zero",
        exp(space={"method.lr": {"loguniform": [0, 0.1]}}),
        ("space.method.lr", "`0 < low` must hold"),
    ),
    Case(
        "uniform-low-above-high",
        exp(space={"method.lr": {"uniform": [0.5, 0.1]}}),
        ("space.method.lr.uniform", "`low <= high` must hold"),
    ),
    Case(
        "int-step-not-fitting",
        exp(space={"method.prompt_length": {"int": [2, 9], "step": 2}}),
        ("space.method.prompt_length.int", "`(high - low) % step == 0` must hold"),
    ),
    Case(
        "space-value-invalid-for-the-field",
        exp(space={"train.batch_size": {"choice": [4, 0]}}),
        ("train.batch_size", "must be >= 1", "[from space.train.batch_size=0]"),
    ),
    Case(
        "space-values-valid-alone-not-together",
        exp(
            train={"max_steps": 100, "eval_every": 10, "batch_size": 4},
            space={"train.eval_every": {"choice": [50]}, "train.max_steps": {"choice": [20, 100]}},
        ),
        ("`eval_every <= max_steps` must hold", "[from train.eval_every=50 train.max_steps=20]"),
    ),
    # ---- scheduler and sampler
    Case(
        "reduction-factor-not-above-1",
        exp(search={"scheduler": {"type": "asha", "reduction_factor": 1}}),
        ("search.scheduler.reduction_factor", "must be > 1"),
    ),
    Case(
        "grace-period-beyond-the-evaluations",  # 20 steps / eval every 10 = 2 evaluations
        exp(search={"scheduler": {"type": "asha", "grace_period": 5}}),
        ("search.scheduler.grace_period", "`grace_period <= 2` must hold", "grace_period=5"),
    ),
    Case(
        "unknown-scheduler-type",
        exp(search={"scheduler": {"type": "pbt"}}),
        ("search.scheduler.type", "must be one of 'asha', 'hyperband', 'median' or 'none'"),
    ),
    Case(
        "grid-sampler-with-a-continuous-key",
        exp(search={"sampler": "grid"}, space={"method.lr": {"loguniform": [0.01, 0.1]}}),
        ("search.sampler", "must be grid or choice", "space.method.lr is continuous"),
    ),
    Case(
        "cmaes-with-two-objectives",
        exp(
            search={
                "sampler": "cmaes",
                "objectives": [{"metric": "accuracy"}, {"metric": "train_samples_per_s"}],
            },
            space={"method.lr": {"loguniform": [0.01, 0.1]}},
        ),
        ("cmaes", "search.objectives", "must be tpe, nsga2 or random"),
    ),
    # ---- objectives and constraints
    Case(
        "metric-the-task-does-not-report",
        exp(search={"metric": "bleu"}),
        ("search.metric", "'bleu' is not reported", "accuracy"),
    ),
    Case(
        "objective-the-task-does-not-report",
        exp(search={"objectives": [{"metric": "accuracy"}, {"metric": "f1"}]}),
        ("search.objectives[1].metric", "'f1' is not reported"),
    ),
    Case(
        "constraint-min-above-max",
        exp(search={"constraints": {"trainable_params": {"min": 100, "max": 10}}}),
        ("search.constraints.trainable_params", "`min <= max` must hold"),
    ),
    # ---- training loop and resources
    Case(
        "eval-every-beyond-max-steps",
        exp(train={"max_steps": 5, "eval_every": 10}),
        ("train", "`eval_every <= max_steps` must hold", "eval_every=10"),
    ),
    Case(
        "batch-not-divisible-by-workers",
        exp(train__batch_size=5, resources={"workers_per_trial": 2, "cpus_per_worker": 0.5}),
        ("train.batch_size", "`batch_size % resources.workers_per_trial == 0` must hold"),
    ),
    Case(
        "in-process-runner-with-two-workers",
        exp(resources={"trial_runner": "in_process", "workers_per_trial": 2}),
        ("resources.workers_per_trial", "`workers_per_trial == 1` must hold", "in_process"),
    ),
    Case(
        "gpu-on-a-machine-without-one",
        exp(resources={"use_gpu": True}),
        ("resources.use_gpu", "this machine has none", "must hold"),
        needs_no_gpu=True,
    ),
    Case(
        "worker-needs-more-cpus-than-the-machine",
        exp(resources={"cpus_per_worker": CPUS + 1}),
        ("resources.cpus_per_worker", f"`cpus_per_worker <= {CPUS}` must hold"),
    ),
    Case(
        "trial-needs-more-cpus-than-the-machine",
        exp(
            train__batch_size=4 * (CPUS + 1),
            resources={"workers_per_trial": CPUS + 1, "cpus_per_worker": 1},
        ),
        ("resources.workers_per_trial", f"<= {CPUS}` must hold", f"{CPUS + 1} × 1"),
    ),
    # ---- stores
    Case(
        "tracking-uri-with-an-unknown-scheme",
        exp(tracking={"uri": "bogus://host/x"}),
        ("tracking.uri", "unknown scheme 'bogus'", "must be an MLflow tracking URI"),
    ),
    Case(
        "tracking-sqlite-in-a-missing-folder",
        exp(tracking={"uri": "sqlite:///no/such/dir/mlflow.db"}),
        ("tracking.uri", "does not exist", "must exist"),
    ),
    # ---- command lines
    Case(
        "set-without-equals",
        exp(),
        ("exp.yaml", "--set 'train.max_steps'", "expected key=value"),
        args=("--set", "train.max_steps"),
    ),
    Case(
        "set-unknown-key",
        exp(),
        ("train.learning_rate: unknown key",),
        args=("--set", "train.learning_rate=0.1"),
    ),
    Case(
        "set-invalid-value",
        exp(),
        ("search.num_samples", "must be >= 1", "(got 0)"),
        args=("--set", "search.num_samples=0"),
    ),
    Case(
        "tracking-uri-option-with-an-unknown-scheme",
        exp(),
        ("tracking.uri", "unknown scheme 'bogus'"),
        args=("--tracking-uri", "bogus://host"),
        tune_only=True,
    ),
    Case(
        "set-inside-a-scalar",
        exp(),
        ("train.max_steps.inner", "not a section"),
        args=("--set", "train.max_steps.inner=1"),
    ),
    # ---- data (files tasks; errors found before any data loads are `validate`'s too)
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
        "ipt-corpus-missing",
        exp(method={"name": "ipt", "strategy": "pretrained", "corpus": "no_corpus"}),
        ("method.corpus", "no_corpus", "no such file or folder"),
    ),
    Case(
        "one-class-training-set",
        lambda tmp: exp(task=files_task(tmp, train=rows(8, ["pos"]), validation=rows(4, ["pos"]))),
        ("task", "train.jsonl", "1 class", "2+ needed", "must see at least 2 classes"),
        data=True,
    ),
    Case(
        "label-out-of-range-for-a-registered-task",
        _trec_dir,
        ("task.label_column", "train.jsonl", "must lie in [0, 5]", "'trec' has 6 classes", "row 4"),
        data=True,
    ),
    Case(
        "negative-class-id",
        lambda tmp: exp(
            task=files_task(tmp, train=rows(8, [0, 1, -1]), validation=rows(4, [0, 1]))
        ),
        ("task.label_column", "train.jsonl", "must lie in [0, 1]", "row 3 holds -1"),
        data=True,
    ),
    Case(
        "validation-class-id-beyond-training",
        lambda tmp: exp(task=files_task(tmp, train=rows(8, [0, 1]), validation=rows(4, [0, 3]))),
        ("task.label_column", "val.jsonl", "must lie in [0, 1]", "row 2 holds 3"),
        data=True,
    ),
    Case(
        "validation-class-name-not-in-training",
        lambda tmp: exp(task=files_task(tmp, validation=rows(4, ["pos", "meh"]))),
        ("val.jsonl", "['meh']", "not seen in train", "must appear in the training labels"),
        data=True,
    ),
    Case(
        "regression-label-not-numeric",
        lambda tmp: exp(task=files_task(tmp, problem="regression")),
        ("task.label_column", "train.jsonl", "must hold a finite number", "row 1 holds 'pos'"),
        data=True,
    ),
    Case(
        "fractional-class-id",
        lambda tmp: exp(task=files_task(tmp, train=rows(8, [0, 1, 0.5]))),
        ("task.label_column", "train.jsonl", "class id (integer >= 0)", "row 3 holds 0.5"),
        data=True,
    ),
    Case(
        "missing-text-value",
        _null_text,
        ("task.text_column", "train.jsonl", "must hold a text in every row", "row 2 has none"),
        data=True,
    ),
    Case(
        "broken-jsonl",
        _broken_jsonl,
        ("task.files.train", "train.jsonl", "line 3 is not valid JSON", "must be one JSON object"),
        data=True,
    ),
    Case(
        "malformed-csv",
        _malformed_csv,
        ("task.files.train", "train.csv", "cannot read as CSV", "Expected 2 fields"),
        data=True,
    ),
    Case(
        "prompt-and-input-beyond-the-position-embeddings",
        exp(model={"name": "tiny-bert", "max_length": 510}),
        ("method", "`model.max_length + prompt_length <= 512` must hold", "510 + 4 = 514"),
    ),
    Case(
        "tracking-uri-is-a-file-store",
        exp(tracking={"uri": "./mlruns"}),
        ("tracking.uri", "file store", "MLFLOW_ALLOW_FILE_STORE", "must be"),
    ),
    Case(
        "optuna-storage-driver-missing-password-redacted",
        exp(
            search={
                "num_samples": 2,
                "storage": "postgresql+nosuchdriver://me:s3cr3t-pw@db.example/optuna",
            }
        ),
        ("search.storage", "me:***@db.example", "driver must be installed"),
    ),
    Case("empty-study-name", exp(search__study_name=""), ("search.study_name", "at least 1")),
    Case(
        "batch-larger-than-the-training-set",
        lambda tmp: exp(task=files_task(tmp), train__batch_size=16),
        ("train.batch_size", "`batch_size <= 8`", "must hold", "got 16"),
        data=True,
    ),
    Case(
        "searched-batch-larger-than-the-training-set",
        lambda tmp: exp(task=files_task(tmp), space={"train.batch_size": {"choice": [4, 32]}}),
        ("train.batch_size", "`batch_size <= 8`", "got 32"),
        data=True,
    ),
    Case(
        "resume-with-no-search-to-resume",
        exp(),
        ("--resume", "no MLflow store here"),
        args=("--resume",),
        tune_only=True,
    ),
    Case(
        "unknown-command-line-option",
        exp(),
        ("No such option '--spaec'", "tune --help"),
        args=("--spaec", "x.yaml"),
        tune_only=True,
    ),
    Case(
        "experiment-file-is-a-folder",
        None,
        ("'--space'", "is a directory"),
        file=".",
        tune_only=True,
    ),
    Case(
        "validation-too-small-to-halve",
        _lonely_validation,
        ("validation split", "is empty", "val.jsonl", "must hold at least 2 examples"),
        data=True,
    ),
]


def test_the_suite_is_big_enough():
    assert len(CASES) >= 30 and len({c.id for c in CASES}) == len(CASES)


# ----------------------------------------------------------------------------- running


def _skip_if_unrunnable(case: Case) -> None:
    if case.needs_non_root and hasattr(os, "geteuid") and os.geteuid() == 0:
        pytest.skip("root reads files whatever their mode")
    if case.needs_no_gpu:
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has a GPU")


def _build(case: Case, tmp: Path) -> Path:
    """Write the case's files into ``tmp`` (the working directory); return the experiment
    file's path (relative, as a user types it)."""
    experiment = case.experiment
    if callable(experiment):
        experiment = experiment(tmp)
    if isinstance(experiment, dict):
        (tmp / case.file).write_text(yaml.safe_dump(experiment, sort_keys=False))
    elif isinstance(experiment, str):
        (tmp / case.file).write_text(experiment)
    return Path(case.file)


def _listing(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


class Reached(AssertionError):
    """A guarded function was called: the bad input got too far."""


@pytest.fixture
def guarded(monkeypatch):
    """Ray, MLflow and Optuna entry points that a rejected input must never reach."""
    import mlflow.tracking
    import optuna
    import ray

    hits: list[str] = []

    def guard(name: str):
        def reached(*args, **kwargs):
            hits.append(name)
            raise Reached(f"{name} reached")

        return reached

    monkeypatch.setattr(ray, "init", guard("ray.init"))
    client = mlflow.tracking.MlflowClient
    monkeypatch.setattr(client, "create_experiment", guard("MlflowClient.create_experiment"))
    monkeypatch.setattr(client, "create_run", guard("MlflowClient.create_run"))
    monkeypatch.setattr(optuna, "create_study", guard("optuna.create_study"))
    monkeypatch.setattr(optuna.storages.RDBStorage, "__init__", guard("optuna RDBStorage"))
    # opening a sqlite MLflow store creates its file (mlflow.db); MLflow caches the engine per
    # URI, so a fresh map makes every case open its own, as a new process would
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    monkeypatch.setattr(SqlAlchemyStore, "_engine_map", {})
    monkeypatch.setattr(SqlAlchemyStore, "__init__", guard("MLflow SqlAlchemyStore (mlflow.db)"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return hits


def _check_result(result, case: Case, before: set[str], tmp: Path, hits: list[str]) -> str:
    assert not hits, f"{case.id}: reached {hits}"
    assert isinstance(result.exception, SystemExit), (
        f"{case.id}: {result.exception!r}\n{result.output}"
    )
    assert result.exit_code == 2, f"{case.id}: exit {result.exit_code}\n{result.output}"
    errors = result.stderr.splitlines()
    assert len(errors) == 1 and errors[0].startswith("error: "), (
        f"{case.id}: stderr is not one error line:\n{result.stderr}"
    )
    line = errors[0]
    # stdout may hold tune's progress ("Preparing task ..."), nothing else
    others = [
        x for x in result.stdout.splitlines() if x.strip() and not x.startswith("Preparing task")
    ]
    assert not others, f"{case.id}: unexpected output {others}"
    assert "Traceback" not in result.output
    for part in case.expect:
        assert part in line, f"{case.id}: {part!r} not in {line!r}"
    assert _listing(tmp) == before, f"{case.id}: created {_listing(tmp) - before}"
    return line


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_line_exit_2_and_touches_nothing(case, tmp_path, monkeypatch, guarded):
    _skip_if_unrunnable(case)
    monkeypatch.chdir(tmp_path)
    space = _build(case, tmp_path)
    before = _listing(tmp_path)
    runner = CliRunner()
    result = runner.invoke(main, ["tune", "--space", str(space), *case.args])
    line = _check_result(result, case, before, tmp_path, guarded)
    if case.data or case.tune_only:
        return
    # the same line from `raypeft validate`
    again = runner.invoke(main, ["validate", str(space), *case.args])
    assert _check_result(again, case, before, tmp_path, guarded) == line


def test_validate_checks_resources_only_for_a_local_tune(tmp_path, monkeypatch, guarded):
    """`validate --address` (a cluster file on a laptop) does not hold it to this machine."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(exp(resources={"cpus_per_worker": CPUS + 1})))
    runner = CliRunner()
    local = runner.invoke(main, ["validate", "exp.yaml"])
    assert local.exit_code == 2 and "resources.cpus_per_worker" in local.stderr
    remote = runner.invoke(main, ["validate", "exp.yaml", "--address", "ray://head:10001"])
    assert remote.exit_code == 0, remote.output
    assert "resources not checked" in remote.stdout


# ----------------------------------------------------------------------------- resources


def _cfg(**resources):
    from raypeft.config.schema import ExperimentConfig

    return ExperimentConfig.model_validate(exp(resources=resources, train__batch_size=12))


@pytest.mark.parametrize(
    "resources,nodes,expect",
    [
        ({"use_gpu": True}, [{"CPU": 8, "GPU": 0}], "resources.use_gpu"),
        ({"cpus_per_worker": 4}, [{"CPU": 2}, {"CPU": 3}], "`cpus_per_worker <= 3` must hold"),
        # 3 workers of 2 CPUs: 5 CPUs in all would not do, and 2 + 3 CPU nodes hold only 2
        (
            {"workers_per_trial": 3, "cpus_per_worker": 2},
            [{"CPU": 3}, {"CPU": 3}],
            "each worker on one node",
        ),
        (
            {"workers_per_trial": 2, "use_gpu": True},
            [{"CPU": 8, "GPU": 1}],
            "`workers_per_trial <= 1` must hold",
        ),
        (
            {"workers_per_trial": 2, "use_gpu": True},
            [{"CPU": 8, "GPU": 0}, {"CPU": 0.5, "GPU": 2}],
            "no node of the cluster has both",
        ),
    ],
)
def test_check_fits_rejects(resources, nodes, expect):
    from raypeft.errors import ConfigError
    from raypeft.search.resources import check_fits

    with pytest.raises(ConfigError) as info:
        check_fits(_cfg(**resources), nodes, where="the cluster")
    assert expect in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    "resources,nodes",
    [
        ({}, [{"CPU": 1}]),
        ({"workers_per_trial": 4, "cpus_per_worker": 2}, [{"CPU": 4}, {"CPU": 4}]),
        ({"workers_per_trial": 2, "use_gpu": True}, [{"CPU": 2, "GPU": 1}, {"CPU": 2, "GPU": 1}]),
        ({"cpus_per_worker": 0.5, "workers_per_trial": 3}, [{"CPU": 1.5}]),
    ],
)
def test_check_fits_accepts(resources, nodes):
    from raypeft.search.resources import check_fits

    check_fits(_cfg(**resources), nodes)


def test_local_nodes_describe_this_machine():
    from raypeft.search.resources import local_nodes

    (node,) = local_nodes()
    assert node["CPU"] == CPUS and node["GPU"] >= 0


# ----------------------------------------------------------------------------- subprocesses


SUBPROCESS_CASES = [
    "unknown-nested-key",
    "set-without-equals",
    "worker-needs-more-cpus-than-the-machine",
    "one-class-training-set",  # fails after tune imported Ray, MLflow and Optuna
]


def test_ray_tmpdir_is_where_ray_would_start(tmp_path, monkeypatch):
    """The subprocess cases watch RAY_TMPDIR: make sure Ray puts its session there."""
    from ray._common.utils import get_default_ray_temp_dir

    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "raytmp"))
    assert get_default_ray_temp_dir() == str(tmp_path / "raytmp" / "ray")


@pytest.mark.parametrize("case_id", SUBPROCESS_CASES)
def test_bad_input_in_a_real_process(case_id, tmp_path):
    case = next(c for c in CASES if c.id == case_id)
    work = tmp_path / "work"
    work.mkdir()
    ray_tmp = tmp_path / "raytmp"
    old = Path.cwd()
    os.chdir(work)  # builders write relative to the working directory
    try:
        space = _build(case, work)
    finally:
        os.chdir(old)
    before = _listing(work)
    env = dict(
        os.environ,
        RAY_TMPDIR=str(ray_tmp),
        RAY_USAGE_STATS_ENABLED="0",
        MLFLOW_DISABLE_TELEMETRY="true",
        HF_HUB_OFFLINE="1",
    )
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.run(
        [str(RAYPEFT), "tune", "--space", str(space), *case.args],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = proc.stderr.splitlines()
    assert len(errors) == 1 and errors[0].startswith("error: "), proc.stderr[-3000:]
    for part in case.expect:
        assert part in errors[0]
    assert not ray_tmp.exists(), "a Ray session was started"
    assert _listing(work) == before


def test_cluster_nodes_count_what_the_autoscaler_can_launch(tmp_path, monkeypatch):
    """On a `ray up` head, GPU workers may not exist yet: the launcher file's node types
    (~/ray_bootstrap_config.yaml) count as nodes the cluster can provide."""
    import ray

    from raypeft.search.resources import check_fits, cluster_nodes

    head = {"NodeID": "h", "Alive": True, "Resources": {"CPU": 0.0, "memory": 1e9}}
    gone = {"NodeID": "x", "Alive": False, "Resources": {"CPU": 64.0, "GPU": 8.0}}
    monkeypatch.setattr(ray, "nodes", lambda: [head, gone])
    missing = tmp_path / "none.yaml"
    assert cluster_nodes(str(missing)) == [{"CPU": 0.0, "memory": 1e9}]
    with pytest.raises(Exception, match="resources.use_gpu"):
        check_fits(_cfg(use_gpu=True), cluster_nodes(str(missing)), where="the cluster")

    launcher = tmp_path / "ray_bootstrap_config.yaml"
    launcher.write_text(
        yaml.safe_dump(
            {
                "available_node_types": {
                    "head": {"resources": {"CPU": 0, "GPU": 0}, "max_workers": 0},
                    "gpu_1x": {"resources": {"CPU": 4, "GPU": 1}, "max_workers": 2},
                }
            }
        )
    )
    nodes = cluster_nodes(str(launcher))
    assert nodes.count({"CPU": 4.0, "GPU": 1.0}) == 2
    check_fits(_cfg(use_gpu=True, workers_per_trial=2), nodes, where="the cluster")
    with pytest.raises(Exception, match="workers_per_trial"):
        check_fits(_cfg(use_gpu=True, workers_per_trial=3), nodes, where="the cluster")
