"""Metrics from raw head outputs, against values computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from raypeft.data.metrics import INVALID_NUMBER, METRIC_MODE, METRICS, NO_CLASS, compute_metrics

# argmax -> preds [1, 0, 1, 1, 0, 0]; labels [1, 0, 0, 1, 1, 0]: TP=2, TN=2, FP=1, FN=1
LOGITS = np.array([[0.1, 0.9], [2.0, -1.0], [0.0, 0.5], [-3.0, 3.0], [0.7, 0.6], [1.0, 0.0]])
LABELS = np.array([1, 0, 0, 1, 1, 0])


def test_classification_metrics_by_hand():
    got = compute_metrics(("accuracy", "f1", "macro_f1", "matthews_correlation"), LOGITS, LABELS)
    assert list(got) == ["accuracy", "f1", "macro_f1", "matthews_correlation"]
    assert got["accuracy"] == pytest.approx(4 / 6)
    assert got["f1"] == pytest.approx(2 * 2 / (2 * 2 + 1 + 1))  # 2TP / (2TP + FP + FN)
    assert got["macro_f1"] == pytest.approx(2 / 3)  # both classes: 4/6
    # (TP·TN − FP·FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)) = 3 / 9
    assert got["matthews_correlation"] == pytest.approx(1 / 3)
    assert all(isinstance(v, float) for v in got.values())


def test_multiclass_accuracy_uses_argmax():
    logits = np.array([[0.1, 0.2, 0.7], [0.9, 0.05, 0.05], [0.2, 0.5, 0.3], [0.3, 0.3, 0.4]])
    assert compute_metrics(("accuracy",), logits, np.array([2, 0, 0, 2])) == {"accuracy": 0.75}


def test_matthews_perfect_and_inverted():
    labels = np.array([0, 1, 0, 1])
    right = np.eye(2)[labels]
    assert compute_metrics(("matthews_correlation",), right, labels)[
        "matthews_correlation"
    ] == pytest.approx(1.0)
    assert compute_metrics(("matthews_correlation",), right[:, ::-1], labels)[
        "matthews_correlation"
    ] == pytest.approx(-1.0)


def test_regression_metrics_by_hand():
    preds = np.array([[1.0], [2.0], [3.0], [4.0]])  # one column: used as the value
    labels = np.array([2.0, 4.0, 9.0, 5.0])
    got = compute_metrics(("pearson", "spearmanr"), preds, labels)
    # deviations p: [-1.5, -0.5, 0.5, 1.5], y: [-3, -1, 4, 0]: cov 7, Σp² 5, Σy² 26
    assert got["pearson"] == pytest.approx(7 / math.sqrt(5 * 26))
    # ranks y [1, 2, 4, 3]: Σd² = 2, ρ = 1 − 6·2 / (4·(16−1))
    assert got["spearmanr"] == pytest.approx(0.8)


def test_correlation_of_constant_predictions_is_zero():
    preds = np.full((5, 1), 0.3)
    got = compute_metrics(("pearson", "spearmanr"), preds, np.arange(5.0))
    assert got == {"pearson": 0.0, "spearmanr": 0.0}


def test_task_metrics_are_maximised_and_loss_minimised():
    assert set(METRIC_MODE) == set(METRICS) | {"loss"}
    assert {METRIC_MODE[name] for name in METRICS} == {"max"}
    assert METRIC_MODE["loss"] == "min"


def test_metrics_equal_scikit_learn_and_scipy():
    """The numpy metrics give scikit-learn's and SciPy's values (they need neither)."""
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    for case in range(200):
        n, k = int(rng.integers(2, 60)), int(rng.integers(2, 5))
        labels = rng.integers(0, k, n)
        preds = rng.integers(-1 if case % 2 else 0, k, n)  # -1: a generated "no class"
        assert METRICS["accuracy"](preds, labels) == sklearn_metrics.accuracy_score(labels, preds)
        # no class: the opposite of its target for F1 (DePT's f1_score_with_invalid)
        flipped = np.where(preds == NO_CLASS, np.where(labels == 1, 0, 1), preds)
        assert METRICS["f1"](preds, labels) == sklearn_metrics.f1_score(
            labels, flipped, labels=[1], average="micro", zero_division=0
        )
        assert METRICS["macro_f1"](preds, labels) == sklearn_metrics.f1_score(
            labels, preds, labels=np.unique(labels), average="macro", zero_division=0
        )
        assert METRICS["matthews_correlation"](preds, labels) == pytest.approx(
            sklearn_metrics.matthews_corrcoef(labels, preds), abs=1e-12
        )
        outputs = rng.normal(size=n).astype(np.float32)
        targets = np.round(rng.normal(size=n), 0 if case % 3 else 2)  # ties for the ranks
        if np.std(targets) > 0:
            assert METRICS["pearson"](outputs, targets) == pytest.approx(
                float(stats.pearsonr(outputs, targets)[0]), abs=1e-12
            )
            assert METRICS["spearmanr"](outputs, targets) == pytest.approx(
                float(stats.spearmanr(outputs, targets)[0]), abs=1e-12
            )


# ----------------------------------------------------------------------------- invalid outputs
# A seq2seq model's text that names no class (NO_CLASS) or is no number (NaN) is wrong in
# every metric, as DePT's official code (src/metrics.py) counts it.


def test_no_class_is_a_false_positive_for_f1_where_the_target_is_negative():
    labels = np.array([1, 1, 0, 0])
    right = np.array([1, 1, 0, 0])
    # before the fix a no-class answer to a negative target cost F1 nothing: it is an error
    # like the positive answer it becomes (f1_score_with_invalid), F1 = 2·2 / (2·2 + 1 + 0)
    assert METRICS["f1"](np.array([1, 1, NO_CLASS, 0]), labels) == pytest.approx(4 / 5)
    assert METRICS["f1"](np.array([1, 1, 1, 0]), labels) == pytest.approx(4 / 5)
    # and a false negative where the target is positive: 2·1 / (2·1 + 0 + 1)
    assert METRICS["f1"](np.array([NO_CLASS, 1, 0, 0]), labels) == pytest.approx(2 / 3)
    assert METRICS["f1"](right, labels) == 1.0
    assert METRICS["f1"](np.full(4, NO_CLASS), labels) == 0.0


def test_no_class_is_wrong_for_accuracy_macro_f1_and_matthews():
    labels = np.array([0, 1, 0, 1, 2, 2])
    right = labels.copy()
    for target in range(len(labels)):
        one_invalid = right.copy()
        one_invalid[target] = NO_CLASS
        got = compute_metrics(("accuracy", "macro_f1", "matthews_correlation"), one_invalid, labels)
        assert got["accuracy"] == pytest.approx(5 / 6)
        assert got["macro_f1"] < 1.0 and got["matthews_correlation"] < 1.0
    nothing = compute_metrics(
        ("accuracy", "macro_f1", "matthews_correlation"), np.full(6, NO_CLASS), labels
    )
    assert nothing == {"accuracy": 0.0, "macro_f1": 0.0, "matthews_correlation": 0.0}


def test_no_class_scores_as_a_wrong_class_for_accuracy_and_f1():
    """For accuracy and F1, answering nothing is exactly as bad as answering the wrong class
    (macro F1 counts it as a miss of its true class only, as DePT's f1_multiclass does)."""
    rng = np.random.default_rng(1)
    for _ in range(300):
        n = int(rng.integers(3, 20))
        labels = rng.integers(0, 2, n)
        preds = rng.integers(0, 2, n)
        i = int(rng.integers(n))
        invalid, wrong = preds.copy(), preds.copy()
        invalid[i], wrong[i] = NO_CLASS, 1 - labels[i]
        names = ("accuracy", "f1")
        assert compute_metrics(names, invalid, labels) == compute_metrics(names, wrong, labels)


def test_f1_equals_the_official_f1_score_with_invalid():
    """scikit-learn's F1 after DePT's flip: a prediction other than 0/1 becomes 1 - target."""
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(2)
    for _ in range(200):
        n = int(rng.integers(2, 40))
        labels = rng.integers(0, 2, n)
        preds = rng.integers(-1, 2, n)
        flipped = np.where(preds == NO_CLASS, 1 - labels, preds)
        assert METRICS["f1"](preds, labels) == sklearn_metrics.f1_score(
            labels, flipped, zero_division=0
        )


def test_generated_number_that_is_not_one_scores_minus_one():
    labels = np.array([0.0, 1.0, 2.0, 3.0, 4.0])
    preds = np.array([0.2, 1.0, np.nan, 3.2, 4.0], dtype=np.float32)
    got = compute_metrics(("pearson", "spearmanr"), preds, labels)
    as_minus_one = np.array([0.2, 1.0, INVALID_NUMBER, 3.2, 4.0], dtype=np.float32)
    assert got == compute_metrics(("pearson", "spearmanr"), as_minus_one, labels)
    # the mean of the parsed ones (2.1) would have kept the ranks perfect
    assert got["spearmanr"] < 1.0
    assert INVALID_NUMBER == -1.0  # string_to_float's default in DePT's code
    stats = pytest.importorskip("scipy.stats")
    assert got["pearson"] == pytest.approx(float(stats.pearsonr(as_minus_one, labels)[0]))
    every = compute_metrics(("pearson", "spearmanr"), np.full(5, np.nan, np.float32), labels)
    assert every == {"pearson": 0.0, "spearmanr": 0.0}  # constant -1: no correlation
