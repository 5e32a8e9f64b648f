"""Evaluation metrics per task (DePT Appendix C conventions), on numpy predictions.

Plain numpy, computed as scikit-learn and SciPy compute them (``accuracy_score``,
``f1_score``, ``matthews_corrcoef``, ``pearsonr``, ``spearmanr``; the same values, Pearson's
to the last bit of float rounding): the training core runs on machines that have neither
(tests/unit/test_metrics.py compares the two where both are installed).

A seq2seq model's generated text may name no class, or be no number. Such an output is wrong
in every metric, as in DePT's official code (``src/metrics.py``, after T5's): a class
prediction that names no class (:data:`NO_CLASS`) never equals a label, so it costs accuracy,
macro F1 (a miss of the true class) and Matthews' correlation (a class of its own, never on
the diagonal), and for F1 it becomes the opposite of its target (``f1_score_with_invalid``: a
false positive where the target is negative, a false negative where it is positive); a
number that is not one (NaN) scores :data:`INVALID_NUMBER` (-1, ``string_to_float``'s
default: below STS-B's 0-5 range).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

NO_CLASS = -1  # a generated text that names no class
INVALID_NUMBER = -1.0  # the score of a generated regression output that is not a number


def _accuracy(preds: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(labels == preds))


def _f1_per_class(preds: np.ndarray, labels: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """``2·TP / (2·TP + FP + FN)`` of each class (0 where it has no true or predicted
    example); a prediction outside ``classes`` (a generated "no class", -1) is wrong."""
    hit = preds == labels
    tp = np.array([np.sum(hit & (labels == c)) for c in classes], dtype=np.float64)
    true = np.array([np.sum(labels == c) for c in classes], dtype=np.float64)
    predicted = np.array([np.sum(preds == c) for c in classes], dtype=np.float64)
    denom = true + predicted
    return np.divide(2 * tp, denom, out=np.zeros_like(tp), where=denom > 0)


def _f1(preds: np.ndarray, labels: np.ndarray) -> float:
    """F1 of class 1 (the positive class of binary GLUE tasks). A prediction that names no
    class is the opposite of its target (DePT's ``f1_score_with_invalid``): counted as class
    1 where the target is not, as another class where it is, so it is always an error."""
    invalid = preds == NO_CLASS
    if invalid.any():
        preds = np.where(invalid, np.where(labels == 1, 0, 1), preds)
    return float(_f1_per_class(preds, labels, np.array([1]))[0])


def _macro_f1(preds: np.ndarray, labels: np.ndarray) -> float:
    """Mean F1 over the classes present in ``labels``."""
    return float(np.mean(_f1_per_class(preds, labels, np.unique(labels))))


def _matthews(preds: np.ndarray, labels: np.ndarray) -> float:
    """Matthews correlation (the multiclass R_K statistic; 0 when undefined)."""
    classes = np.unique(np.concatenate([labels, preds]))
    true_index = np.searchsorted(classes, labels)
    pred_index = np.searchsorted(classes, preds)
    confusion = np.zeros((len(classes), len(classes)), dtype=np.int64)
    np.add.at(confusion, (true_index, pred_index), 1)
    t_sum = confusion.sum(axis=1, dtype=np.float64)
    p_sum = confusion.sum(axis=0, dtype=np.float64)
    n_correct = np.trace(confusion, dtype=np.float64)
    n = p_sum.sum()
    cov_ytyp = n_correct * n - np.dot(t_sum, p_sum)
    cov_ypyp = n**2 - np.dot(p_sum, p_sum)
    cov_ytyt = n**2 - np.dot(t_sum, t_sum)
    if cov_ypyp * cov_ytyt == 0:
        return 0.0
    return float(cov_ytyp / np.sqrt(cov_ypyp * cov_ytyt))


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    dtype = np.result_type(x.dtype, y.dtype)  # float32 outputs stay float32, as in SciPy
    if not np.issubdtype(dtype, np.floating):
        dtype = np.float64
    xm, ym = x.astype(dtype) - np.mean(x.astype(dtype)), y.astype(dtype) - np.mean(y.astype(dtype))
    # scaled by the largest deviation first, as SciPy does, so the norms cannot overflow
    xmax, ymax = np.max(np.abs(xm)), np.max(np.abs(ym))
    normx = xmax * np.linalg.norm(xm / xmax, axis=-1)
    normy = ymax * np.linalg.norm(ym / ymax, axis=-1)
    return float(np.clip(np.vecdot(xm / normx, ym / normy), -1.0, 1.0))


def _ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n, ties sharing their average rank."""
    order = np.argsort(values, kind="mergesort")
    inverse = np.empty(order.size, dtype=np.intp)
    inverse[order] = np.arange(order.size, dtype=np.intp)
    ordered = values[order]
    starts = np.r_[True, ordered[1:] != ordered[:-1]]
    dense = np.cumsum(starts)[inverse]
    bounds = np.r_[np.nonzero(starts)[0], len(starts)]
    return 0.5 * (bounds[dense] + bounds[dense - 1] + 1)


def _spearman(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.corrcoef(np.vstack([_ranks(x), _ranks(y)]))[1, 0])


def _corr(fn) -> Callable[[np.ndarray, np.ndarray], float]:
    def metric(preds: np.ndarray, labels: np.ndarray) -> float:
        if np.std(preds) == 0 or np.std(labels) == 0:
            return 0.0  # undefined for constant predictions; count it as no correlation
        return fn(preds, labels)

    return metric


METRICS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    # a generated "no class" prediction (NO_CLASS) is wrong in each (module docstring)
    "accuracy": _accuracy,
    "f1": _f1,
    "macro_f1": _macro_f1,
    "matthews_correlation": _matthews,
    "pearson": _corr(_pearson),
    "spearmanr": _corr(_spearman),
}

# Every metric above is better when larger; the evaluation loss is reported too.
METRIC_MODE = {**{name: "max" for name in METRICS}, "loss": "min"}

# How a score is written wherever a person reads one (``raypeft tune``'s summary, the model
# registry's notes, ``raypeft report``'s tables and figures): one place, so the report's
# heat map shows the 0.7075 the summary printed, not 0.708.
METRIC_DECIMALS = 4


def format_metric(value: float) -> str:
    """A metric's value as every summary writes it (``0.7075``)."""
    return f"{value:.{METRIC_DECIMALS}f}"


def compute_metrics(
    names: tuple[str, ...], outputs: np.ndarray, labels: np.ndarray
) -> dict[str, float]:
    """Metrics from model outputs.

    ``outputs`` is ``(n, labels)`` head outputs (argmax for classification, the value for a
    one-column regression head), or ``(n,)`` predictions already made: class ids from
    generated text (:data:`NO_CLASS` where it names none) or generated numbers (NaN where
    the text is not a number). Either invalid output counts as wrong (module docstring).
    """
    if outputs.ndim == 2:
        preds = outputs[:, 0] if outputs.shape[1] == 1 else outputs.argmax(-1)
    else:
        preds = outputs
        if np.issubdtype(preds.dtype, np.floating) and np.isnan(preds).any():
            preds = np.where(np.isnan(preds), INVALID_NUMBER, preds).astype(preds.dtype)
    return {name: METRICS[name](preds, labels) for name in names}
