"""Every backbone kind trained through the real ``raypeft tune``: PT, DePT and deep prompts
on a tiny seq2seq model (T5: labels as text, generation for evaluation) and on a tiny decoder
(GPT-2: classification head on the last token, left padding). Real local Ray, real MLflow on
a temp sqlite store. Every registered method on an encoder, in one search at one parameter
budget: the shipped compare.yaml in tests/integration/test_search_spaces.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.helpers import children, run_cli

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("shared_ray")]


def write_experiment(tmp_path: Path, name: str, model: str, names: list[str], **extra) -> Path:
    cfg = {
        "name": name,
        "model": {"name": model, "max_length": 16},
        "task": {"name": "tweet_sentiment", "max_train_examples": 96, "max_eval_examples": 32,
                 "max_test_examples": 32},
        "method": {"name": "pt"},
        "train": {"max_steps": 6, "eval_every": 3, "batch_size": 8, "head_lr": 0.01},
        "space": {"method.name": {"grid": names}},
        "search": {"num_samples": len(names), "scheduler": {"type": "none"}},
        "run": {"storage_path": str(tmp_path / "ray_results")},
        **extra,
    }  # fmt: skip
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def trials_by_method(tmp_path: Path, name: str) -> tuple[object, dict[str, object]]:
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(name)
    (parent,) = client.search_runs([experiment.experiment_id], "tags.`raypeft.role` = 'experiment'")
    assert parent.info.status == "FINISHED"
    kids = children(client, experiment.experiment_id, parent.info.run_id)
    for kid in kids:
        assert kid.info.status == "FINISHED", kid.data.tags.get("raypeft.error")
        assert kid.data.tags["raypeft.method"] == kid.data.params["method.name"]
        assert "val_accuracy" in kid.data.metrics
    return parent, {kid.data.tags["raypeft.method"]: kid for kid in kids}


@pytest.mark.parametrize(
    ("model", "methods"),
    [("tiny-t5", ["pt", "dept", "prefix"]), ("tiny-gpt2", ["pt", "dept", "prefix"])],
)
def test_seq2seq_and_decoder_backbones(tmp_path, model, methods):
    presets = {"dept": {"prompt_length": 4, "rank": 2}, "prefix": {"prompt_length": 3}}
    if model == "tiny-gpt2":
        presets["prefix"]["style"] = "kv"  # key/value prefixes through past_key_values
    name = f"tiny-{model}"
    path = write_experiment(tmp_path, name, model, methods, methods=presets)
    proc = run_cli(["tune", "--space", str(path), "--quiet"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    parent, trials = trials_by_method(tmp_path, name)
    assert set(trials) == set(methods)
    assert "test_accuracy" in parent.data.metrics
