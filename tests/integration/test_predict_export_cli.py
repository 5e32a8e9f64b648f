"""``raypeft predict`` and ``raypeft export`` through the console script, on real searches.

Prediction reads the session's finished DePT search (``finished_search``, read only); the
export needs a soft-prompt-tuning run, so one test runs a small PT search of its own.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from mlflow.tracking import MlflowClient

from tests.helpers import run_cli

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("shared_ray")]


def run_with_stdin(args: list[str], cwd: Path, stdin: str) -> subprocess.CompletedProcess:
    """``run_cli`` with text on stdin (same environment)."""
    return run_cli(args, cwd, stdin=stdin)


def parent_run(client: MlflowClient, experiment: str):
    exp = client.get_experiment_by_name(experiment)
    (parent,) = client.search_runs([exp.experiment_id], "tags.`raypeft.role` = 'experiment'")
    return parent


@pytest.fixture(scope="module")
def best_model(finished_search, tmp_path_factory):
    """The search's best trial: its run id, downloaded folder, config and test split."""
    from raypeft.config.schema import ExperimentConfig
    from raypeft.data.tokenize import prepare_task

    client = finished_search.client()
    parent = parent_run(client, finished_search.experiment)
    run_id = parent.data.tags["raypeft.best_run_id"]
    dst = tmp_path_factory.mktemp("best-model")
    folder = Path(client.download_artifacts(run_id, "model", str(dst)))
    cfg = ExperimentConfig.model_validate(yaml.safe_load((folder / "config.yaml").read_text()))
    task = prepare_task(cfg.task, cfg.model)
    return {"run_id": run_id, "folder": folder, "task": task, "parent": parent}


def test_predict_experiment_matches_the_logged_test_accuracy(finished_search, best_model, tmp_path):
    from raypeft.serving.predict import Predictor

    task = best_model["task"]
    texts, labels = task.texts["test"], task.splits["test"]["labels"]
    uri = finished_search.tracking_uri
    # every test text, as jsonl (tweets may hold carriage returns)
    path = tmp_path / "test.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    proc = run_cli(
        ["predict", "--experiment", "tiny-search", "--tracking-uri", uri, "--batch-size", "16",
         "--input", str(path), "--output-format", "jsonl"],
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["text"] for r in records] == texts  # in input order
    scores = [r["score"] for r in records]
    assert all(1 / 3 <= s <= 1 for s in scores)  # the predicted class's probability (3 classes)
    names = best_model["task"].label_names  # the tweets' class names, in id order
    assert names == ["negative", "neutral", "positive"]
    predicted = np.array([names.index(r["label"]) for r in records])
    # the CLI's predictions score exactly what the search logged for the test split
    accuracy = float((predicted == labels).mean())
    assert accuracy == pytest.approx(best_model["parent"].data.metrics["test_accuracy"])
    # and equal inference in process
    expected = Predictor.from_folder(best_model["folder"]).predict(texts)
    assert [p.label for p in expected] == [r["label"] for r in records]
    np.testing.assert_allclose([p.score for p in expected], scores, atol=1e-6)
    (summary,) = proc.stderr.strip().splitlines()[-1:]
    assert summary.startswith(f"{len(texts)} texts in ") and "texts/s; model load" in summary
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["test.jsonl"]  # no mlflow.db here


def test_predict_experiment_on_stdin(finished_search, best_model, tmp_path):
    from raypeft.serving.predict import Predictor

    texts = [t for t in best_model["task"].texts["test"] if t.splitlines() == [t]][:20]
    proc = run_with_stdin(
        ["predict", "--experiment", "tiny-search", "--tracking-uri", finished_search.tracking_uri,
         "--batch-size", "8"],
        cwd=tmp_path,
        stdin="\n".join(texts) + "\n",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    expected = Predictor.from_folder(best_model["folder"]).predict(texts)
    assert proc.stdout.splitlines() == [f"{p.label}\t{p.score:.4f}\t{p.text}" for p in expected]
    assert proc.stderr.strip().splitlines()[-1].startswith(f"{len(texts)} texts in ")


def test_predict_file_and_run_id(finished_search, best_model, tmp_path):
    texts = best_model["task"].texts["validation"][:10]
    path = tmp_path / "texts.txt"
    path.write_text("\n".join(texts[:5]) + "\n\n" + "\n".join(texts[5:]) + "\n")
    uri = finished_search.tracking_uri
    by_experiment = run_cli(
        ["predict", "--experiment", "tiny-search", "--input", str(path), "--tracking-uri", uri],
        cwd=tmp_path,
    )
    assert by_experiment.returncode == 0, by_experiment.stderr[-3000:]
    by_run = run_cli(
        ["predict", "--run", best_model["run_id"], "--input", str(path), "--tracking-uri", uri,
         "--output-format", "jsonl"],
        cwd=tmp_path,
    )  # fmt: skip
    assert by_run.returncode == 0, by_run.stderr[-3000:]
    records = [json.loads(line) for line in by_run.stdout.splitlines()]
    assert [r["text"] for r in records] == texts
    assert [f"{r['label']}\t{r['score']:.4f}\t{r['text']}" for r in records] == (
        by_experiment.stdout.splitlines()
    )
    # errors: one line on stderr, exit 2
    for args, message in [
        (["--run", "ffffffffffffffffffffffffffffffff"], "not found in the MLflow store"),
        (["--experiment", "tiny-search", "--input", str(tmp_path / "none.txt")], "file not found"),
    ]:
        proc = run_cli(["predict", *args, "--tracking-uri", uri], cwd=tmp_path)
        assert proc.returncode == 2
        assert proc.stderr.startswith("error: ") and message in proc.stderr
        assert "Traceback" not in proc.stderr


def test_export_dept_search_is_refused(finished_search, tmp_path):
    out = tmp_path / "adapter"
    proc = run_cli(
        ["export", "--experiment", "tiny-search", "--format", "peft", "--out", str(out),
         "--tracking-uri", finished_search.tracking_uri],
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error: method 'dept' has no peft equivalent")
    assert not out.exists()


def pt_experiment(tmp_path: Path) -> Path:
    """A 2-trial soft-prompt-tuning search on tiny BERT."""
    cfg = {
        "name": "tiny-pt",
        "model": {"name": "tiny-bert", "max_length": 16},
        "task": {
            "name": "tweet_sentiment",
            "max_train_examples": 64,
            "max_eval_examples": 24,
            "max_test_examples": 24,
        },
        "method": {"name": "pt", "prompt_length": 4},
        "train": {"max_steps": 6, "eval_every": 3, "batch_size": 8, "head_lr": 0.01},
        "space": {"method.lr": {"grid": [0.05, 0.3]}},
        "search": {"num_samples": 2, "scheduler": {"type": "none"}},
        "run": {"storage_path": str(tmp_path / "ray_results")},
    }
    path = tmp_path / "pt.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_export_pt_search_loads_in_peft(tmp_path):
    from peft import PeftModel
    from safetensors.torch import load_file

    from raypeft.modeling.backbones import load_backbone
    from raypeft.serving.predict import Predictor

    proc = run_cli(["tune", "--space", str(pt_experiment(tmp_path)), "--quiet"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "exported" / "adapter"
    # the default store: sqlite:///mlflow.db in the working directory
    proc = run_cli(
        ["export", "--experiment", "tiny-pt", "--format", "peft", "--out", str(out)], cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "as a peft PROMPT_TUNING adapter (task_type SEQ_CLS)" in proc.stdout
    assert "PeftModel.from_pretrained" in proc.stdout and "equals the trained tensor" in proc.stdout
    assert "max |peft - raypeft|" in proc.stdout
    assert sorted(p.name for p in out.parent.iterdir()) == ["adapter"]  # no staging left

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    best = parent_run(client, "tiny-pt").data.tags["raypeft.best_run_id"]
    folder = Path(client.download_artifacts(best, "model", str(tmp_path / "download")))
    trained = load_file(str(folder / "trainable.safetensors"))
    adapter = load_file(str(out / "adapter_model.safetensors"))
    assert torch.equal(adapter["prompt_embeddings"], trained["method.prompt"])
    config = json.loads((out / "adapter_config.json").read_text())
    assert (config["peft_type"], config["num_virtual_tokens"], config["token_dim"]) == (
        "PROMPT_TUNING",
        4,
        32,
    )
    # peft loads it onto the base model raypeft builds, and classifies as raypeft does (both
    # in fp32: peft runs the exported tensors in fp32, whatever train.precision resolved to)
    predictor = Predictor.from_folder(folder, precision="fp32")
    cfg, meta = predictor.cfg, predictor.meta
    base = load_backbone(cfg.model, meta["num_labels"], meta["problem"], seed=cfg.train.seed)
    peft_model = PeftModel.from_pretrained(base.model, str(out)).eval()
    texts = ["I love this so much", "this is the worst", "meh"]
    with torch.no_grad():
        theirs = peft_model(**predictor.inputs(texts)).logits.numpy()
    np.testing.assert_allclose(theirs, predictor.raw_predictions(texts), atol=1e-5)

    # --run with the search's own (parent) run id predicts from its best_model/ copy
    parent_id = parent_run(client, "tiny-pt").info.run_id
    proc = run_with_stdin(["predict", "--run", parent_id], cwd=tmp_path, stdin="\n".join(texts))
    assert proc.returncode == 0, proc.stderr[-3000:]
    default = Predictor.from_folder(folder)  # in the precision predict computes in
    assert [line.split("\t")[0] for line in proc.stdout.splitlines()] == [
        p.label for p in default.predict(texts)
    ]
    # not over the exported folder again without --force
    proc = run_cli(["export", "--run", best, "--format", "peft", "--out", str(out)], cwd=tmp_path)
    assert proc.returncode == 2 and "not empty (use --force" in proc.stderr
    # the registered champion (issue 16): the same adapter, through the Model Registry
    by_model = tmp_path / "exported" / "from-registry"
    proc = run_cli(
        ["export", "--model", "models:/tiny-pt@champion", "--format", "peft", "--out",
         str(by_model)],
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"Exported run {best} as a peft PROMPT_TUNING adapter" in proc.stdout
    assert torch.equal(
        load_file(str(by_model / "adapter_model.safetensors"))["prompt_embeddings"],
        adapter["prompt_embeddings"],
    )
