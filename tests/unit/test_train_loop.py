"""The shared training loop on tiny-bert with a synthetic tokenised task."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import raypeft.train as train_mod
from raypeft.config import ExperimentConfig, ModelConfig, SearchConfig, TrainConfig
from raypeft.data.tasks import TaskSpec
from raypeft.data.tokenize import TokenizedTask
from raypeft.methods.dept import DePTConfig
from raypeft.methods.prompt_tuning import PromptTuningConfig
from raypeft.model import TRAINABLE_FILE
from raypeft.train import (
    CONFIG_FILE,
    TASK_FILE,
    NonFiniteLossError,
    evaluate,
    load_checkpoint,
    split_dataset,
    train,
)

S = 16


def synthetic_split(n: int, seed: int) -> dict[str, np.ndarray]:
    """Random tokens; the label is given by the token right after [CLS] (2000 or 3000)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n)
    ids = rng.integers(1000, 5000, (n, S))
    ids[:, 0], ids[:, 1] = 101, np.where(labels == 1, 3000, 2000)
    real = rng.integers(6, S + 1, n)  # ragged lengths, then [SEP] and padding
    mask = (np.arange(S)[None, :] < real[:, None]).astype(np.int64)
    ids[np.arange(n), real - 1] = 102
    ids = np.where(mask == 1, ids, 0)
    return {
        "input_ids": ids.astype(np.int64),
        "attention_mask": mask,
        "token_type_ids": np.zeros((n, S), np.int64),
        "labels": labels.astype(np.int64),
    }


@pytest.fixture(scope="module")
def task() -> TokenizedTask:
    spec = TaskSpec("synthetic", "text", num_labels=2, metrics=("accuracy", "macro_f1"))
    return TokenizedTask(
        spec=spec,
        label_names=None,
        splits={
            "train": synthetic_split(64, 0),
            "validation": synthetic_split(24, 1),
            "test": synthetic_split(24, 2),
        },
    )


def experiment(method=None, **train_kw) -> ExperimentConfig:
    train_kw = {
        "max_steps": 30,
        "eval_every": 10,
        "batch_size": 8,
        "eval_batch_size": 16,
        "head_lr": 1e-2,
        **train_kw,
    }
    return ExperimentConfig(
        name="unit",
        model=ModelConfig(name="tiny-bert", max_length=S),
        method=method or PromptTuningConfig(prompt_length=4, lr=0.05),
        train=TrainConfig(**train_kw),
    )


class Recorder:
    """A ``report`` callback keeping every metrics dict and a copy of each checkpoint."""

    def __init__(self, root: Path):
        self.root, self.calls = root, []

    def __call__(self, metrics: dict, folder: Path | None) -> None:
        copy = None
        if folder is not None:
            assert folder.is_dir()
            copy = self.root / f"ckpt-{len(self.calls)}"
            shutil.copytree(folder, copy)
        self.calls.append((dict(metrics), copy))

    @property
    def checkpoints(self) -> list[Path]:
        return [c for _, c in self.calls if c is not None]


@pytest.mark.parametrize(
    "method",
    [
        PromptTuningConfig(prompt_length=4, lr=0.05),
        DePTConfig(prompt_length=4, budget_prompt_length=10, lr_prompt=0.05, lr_lowrank=0.01),
    ],
    ids=["pt", "dept-budget"],
)
def test_train_reports_and_checkpoints_best(tmp_path, task, method):
    cfg = experiment(method)
    rec = Recorder(tmp_path)
    best = train(cfg, task, rec)

    assert [m["step"] for m, _ in rec.calls] == [10, 20, 30]
    for metrics, _ in rec.calls:
        for key in (
            "val_accuracy",
            "val_macro_f1",
            "val_loss",
            "val_samples_per_s",
            "train_loss",
            "train_samples_per_s",
            "epoch",
            "best_val_accuracy",
            "best_step",
        ):
            assert key in metrics, key
        assert np.isfinite(metrics["train_loss"]) and metrics["train_samples_per_s"] > 0
    # 64 examples / batch 8 = 8 steps per epoch
    assert [m["epoch"] for m, _ in rec.calls] == [1, 2, 3]

    # a checkpoint exactly when the validation accuracy improved (strictly)
    running = -np.inf
    for metrics, ckpt in rec.calls:
        improved = metrics["val_accuracy"] > running
        assert (ckpt is not None) == improved, rec.calls
        running = max(running, metrics["val_accuracy"])
        assert metrics["best_val_accuracy"] == running
    assert rec.calls[0][1] is not None  # the first evaluation always counts
    last_best = rec.calls[-1][0]
    assert best == {k[len("best_") :]: v for k, v in last_best.items() if k.startswith("best_")}

    ckpt = rec.checkpoints[-1]
    files = sorted(p.name for p in ckpt.iterdir())
    assert files == sorted([CONFIG_FILE, TASK_FILE, TRAINABLE_FILE])
    saved = yaml.safe_load((ckpt / CONFIG_FILE).read_text())
    assert saved["method"]["name"] == method.name and saved["train"]["max_steps"] == 30
    if isinstance(method, DePTConfig):
        assert saved["method"]["rank"] == 4  # the derived rank is recorded

    # the checkpoint rebuilds a model scoring exactly the best validation metrics
    cfg2, model = load_checkpoint(ckpt, task)
    assert cfg2.method.resolve(model.dims) == cfg.method.resolve(model.dims)
    val_set = split_dataset(task, cfg2, "validation")
    val = evaluate(model, val_set, task.spec.metrics, 16, torch.device("cpu"))
    assert val["accuracy"] == best["val_accuracy"]
    assert val["macro_f1"] == best["val_macro_f1"]
    assert val["loss"] == pytest.approx(best["val_loss"], rel=1e-6)


def test_train_is_deterministic(tmp_path, task):
    cfg = experiment(max_steps=10, eval_every=10)
    a, b = Recorder(tmp_path / "a"), Recorder(tmp_path / "b")
    train(cfg, task, a)
    train(cfg, task, b)
    keys = ["val_loss", "val_accuracy", "train_loss"]
    assert [[m[k] for k in keys] for m, _ in a.calls] == [[m[k] for k in keys] for m, _ in b.calls]


def test_final_step_is_evaluated_when_not_a_multiple(tmp_path, task):
    rec = Recorder(tmp_path)
    train(experiment(max_steps=12, eval_every=5), task, rec)
    assert [m["step"] for m, _ in rec.calls] == [5, 10, 12]


@pytest.mark.parametrize(
    "mode,values,expected",
    [
        ("max", [0.5, 0.4, 0.7], [True, False, True]),
        ("max", [0.5, 0.5, 0.5], [True, False, False]),  # ties do not count as improvement
        ("min", [0.5, 0.4, 0.7], [True, True, False]),
    ],
)
def test_checkpoint_only_on_improvement_scripted(
    tmp_path, task, monkeypatch, mode, values, expected
):
    scripted = iter(values)

    def fake_evaluate(model, arrays, metric_names, batch_size, device):
        return {"accuracy": next(scripted), "macro_f1": 0.0, "loss": 1.0, "samples_per_s": 1.0}

    monkeypatch.setattr(train_mod, "evaluate", fake_evaluate)
    cfg = experiment().model_copy(update={"search": SearchConfig(mode=mode)})
    rec = Recorder(tmp_path)
    best = train(cfg, task, rec)
    assert [c is not None for _, c in rec.calls] == expected
    want = max(values) if mode == "max" else min(values)
    assert best["val_accuracy"] == want
    assert best["step"] == 10 * (values.index(want) + 1)
    assert [m["best_val_accuracy"] for m, _ in rec.calls][-1] == want


def test_search_metric_selects_what_improves(tmp_path, task, monkeypatch):
    scripted = iter([(0.5, 0.2), (0.6, 0.1), (0.4, 0.3)])  # (accuracy, macro_f1)

    def fake_evaluate(model, arrays, metric_names, batch_size, device):
        acc, f1 = next(scripted)
        return {"accuracy": acc, "macro_f1": f1, "loss": 1.0, "samples_per_s": 1.0}

    monkeypatch.setattr(train_mod, "evaluate", fake_evaluate)
    cfg = experiment().model_copy(update={"search": SearchConfig(metric="macro_f1")})
    rec = Recorder(tmp_path)
    best = train(cfg, task, rec)
    assert [c is not None for _, c in rec.calls] == [True, False, True]
    assert best["val_macro_f1"] == 0.3 and best["val_accuracy"] == 0.4


def test_huge_learning_rate_raises_non_finite(task):
    # lr 1e30 on the prompt: the embeddings overflow in the first update -> NaN loss at step 2
    cfg = experiment(PromptTuningConfig(prompt_length=4, lr=1e30), warmup_ratio=0.0)
    calls = []
    with pytest.raises(NonFiniteLossError, match=r"training loss is nan at step 2"):
        train(cfg, task, lambda m, c: calls.append(m))
    assert calls == []


def test_non_finite_loss_injected(task, monkeypatch):
    import raypeft.model as model_mod

    real_loss = model_mod.head_loss
    count = {"n": 0}

    def head_loss(logits, labels):
        count["n"] += 1
        loss = real_loss(logits, labels)
        return loss * float("inf") if count["n"] == 4 else loss

    monkeypatch.setattr(model_mod, "head_loss", head_loss)
    with pytest.raises(NonFiniteLossError, match=r"training loss is inf at step 4"):
        train(experiment(), task, lambda m, c: None)


def test_batch_larger_than_training_set(task):
    cfg = experiment(batch_size=128, max_steps=10, eval_every=10)
    with pytest.raises(ValueError, match="batch_size=128 exceeds the training set"):
        train(cfg, task, lambda m, c: None)


def test_regression_task(tmp_path):
    def split(n, seed):
        return {
            **synthetic_split(n, seed),
            "labels": np.random.default_rng(seed).normal(size=n).astype(np.float32),
        }

    spec = TaskSpec(
        "synthetic-reg",
        "text",
        problem="regression",
        num_labels=1,
        metrics=("pearson", "spearmanr"),
    )
    reg = TokenizedTask(
        spec, None, {"train": split(32, 0), "validation": split(16, 1), "test": split(16, 2)}
    )
    rec = Recorder(tmp_path)
    best = train(experiment(max_steps=8, eval_every=4), reg, rec)
    assert [m["step"] for m, _ in rec.calls] == [4, 8]
    assert {"val_pearson", "val_spearmanr", "val_loss"} <= set(best)
    assert all(np.isfinite(m["val_loss"]) for m, _ in rec.calls)
