"""Inference from saved artefacts (raypeft.serving.predict), the peft export
(raypeft.serving.export) and the ``predict`` / ``export`` commands on a synthetic MLflow
store (no Ray).

Models are trained for a few steps with ``raypeft.training.loop.train`` on tiny random backbones and
the packaged tweets; inference must give what ``PromptedModel.predict`` gives on the same
examples through the training path (tokenised task arrays, precomputed features).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from click.testing import CliRunner
from mlflow.tracking import MlflowClient
from packaging.version import Version
from torch.utils.data import DataLoader

from raypeft.cli.main import main
from raypeft.config.schema import ExperimentConfig
from raypeft.data.tokenize import prepare_task
from raypeft.errors import ConfigError, DamagedArtefact
from raypeft.modeling.prompted import TRAINABLE_FILE
from raypeft.serving.predict import UNMATCHED, Predictor, load_trained, tokenize_inputs
from raypeft.training.checkpoints import CONFIG_FILE, TASK_FILE, load_checkpoint
from raypeft.training.datasets import split_dataset
from raypeft.training.digests import DIGESTS_FILE
from raypeft.training.loop import train

S = 16
PT = {"name": "pt", "prompt_length": 4, "lr": 0.05}
DEPT = {"name": "dept", "prompt_length": 4, "budget_prompt_length": 8}
IDPG = {"name": "idpg", "prompt_length": 3, "generator_hidden": 8, "phm_n": 4}
PREFIX_KV = {"name": "prefix", "style": "kv", "prompt_length": 3}
# transformers 5.24 renamed the models' past_key_values argument cache; peft (0.21.2) still
# looks for past_key_values before it hands a model a PREFIX_TUNING prefix
RENAMED_CACHE = Version(transformers.__version__) >= Version("5.24")
IPT = {"name": "ipt", "prompt_length": 4, "placement": "deep", "lr": 0.05}
TWEETS = {"name": "tweet_sentiment", "max_train_examples": 32, "max_eval_examples": 20}


MEAN_HEAD = {"name": "tiny-bert", "head_pooling": "mean"}  # a model section with its name


def experiment(model: str | dict, method: dict, task: dict | None = None) -> ExperimentConfig:
    section = {"name": model} if isinstance(model, str) else model
    return ExperimentConfig.model_validate(
        {
            "name": "unit-inference",
            "model": {**section, "max_length": S},
            "task": {**TWEETS, "max_test_examples": 8} if task is None else task,
            "method": method,
            "train": {
                "max_steps": 4,
                "eval_every": 2,
                "batch_size": 8,
                "eval_batch_size": 8,
                "head_lr": 0.05,
            },
        }
    )


def train_to_folder(cfg: ExperimentConfig, folder: Path):
    """Train a few steps; the best checkpoint is copied to ``folder``. Returns the task."""
    task = prepare_task(cfg.task, cfg.model)

    def report(metrics, checkpoint):
        if checkpoint is not None:
            shutil.rmtree(folder, ignore_errors=True)
            shutil.copytree(checkpoint, folder)

    train(cfg, task, report)
    return task


def training_path_predictions(cfg, task, folder: Path, split: str = "validation") -> np.ndarray:
    """``PromptedModel.predict`` on the task's tokenised split (what evaluate() computes)."""
    _, model = load_checkpoint(folder, task)
    model.eval()
    dataset = split_dataset(task, cfg, split)
    return np.concatenate([model.predict(**b) for b in DataLoader(dataset, batch_size=8)])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Factory with a cache: (cfg, task, folder) of a model trained once per module."""
    cache = {}

    def make(model: str, method: dict, task: dict | None = None):
        key = json.dumps([model, method, task], sort_keys=True)
        if key not in cache:
            cfg = experiment(model, method, task)
            folder = tmp_path_factory.mktemp("trained") / "model"
            cache[key] = (cfg, train_to_folder(cfg, folder), folder)
        return cache[key]

    return make


@pytest.fixture(scope="module")
def pair_task_files(tmp_path_factory) -> dict:
    """A small pair task (files, string labels) on disk."""
    folder = tmp_path_factory.mktemp("pairs")
    rng = np.random.default_rng(0)
    words = "good bad fine great awful nice poor happy sad calm".split()
    files = {}
    for split, n in (("train", 24), ("validation", 12), ("test", 8)):
        path = folder / f"{split}.jsonl"
        with path.open("w") as out:
            for i in range(n):
                a = " ".join(rng.choice(words, 3))
                b = " ".join(rng.choice(words, 4))
                out.write(json.dumps({"s1": a, "s2": b, "y": ["no", "yes"][i % 2]}) + "\n")
        files[split] = str(path)
    return {
        "name": "files",
        "files": files,
        "text_column": "s1",
        "text_pair_column": "s2",
        "label_column": "y",
    }


# ----------------------------------------------------------------------------- inference


@pytest.mark.parametrize(
    "model, method",
    [
        ("tiny-bert", PT),
        ("tiny-bert", DEPT),
        ("tiny-bert", IDPG),
        ("tiny-bert", PREFIX_KV),
        ("tiny-bert", IPT),
        (MEAN_HEAD, PT),
        (MEAN_HEAD, IDPG),
        ("tiny-gpt2", PT),
        ("tiny-gpt2", IDPG),
        ("tiny-t5", DEPT),
    ],
    ids=lambda v: v if isinstance(v, str) else v["name"],
)
@pytest.mark.slow
def test_inference_equals_training_path(trained, model, method):
    cfg, task, folder = trained(model, method)
    expected = training_path_predictions(cfg, task, folder)
    predictor = Predictor.from_folder(folder)
    texts = task.texts["validation"]
    # another batch size than evaluation's: batches must not change anything
    batches = list(predictor.predict_batches(iter(texts), batch_size=7))
    assert [len(b) for b in batches] == [7, 7, 6]
    preds = [p for b in batches for p in b]
    assert [p.text for p in preds] == texts
    raw = np.concatenate([predictor.raw_predictions(texts[i : i + 7]) for i in (0, 7, 14)])
    if predictor.kind == "seq2seq":
        assert np.array_equal(raw, expected)
        for p, index in zip(preds, expected, strict=True):
            assert p.score is None and p.label_id == index
            assert p.label == (UNMATCHED if index < 0 else task.verbalizers[index])
        return
    np.testing.assert_allclose(raw, expected, atol=1e-5)
    probs = torch.as_tensor(expected).softmax(-1).numpy()
    assert [p.label_id for p in preds] == probs.argmax(-1).tolist()
    names = ["negative", "neutral", "positive"]  # the packaged tweets' class names
    assert task.label_names == names
    assert [p.label for p in preds] == [names[i] for i in probs.argmax(-1)]
    np.testing.assert_allclose([p.score for p in preds], probs.max(-1), atol=1e-5)


RANKED_TWEETS = {**TWEETS, "max_test_examples": 8, "seq2seq_scoring": "rank"}


def test_rank_scoring_names_a_class_for_every_text(trained):
    """task.seq2seq_scoring: rank travels with the model folder: `raypeft predict` and the
    pyfunc model (both a Predictor) rank the verbalizers as evaluation did."""
    cfg, task, folder = trained("tiny-t5", DEPT, RANKED_TWEETS)
    expected = training_path_predictions(cfg, task, folder)
    predictor = Predictor.from_folder(folder)
    assert predictor.model.seq2seq_scoring == "rank"
    texts = task.texts["validation"]
    preds = [p for b in predictor.predict_batches(texts, batch_size=7) for p in b]
    assert [p.label_id for p in preds] == expected.tolist()
    assert all(0 <= p.label_id < 3 and p.label == task.verbalizers[p.label_id] for p in preds)


def test_export_of_a_rank_scoring_model_compares_generation(trained, tmp_path):
    from raypeft.serving.export import export_peft

    _, _, folder = trained("tiny-t5", PT, RANKED_TWEETS)
    result = export_peft(folder, tmp_path / "adapter")  # peft can only generate
    assert "generated labels (greedy): equal" in "\n".join(result.checks)


@pytest.mark.parametrize("model", ["tiny-bert", "tiny-gpt2", "tiny-t5"])
def test_tokenisation_equals_prepare_task(trained, model):
    cfg, task, folder = trained(model, PT)
    _, _, built = load_trained(folder)
    arrays = tokenize_inputs(cfg, built.kind, task.texts["validation"])
    split = task.splits["validation"]
    assert set(arrays) == set(split) - {"labels", "target_ids"}
    for key, value in arrays.items():
        assert np.array_equal(value, split[key]), key
    assert arrays["input_ids"].shape[1] == S
    if model == "tiny-gpt2":  # left padding: the last position is a real token
        assert (arrays["attention_mask"][:, -1] == 1).all()


def test_pair_task_labels_and_inputs(trained, pair_task_files):
    cfg, task, folder = trained("tiny-bert", IDPG, pair_task_files)
    meta = json.loads((folder / TASK_FILE).read_text())
    assert meta["text_pair"] is True and meta["label_names"] == ["no", "yes"]
    expected = training_path_predictions(cfg, task, folder)
    predictor = Predictor.from_folder(folder)
    ds = task.splits["validation"]
    n = len(ds["labels"])
    import datasets

    raw = datasets.load_dataset("json", data_files=pair_task_files["files"]["validation"])["train"]
    texts, pairs = list(raw["s1"])[:n], list(raw["s2"])[:n]
    np.testing.assert_allclose(predictor.raw_predictions(texts, pairs), expected, atol=1e-5)
    preds = [p for b in predictor.predict_batches(texts, pairs, batch_size=5) for p in b]
    assert [p.label for p in preds] == [["no", "yes"][i] for i in expected.argmax(-1)]
    assert preds[0].text_pair == pairs[0]
    with pytest.raises(ValueError, match="text pairs"):
        predictor.predict(texts[:2])
    with pytest.raises(ValueError, match="text pairs"):
        next(predictor.predict_batches([(texts[0], pairs[0]), (texts[1], None)]))
    single = Predictor.from_folder(trained("tiny-bert", PT)[2])
    with pytest.raises(ValueError, match="single texts"):
        single.predict(texts[:2], pairs[:2])


def test_regression_returns_the_value(trained, tmp_path_factory):
    folder = tmp_path_factory.mktemp("regression")
    rng = np.random.default_rng(1)
    files = {}
    for split, n in (("train", 16), ("validation", 8)):
        path = folder / f"{split}.jsonl"
        path.write_text(
            "".join(
                json.dumps({"t": f"text {i} {rng.integers(100)}", "v": float(rng.random() * 5)})
                + "\n"
                for i in range(n)
            )
        )
        files[split] = str(path)
    task = {
        "name": "files",
        "files": files,
        "text_column": "t",
        "label_column": "v",
        "problem": "regression",
    }
    cfg, tokenized, model_folder = trained("tiny-bert", PT, task)
    expected = training_path_predictions(cfg, tokenized, model_folder)
    preds = Predictor.from_folder(model_folder).predict(tokenized.texts["validation"])
    values = [p.score for p in preds]
    np.testing.assert_allclose(values, expected[:, 0], atol=1e-5)
    assert preds[0].label == f"{values[0]:.4g}" and preds[0].label_id is None


@pytest.mark.parametrize("name", [TRAINABLE_FILE, CONFIG_FILE, TASK_FILE])
@pytest.mark.parametrize("fault", ["deleted", "truncated", "one byte changed"])
def test_a_missing_or_damaged_model_file_is_one_line_naming_it(trained, tmp_path, name, fault):
    _, task, folder = trained("tiny-bert", PT)
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    path = copy / name
    data = path.read_bytes()
    if fault == "deleted":
        path.unlink()
    elif fault == "truncated":  # an upload cut short
        path.write_bytes(data[: len(data) // 2])
    else:  # a bad disk: same size, one byte off
        path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    expected = "missing" if fault == "deleted" else "damaged"
    with pytest.raises(DamagedArtefact, match=f"^{re.escape(str(path))}: {expected}") as caught:
        Predictor.from_folder(copy)
    assert "\n" not in str(caught.value)
    if name != TASK_FILE:  # the test split's scoring reads the checkpoint (not task.json)
        with pytest.raises(DamagedArtefact, match=f"^{re.escape(str(path))}: {expected}"):
            load_checkpoint(copy, task)


@pytest.mark.parametrize("damage", ["deleted", "garbage"])
def test_a_folder_without_readable_digests_is_refused(trained, tmp_path, damage):
    _, _, folder = trained("tiny-bert", PT)
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    digests = copy / DIGESTS_FILE
    digests.unlink() if damage == "deleted" else digests.write_bytes(b"\x00{not json")
    problem = "missing" if damage == "deleted" else "unreadable"
    with pytest.raises(DamagedArtefact, match=f"digests.json: {problem}"):
        Predictor.from_folder(copy)
    with pytest.raises(DamagedArtefact, match="digests.json: missing"):
        Predictor.from_folder(tmp_path / "nothing here")


# ----------------------------------------------------------------------------- peft export


def peft_logits(out: Path, cfg, meta, batch) -> torch.Tensor:
    """Logits of the exported adapter, loaded by peft onto a fresh base model."""
    from peft import PeftModel

    from raypeft.modeling.backbones import load_backbone

    base = load_backbone(cfg.model, meta["num_labels"], meta["problem"], seed=cfg.train.seed)
    model = PeftModel.from_pretrained(base.model, str(out)).eval()
    with torch.no_grad():
        return model(**batch).logits


def test_export_pt_round_trip_through_peft(trained, tmp_path):
    from safetensors.torch import load_file

    from raypeft.serving.export import export_peft

    cfg, _, folder = trained("tiny-bert", PT)
    out = tmp_path / "adapter"
    result = export_peft(folder, out)
    assert sorted(p.name for p in out.iterdir()) == [
        "README.md",
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    assert [p.name for p in tmp_path.iterdir()] == ["adapter"]  # no staging folder left
    # every file as the umask makes a new file (safetensors alone would write 0600)
    umask = os.umask(0)
    os.umask(umask)
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in out.iterdir()} == {
        name: oct(0o666 & ~umask)
        for name in ("README.md", "adapter_config.json", "adapter_model.safetensors")
    }
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["peft_type"] == "PROMPT_TUNING" and config["task_type"] == "SEQ_CLS"
    assert config["num_virtual_tokens"] == 4 and config["token_dim"] == 32
    assert config["num_transformer_submodules"] == 1
    assert config["num_layers"] == 2 and config["num_attention_heads"] == 2
    assert config["base_model_name_or_path"] == "tiny-bert"
    assert config["modules_to_save"] == ["classifier"]
    tensors = load_file(str(out / "adapter_model.safetensors"))
    trainable = load_file(str(folder / "trainable.safetensors"))
    assert set(tensors) == {
        "prompt_embeddings",
        "base_model.classifier.weight",
        "base_model.classifier.bias",
    }
    assert torch.equal(tensors["prompt_embeddings"], trainable["method.prompt"])
    assert torch.equal(tensors["base_model.classifier.weight"], trainable["head.classifier.weight"])
    assert any("max |peft - raypeft|" in line for line in result.checks)
    # independently of the export's own check: peft's logits equal raypeft's (both in fp32:
    # peft runs the exported tensors in fp32, whatever train.precision resolved to here)
    predictor = Predictor.from_folder(folder, precision="fp32")
    texts = ["a fine day", "worst thing ever, really", "ok"]
    batch = predictor.inputs(texts)
    theirs = peft_logits(out, cfg, predictor.meta, batch)
    np.testing.assert_allclose(theirs.numpy(), predictor.raw_predictions(texts), atol=1e-5)


def card_snippet(out: Path) -> str:
    """The Python block of an exported adapter's model card."""
    card = (out / "README.md").read_text()
    return card.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.parametrize(
    "model",
    ["tiny-bert", {"name": "minilm", "head_pooling": "first"}, "tiny-gpt2"],
    ids=["tiny-bert", "minilm", "tiny-gpt2"],
)
@pytest.mark.slow
def test_the_model_cards_snippet_runs_as_written_and_prints_what_predict_prints(
    trained, tmp_path, model
):
    from raypeft.serving.export import export_peft
    from raypeft.serving.model_card import SNIPPET_TEXTS, id2label

    _, _, folder = trained(model, PT)
    out = tmp_path / "adapter"
    export_peft(folder, out)
    card = (out / "README.md").read_text()
    base = json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"]
    # the packaged alias exports as the Hub model it copies, not a folder of this environment
    name = model["name"] if isinstance(model, dict) else model
    assert base == {"minilm": "sentence-transformers/all-MiniLM-L6-v2"}.get(name, name)
    assert f"`{base}`" in card
    predictor = Predictor.from_folder(folder, precision="fp32")  # what peft computes in
    assert json.dumps(id2label(predictor.meta)) in card and f"`max_length` {S}" in card
    assert "raypeft predict --precision fp32" in card
    ran = subprocess.run(
        [sys.executable, "-c", card_snippet(out)], capture_output=True, text=True, cwd=tmp_path
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "MISSING" not in ran.stdout + ran.stderr  # the new head's load report is silenced
    printed = [line.split("\t") for line in ran.stdout.splitlines()]
    expected = predictor.predict(list(SNIPPET_TEXTS))
    assert [row[2] for row in printed] == list(SNIPPET_TEXTS)
    if predictor.kind == "encoder":  # decoders: peft ignores raypeft's position ids
        assert [(row[0], row[1]) for row in printed] == [
            (p.label, f"{p.score:.4f}") for p in expected
        ]
    else:
        assert {row[0] for row in printed} <= set(id2label(predictor.meta).values())


@pytest.mark.parametrize(
    "model, method, peft_type, task_type",
    [
        ("tiny-gpt2", PT, "PROMPT_TUNING", "SEQ_CLS"),
        ("tiny-t5", PT, "PROMPT_TUNING", "SEQ_2_SEQ_LM"),
        ("tiny-gpt2", PREFIX_KV, "PREFIX_TUNING", "SEQ_CLS"),
        ("tiny-bert", PREFIX_KV, "PREFIX_TUNING", "SEQ_CLS"),
    ],
    ids=["gpt2-pt", "t5-pt", "gpt2-prefix-kv", "bert-prefix-kv"],
)
def test_export_other_backbones_and_prefix(trained, tmp_path, model, method, peft_type, task_type):
    from raypeft.serving.export import export_peft

    _, _, folder = trained(model, method)
    if peft_type == "PREFIX_TUNING" and RENAMED_CACHE:
        # peft passes the prefix as past_key_values, which transformers 5.24 renamed cache
        with pytest.raises(ConfigError, match=r"peft \S+ hands the backbone as past_key_values"):
            export_peft(folder, tmp_path / "adapter")
        assert list(tmp_path.iterdir()) == []
        return
    result = export_peft(folder, tmp_path / "adapter")
    assert (result.peft_type, result.task_type) == (peft_type, task_type)
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["num_transformer_submodules"] == 1  # T5: the encoder only, as raypeft
    text = "\n".join(result.checks)
    if model == "tiny-gpt2":
        # peft numbers positions over left padding: compared without padding
        assert "without padding" in text and "padded rows differ" in text
    if model == "tiny-t5":
        assert config["modules_to_save"] is None
        assert "generated labels (greedy): equal" in text


@pytest.mark.parametrize(
    "method, message",
    [
        (DEPT, "'dept' has no peft equivalent"),
        (IDPG, "'idpg' has no peft equivalent"),
        ({"name": "prefix", "style": "hidden", "prompt_length": 3}, "style: hidden has no peft"),
    ],
    ids=["dept", "idpg", "prefix-hidden"],
)
def test_export_refuses_methods_without_peft_equivalent(trained, tmp_path, method, message):
    from raypeft.serving.export import export_peft

    _, _, folder = trained("tiny-bert", method)
    with pytest.raises(ConfigError, match=message):
        export_peft(folder, tmp_path / "adapter")
    assert list(tmp_path.iterdir()) == []


def test_export_refuses_a_mean_head(trained, tmp_path):
    """peft's heads read the first position: a model whose head reads the mean of its input
    tokens (model.head_pooling: mean) has no peft equivalent."""
    from raypeft.serving.export import export_peft

    _, _, folder = trained(MEAN_HEAD, PT)
    with pytest.raises(ConfigError, match=r"model.head_pooling: .* model.head_pooling: first"):
        export_peft(folder, tmp_path / "adapter")
    assert list(tmp_path.iterdir()) == []


def test_export_out_folder_rules_and_failure_cleanup(trained, tmp_path, monkeypatch):
    import raypeft.serving.export as export_mod

    _, _, folder = trained("tiny-bert", PT)
    out = tmp_path / "adapter"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    with pytest.raises(ConfigError, match="not empty"):
        export_mod.export_peft(folder, out)
    assert (out / "keep.txt").read_text() == "precious"

    def broken(*args, **kwargs):
        raise export_mod.ExportVerificationError("simulated mismatch")

    monkeypatch.setattr(export_mod, "verify_adapter", broken)
    with pytest.raises(export_mod.ExportVerificationError):
        export_mod.export_peft(folder, out, force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter"]  # staging removed
    assert [p.name for p in out.iterdir()] == ["keep.txt"]  # old folder untouched
    monkeypatch.undo()

    export_mod.export_peft(folder, out, force=True)
    assert not (out / "keep.txt").exists() and (out / "adapter_config.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter"]
    # an empty folder needs no --force
    empty = tmp_path / "empty"
    empty.mkdir()
    export_mod.export_peft(folder, empty)
    assert (empty / "adapter_model.safetensors").is_file()


def test_missing_peft_is_a_one_line_error(monkeypatch):
    from raypeft.serving.export import require_peft

    monkeypatch.setitem(sys.modules, "peft", None)  # import peft -> ImportError
    with pytest.raises(ConfigError, match=r"pip install 'raypeft\[peft\]'"):
        require_peft()


# ----------------------------------------------------------------------------- commands


class Store:
    """A temp sqlite MLflow store holding trained models as raypeft's searches log them."""

    def __init__(self, folder: Path):
        self.uri = f"sqlite:///{folder / 'mlflow.db'}"
        self.client = MlflowClient(tracking_uri=self.uri)
        self.artifacts = folder / "artifacts"  # never the default ./mlartifacts of the cwd

    def search(self, name: str, model_folder: Path | None) -> tuple[str, str]:
        """An experiment with one finished search whose best trial holds ``model_folder``."""
        exp = self.client.create_experiment(name, artifact_location=str(self.artifacts / name))
        parent = self.client.create_run(exp, tags={"raypeft.role": "experiment"}).info.run_id
        tags = {"mlflow.parentRunId": parent, "raypeft.role": "trial"}
        trial = self.client.create_run(exp, tags=tags).info.run_id
        if model_folder is not None:
            self.client.log_artifacts(trial, str(model_folder), artifact_path="model")
            self.client.log_artifacts(parent, str(model_folder), artifact_path="best_model")
        self.client.set_terminated(trial, "FINISHED" if model_folder else "FAILED")
        self.client.set_tag(parent, "raypeft.best_run_id", trial)
        self.client.set_terminated(parent, "FINISHED")
        return parent, trial


@pytest.fixture(scope="module")
def store(tmp_path_factory, trained, pair_task_files):
    folder = tmp_path_factory.mktemp("predict-store")
    s = Store(folder)
    s.runs = {
        "pt": s.search("pt-bert", trained("tiny-bert", PT)[2]),
        "dept": s.search("dept-bert", trained("tiny-bert", DEPT)[2]),
        "pairs": s.search("pairs", trained("tiny-bert", IDPG, pair_task_files)[2]),
        "failed": s.search("failed", None),
    }
    return s


def invoke(*args: str, input: str | None = None):
    return CliRunner().invoke(main, list(args), input=input)


def lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.strip()]


def test_predict_command_text_jsonl_and_sources(store, trained, tmp_path):
    _, task, folder = trained("tiny-bert", PT)
    texts = task.texts["validation"][:9]
    expected = Predictor.from_folder(folder).predict(texts)
    stdin = "\n".join(texts[:4]) + "\n\n  \n" + "\n".join(texts[4:]) + "\n"  # blanks skipped
    result = invoke(
        "predict", "--experiment", "pt-bert", "--tracking-uri", store.uri, "--batch-size", "4",
        input=stdin,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    out = [line for line in result.stdout.splitlines()]
    assert out == [f"{p.label}\t{p.score:.4f}\t{p.text}" for p in expected]
    assert "9 texts in " in result.stderr and "model load" in result.stderr

    # --run (the trial, then the search's parent run: its best_model/) and jsonl in and out
    parent, trial = store.runs["pt"]
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    for run in (trial, parent):
        result = invoke(
            "predict", "--run", run, "--input", str(jsonl), "--output-format", "jsonl",
            "--tracking-uri", store.uri,
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        records = [json.loads(line) for line in result.stdout.splitlines()]
        assert [r["text"] for r in records] == texts
        assert [r["label"] for r in records] == [p.label for p in expected]
        np.testing.assert_allclose([r["score"] for r in records], [p.score for p in expected])


def test_predict_precision_fp32_gives_the_exported_adapters_numbers(store, trained):
    """``--precision fp32`` computes as peft runs the exported adapter; the default is what the
    model trained in (``auto``, resolved again here); fp16 cannot run on a CPU."""
    _, task, folder = trained("tiny-bert", PT)
    texts = task.texts["validation"][:5]
    stdin = "\n".join(texts) + "\n"
    for flag, expected in (
        ("fp32", Predictor.from_folder(folder, precision="fp32").predict(texts)),
        ("trained", Predictor.from_folder(folder).predict(texts)),
    ):
        result = invoke(
            "predict", "--experiment", "pt-bert", "--tracking-uri", store.uri,
            "--precision", flag, input=stdin,
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        assert result.stdout.splitlines() == [
            f"{p.label}\t{p.score:.4f}\t{p.text}" for p in expected
        ]
    if not torch.cuda.is_available():
        result = invoke(
            "predict", "--experiment", "pt-bert", "--tracking-uri", store.uri,
            "--precision", "fp16", input=stdin,
        )  # fmt: skip
        assert result.exit_code == 2 and result.stdout == ""
        assert result.stderr.startswith("error: --precision fp16: ")
        assert len(result.stderr.strip().splitlines()) == 1


def test_predict_command_pairs(store, trained, pair_task_files, tmp_path):
    texts, pairs = ["good bad fine", "calm sad", "nice"], ["poor poor happy", "great", "awful"]
    expected = Predictor.from_folder(trained("tiny-bert", IDPG, pair_task_files)[2]).predict(
        texts, pairs
    )
    stdin = "".join(f"{a}\t{b}\n" for a, b in zip(texts, pairs, strict=True))
    result = invoke("predict", "--experiment", "pairs", "--tracking-uri", store.uri, input=stdin)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        f"{p.label}\t{p.score:.4f}\t{p.text}\t{p.text_pair}" for p in expected
    ]
    # a line without its pair
    result = invoke(
        "predict", "--experiment", "pairs", "--tracking-uri", store.uri, input="a\tb\nno pair\n"
    )
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "error: stdin:2: the model reads text pairs: expected text<TAB>pair "
        "(one tab, both sides non-empty), got 0 tab(s)"
    )
    jsonl = tmp_path / "pairs.jsonl"
    jsonl.write_text(json.dumps({"text": "a", "text_pair": "b"}) + "\n" + '{"text": "c"}\n')
    result = invoke(
        "predict", "--experiment", "pairs", "--tracking-uri", store.uri, "--input", str(jsonl)
    )
    assert result.exit_code == 2 and '"text_pair" field is needed' in result.stderr


@pytest.mark.parametrize(
    "args, stdin, message",
    [
        ([], "x\n", "give exactly one of --run RUN_ID, --experiment NAME or --model"),
        (["--run", "abc", "--experiment", "pt-bert"], "x\n", "give exactly one of"),
        (["--run", "0123456789abcdef"], "x\n", "run '0123456789abcdef': not found"),
        (["--experiment", "nope"], "x\n", "experiment 'nope': not found"),
        (["--experiment", "failed"], "x\n", "has no trained artefacts under model/"),
        (["--experiment", "pt-bert", "--input", "/no/such/file.txt"], "", "file not found"),
        (["--experiment", "pt-bert"], "\n  \n", "stdin: no input texts"),
        # a device is read like a file (it used to be "file not found"); a folder is refused
        (["--experiment", "pt-bert", "--input", "/dev/null"], "", "/dev/null: no input texts"),
        (["--experiment", "pt-bert", "--input", "/"], "", "--input /: is a folder"),
    ],
    ids=[
        "none",
        "both",
        "unknown-run",
        "unknown-experiment",
        "failed-run",
        "no-file",
        "empty",
        "dev-null",
        "folder",
    ],
)
def test_predict_command_errors(store, args, stdin, message):
    result = invoke("predict", *args, "--tracking-uri", store.uri, input=stdin)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ") and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1  # one line, no traceback
    assert result.stdout == ""


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "give exactly one of --run RUN_ID, --experiment NAME or --model"),
        (["--run", "0123456789abcdef"], "run '0123456789abcdef': not found"),
        (["--experiment", "nope"], "experiment 'nope': not found"),
        (["--experiment", "pt-bert"], "its newest search ("),
        (["--run", "<trial>"], "no python_function model was logged from it"),
        (["--model", "models:/pt-bert@champion"], "not in the model registry"),
    ],
    ids=["none", "unknown-run", "unknown-experiment", "no-pyfunc", "trial-no-pyfunc", "alias"],
)
def test_serve_command_errors_before_any_server(store, args, message):
    """Everything `raypeft serve` refuses, it refuses in one line before MLflow's server
    starts (these searches logged their tensors, not a python_function model)."""
    args = [store.runs["pt"][1] if a == "<trial>" else a for a in args]
    result = invoke("serve", *args, "--tracking-uri", store.uri, "--port", str(free_port()))
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ") and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_serve_command_refuses_a_taken_port(store):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = invoke("serve", "--experiment", "pt-bert", "--port", str(port))
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        f"error: 127.0.0.1:{port}: cannot listen there (Address already in use); "
        "choose another --port"
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_predict_command_missing_store(tmp_path):
    result = invoke("predict", "--experiment", "x", "--tracking-uri", f"sqlite:///{tmp_path}/a.db")
    assert result.exit_code == 2 and "no MLflow store here" in result.stderr
    assert not (tmp_path / "a.db").exists()


def test_export_command(store, tmp_path):
    out = tmp_path / "adapter"
    args = ["export", "--experiment", "pt-bert", "--format", "peft", "--tracking-uri", store.uri]
    result = invoke(*args, "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "as a peft PROMPT_TUNING adapter (task_type SEQ_CLS)" in result.stdout
    assert "peft 0.21" in result.stdout or "loaded it" in result.stdout
    assert "equals the trained tensor" in result.stdout
    assert (out / "adapter_model.safetensors").is_file()
    # not again into the non-empty folder, unless --force
    result = invoke(*args, "--out", str(out))
    assert result.exit_code == 2 and "folder is not empty (use --force" in result.stderr
    result = invoke(*args, "--out", str(out), "--force")
    assert result.exit_code == 0, result.output
    # DePT has no peft equivalent
    dept = ["--experiment", "dept-bert", "--format", "peft", "--tracking-uri", store.uri]
    result = invoke("export", *dept, "--out", str(tmp_path / "dept"))
    assert result.exit_code == 2
    assert result.stderr.strip().startswith("error: method 'dept' has no peft equivalent")
    assert not (tmp_path / "dept").exists()


def test_export_command_without_peft(store, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)
    result = invoke(
        "export", "--experiment", "pt-bert", "--format", "peft", "--out", str(tmp_path / "a"),
        "--tracking-uri", store.uri,
    )  # fmt: skip
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "error: exporting a peft adapter needs the peft package: pip install 'raypeft[peft]'"
    )
