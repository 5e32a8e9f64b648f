"""How a seq2seq model answers a classification task (task.seq2seq_scoring), on the tiny T5.

``generate`` writes the label (text naming no class counts as wrong); ``rank`` scores every
class's verbalizer under the decoder and predicts the likeliest, so it always names a class.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from raypeft.config.schema import ExperimentConfig
from raypeft.data.metrics import NO_CLASS
from raypeft.data.tokenize import prepare_task
from raypeft.modeling.build import build_model
from raypeft.modeling.seq2seq_scoring import class_log_likelihoods, verbalizer_ids
from raypeft.training.checkpoints import load_checkpoint
from raypeft.training.datasets import split_dataset
from raypeft.training.evaluation import evaluate
from raypeft.training.loop import train

S = 16
TWEETS = {"name": "tweet_sentiment", "max_train_examples": 32, "max_eval_examples": 12}
# verbalizers of 3, 4 and 7 tokens in the borrowed BERT vocabulary ([CLS] ... [SEP])
UNEVEN = ["yes", "not sure", "not_entailment"]


def experiment(scoring: str, method: dict | None = None) -> ExperimentConfig:
    return ExperimentConfig.model_validate(
        {
            "name": "unit-seq2seq-scoring",
            "model": {"name": "tiny-t5", "max_length": S},
            "task": {**TWEETS, "max_test_examples": 8, "seq2seq_scoring": scoring},
            "method": method or {"name": "pt", "prompt_length": 4, "lr": 0.05},
            "train": {"max_steps": 4, "eval_every": 2, "batch_size": 8, "eval_batch_size": 8},
        }
    )


@pytest.fixture(scope="module")
def task():
    cfg = experiment("generate")
    return prepare_task(cfg.task, cfg.model)


def batch_of(task, cfg, split="validation", n=None) -> dict:
    dataset = split_dataset(task, cfg, split)
    return next(iter(DataLoader(dataset, batch_size=n or len(dataset))))


def test_default_is_generate_and_build_model_sets_the_mode(task):
    assert ExperimentConfig(name="x", method={"name": "pt"}).task.seq2seq_scoring == "generate"
    assert build_model(experiment("generate"), task).seq2seq_scoring == "generate"
    assert build_model(experiment("rank"), task).seq2seq_scoring == "rank"


def test_rank_score_is_the_log_likelihood_training_maximises(task):
    """Each class's score is the sum of its target tokens' log-probabilities, end token
    included: minus the model's own teacher-forced loss times the target's length."""
    cfg = experiment("rank", {"name": "dept", "prompt_length": 4, "budget_prompt_length": 8})
    model = build_model(cfg, task).eval()
    targets = verbalizer_ids(model.tokenizer, UNEVEN)
    assert sorted({len(t) for t in targets}) == [3, 4, 7]  # several tokens, uneven lengths
    batch = batch_of(task, cfg, n=6)
    inputs = model.backbone_inputs(batch["input_ids"], batch["attention_mask"])
    scores = class_log_likelihoods(model.backbone, inputs, targets)
    assert scores.shape == (6, 3) and scores.dtype == torch.float32
    assert (scores < 0).all()
    for c, ids in enumerate(targets):
        for i in range(6):
            out = model(
                input_ids=batch["input_ids"][i : i + 1],
                attention_mask=batch["attention_mask"][i : i + 1],
                target_ids=torch.tensor([ids]),
            )
            assert scores[i, c].item() == pytest.approx(-out.loss.item() * len(ids), abs=1e-4)


def test_rank_always_predicts_a_class_where_generation_may_not(task):
    cfg = experiment("rank")
    model = build_model(cfg, task).eval()  # untrained: generation writes noise
    batch = batch_of(task, cfg)
    generated = model.predict(**batch, scoring="generate")
    ranked = model.predict(**batch)
    assert (generated == NO_CLASS).any()  # an untrained tiny T5 names no class
    assert ranked.dtype == np.int64 and ranked.shape == generated.shape
    assert set(ranked.tolist()) <= {0, 1, 2}
    inputs = model.backbone_inputs(batch["input_ids"], batch["attention_mask"])
    targets = verbalizer_ids(model.tokenizer, task.verbalizers)
    expected = class_log_likelihoods(model.backbone, inputs, targets).argmax(-1).numpy()
    assert np.array_equal(ranked, expected)


def test_regression_keeps_generating(task):
    model = build_model(experiment("rank"), task).eval()
    model.verbalizers = None  # a regression task has no verbalizers: values are written
    batch = batch_of(task, experiment("rank"), n=4)
    out = model.predict(**batch)
    assert out.dtype == np.float32 and out.shape == (4,)


@pytest.mark.parametrize("scoring", ["generate", "rank"])
def test_evaluation_end_to_end(tmp_path, task, scoring):
    """The training loop evaluates in the configured mode; its checkpoint (what the test split
    and `raypeft predict` load) keeps it; rank's metrics count only real classes."""
    cfg = experiment(scoring)
    reports = []

    def report(metrics, checkpoint):
        reports.append(metrics)
        if checkpoint is not None:
            shutil.rmtree(tmp_path / "best", ignore_errors=True)
            shutil.copytree(checkpoint, tmp_path / "best")

    train(cfg, task, report)
    assert [r["step"] for r in reports] == [2, 4]
    for r in reports:
        assert 0.0 <= r["val_accuracy"] <= 1.0 and 0.0 <= r["val_macro_f1"] <= 1.0
    _, model = load_checkpoint(tmp_path / "best", task)
    assert model.seq2seq_scoring == scoring
    test_set = split_dataset(task, cfg, "test")
    scores = evaluate(model, test_set, task.spec.metrics, 8, torch.device("cpu"))
    preds = np.concatenate(
        [model.predict(**b) for b in DataLoader(test_set, batch_size=8)]
    )  # what evaluate() scored
    labels = task.splits["test"]["labels"]
    assert scores["accuracy"] == pytest.approx(float(np.mean(preds == labels)))
    if scoring == "rank":
        assert set(preds.tolist()) <= {0, 1, 2}
