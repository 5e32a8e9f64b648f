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
    "f1": lambda p, y: float(f1_score(y, p, average="binary")),
    "macro_f1": lambda p, y: float(f1_score(y, p, average="macro")),
    "matthews_correlation": lambda p, y: float(matthews_corrcoef(y, p)),
    "pearson": _corr(pearsonr),
    "spearmanr": _corr(spearmanr),
}

# Every metric above is better when larger; the evaluation loss is reported too.
METRIC_MODE = {**{name: "max" for name in METRICS}, "loss": "min"}


def compute_metrics(
    names: tuple[str, ...], logits: np.ndarray, labels: np.ndarray
) -> dict[str, float]:
    """Metrics from raw head outputs: argmax for classification, the value for regression."""
    preds = logits[:, 0] if logits.shape[1] == 1 else logits.argmax(-1)
    return {name: METRICS[name](preds, labels) for name in names}
