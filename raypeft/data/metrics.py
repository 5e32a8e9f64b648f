"""Evaluation metrics per task (DePT Appendix C conventions), on numpy predictions."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef


def _corr(fn) -> Callable[[np.ndarray, np.ndarray], float]:
    def metric(preds: np.ndarray, labels: np.ndarray) -> float:
        if np.std(preds) == 0 or np.std(labels) == 0:
            return 0.0  # undefined for constant predictions; count it as no correlation
        return float(fn(preds, labels)[0])

    return metric


METRICS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "accuracy": lambda p, y: float(accuracy_score(y, p)),
    # `labels=` keeps a generated "no class" prediction (-1) out of the classes averaged
    "f1": lambda p, y: float(f1_score(y, p, labels=[1], average="micro", zero_division=0)),
    "macro_f1": lambda p, y: float(
        f1_score(y, p, labels=np.unique(y), average="macro", zero_division=0)
    ),
    "matthews_correlation": lambda p, y: float(matthews_corrcoef(y, p)),
    "pearson": _corr(pearsonr),
    "spearmanr": _corr(spearmanr),
}

# Every metric above is better when larger; the evaluation loss is reported too.
METRIC_MODE = {**{name: "max" for name in METRICS}, "loss": "min"}


def compute_metrics(
    names: tuple[str, ...], outputs: np.ndarray, labels: np.ndarray
) -> dict[str, float]:
    """Metrics from model outputs.

    ``outputs`` is ``(n, labels)`` head outputs (argmax for classification, the value for a
    one-column regression head), or ``(n,)`` predictions already made: class ids from
    generated text (-1 counts as wrong) or generated numbers (NaN: not a number, scored as
    the mean of the parsed ones).
    """
    if outputs.ndim == 2:
        preds = outputs[:, 0] if outputs.shape[1] == 1 else outputs.argmax(-1)
    else:
        preds = outputs
        if np.issubdtype(preds.dtype, np.floating) and np.isnan(preds).any():
            fill = float(np.nanmean(preds)) if not np.isnan(preds).all() else 0.0
            preds = np.where(np.isnan(preds), fill, preds)
    return {name: METRICS[name](preds, labels) for name in names}
