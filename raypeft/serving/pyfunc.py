"""A trained trial as an MLflow ``python_function`` model at run time
(``mlflow.pyfunc.load_model``, ``mlflow models serve``), wrapping raypeft's own
:class:`~raypeft.serving.predict.Predictor`.

:mod:`raypeft.tracking.models` logs such models and describes their inputs and outputs;
:mod:`raypeft.serving.pyfunc_model` is the code file MLflow loads, naming the class here.
"""

from __future__ import annotations

from typing import Any

import mlflow.pyfunc
import pandas as pd

from raypeft.serving.predict import Predictor, prediction_row
from raypeft.tracking.models import DEFAULT_BATCH_SIZE, MODEL_ARTIFACT, output_columns


class RaypeftPyfunc(mlflow.pyfunc.PythonModel):
    """``mlflow.pyfunc`` wrapper of :class:`Predictor`, named by
    :data:`raypeft.tracking.models.MODEL_CODE` (raypeft must be importable where the model is
    loaded)."""

    def load_context(self, context) -> None:
        """Rebuild the trained model from the ``raypeft_model`` artefact."""
        import torch  # why: loaded with the model, not when MLflow imports the code

        device = "cuda" if torch.cuda.is_available() else "cpu"  # as `raypeft predict`
        self.predictor = Predictor.from_folder(context.artifacts[MODEL_ARTIFACT], device=device)

    def predict(
        self, context, model_input: pd.DataFrame, params: dict[str, Any] | None = None
    ) -> pd.DataFrame:
        """One row per input row: what ``raypeft predict`` prints, batch by batch."""
        batch_size = int((params or {}).get("batch_size") or DEFAULT_BATCH_SIZE)
        records = input_records(model_input, self.predictor.text_pair)
        rows: list[dict[str, Any]] = []
        for batch in self.predictor.predict_batches(records, batch_size=batch_size):
            rows.extend(prediction_row(p, self.predictor) for p in batch)
        return pd.DataFrame(rows, columns=output_columns(self.predictor.meta))


def input_records(model_input: Any, text_pair: bool) -> list[tuple[str, str | None]]:
    """``(text, pair)`` per row of a DataFrame with ``text`` (and ``text_pair``) columns; a
    plain list of texts is taken as the ``text`` column."""
    frame = model_input
    if not isinstance(frame, pd.DataFrame):
        if isinstance(frame, (list, tuple)) and all(isinstance(t, str) for t in frame):
            frame = pd.DataFrame({"text": list(frame)})
        else:
            frame = pd.DataFrame(frame)
    if "text" not in frame.columns:
        raise ValueError(f"the input needs a `text` column; got columns {list(frame.columns)}")
    if text_pair and "text_pair" not in frame.columns:
        raise ValueError("this model reads text pairs: the input needs a `text_pair` column")
    if not text_pair and "text_pair" in frame.columns and frame["text_pair"].notna().any():
        raise ValueError("this model reads single texts: drop the `text_pair` column")
    columns = ["text", "text_pair"] if text_pair else ["text"]
    for column in columns:
        for row, value in enumerate(frame[column]):
            if not isinstance(value, str):
                raise ValueError(f"row {row}: `{column}` must be a string, got {value!r}")
    texts = frame["text"].tolist()
    pairs = frame["text_pair"].tolist() if text_pair else [None] * len(texts)
    return list(zip(texts, pairs, strict=True))
