"""``workers_per_trial: 2``: one trial trained with DDP across two Ray Train workers (gloo on
CPU) learns what one worker learns at the same global batch size, and logs what a search
trained inside its Tune trials logs.

Both runs see the same global batches (raypeft.training.sampler.GlobalBatchSampler: each worker
takes half of every batch) and DDP averages the two halves' gradients, which is the gradient of the
whole batch; so the metrics agree up to floating-point summation order, step by step. The
one-worker run is a plain Tune trial (the default trial runner), so the test also shows that
a Ray Train trial learns and logs exactly what a Tune trial does.
"""

from __future__ import annotations

import math

import pytest
from mlflow.tracking import MlflowClient

from tests.helpers import children, run_cli, tiny_experiment

pytestmark = pytest.mark.integration

# Backbone dropout off: with it, one worker draws masks for the whole batch and two workers
# each draw theirs for half of it, so the two trainings would differ by their masks, not by
# the summation order this test bounds.
TRAIN = {"max_steps": 40, "eval_every": 10, "batch_size": 8, "head_lr": 0.01, "backbone_dropout": 0}
METRICS = ("train_loss", "val_loss", "val_accuracy", "val_macro_f1")


def run_one_trial(tmp_path, resources: dict) -> dict[str, list[tuple[int, float]]]:
    """One DePT trial through the CLI; its metric histories from MLflow."""
    tmp_path.mkdir()
    path = tiny_experiment(
        tmp_path,
        train=TRAIN,
        space={"method.lr_prompt": {"grid": [0.3]}, "method.lr_lowrank": {"grid": [1.0e-3]}},
        search={"num_samples": 1, "scheduler": {"type": "none"}},
        resources=resources,
    )
    proc = run_cli(["tune", "--space", str(path), "--quiet"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("tiny-dept")
    (parent,) = client.search_runs([experiment.experiment_id], "tags.`raypeft.role` = 'experiment'")
    (kid,) = children(client, experiment.experiment_id, parent.info.run_id)
    # what a Ray Train trial logs, as a trial trained inside Tune does: finished, its artefacts
    assert parent.info.status == kid.info.status == "FINISHED"
    assert "test_accuracy" in parent.data.metrics
    files = {f.path for f in client.list_artifacts(kid.info.run_id, "model")}
    assert {"model/trainable.safetensors", "model/config.yaml"} <= files
    return {
        name: sorted((m.step, m.value) for m in client.get_metric_history(kid.info.run_id, name))
        for name in (*METRICS, "train_samples_per_s")
    }


def test_two_ddp_workers_match_one_worker_at_the_same_global_batch(tmp_path):
    one = run_one_trial(tmp_path / "one", {})  # the default: trained inside the Tune trial
    two = run_one_trial(tmp_path / "two", {"trial_runner": "ray_train", "workers_per_trial": 2})
    for name in METRICS:
        steps_one = [s for s, _ in one[name]]
        assert steps_one == [10, 20, 30, 40] and [s for s, _ in two[name]] == steps_one
        for (step, a), (_, b) in zip(one[name], two[name], strict=True):
            assert math.isclose(a, b, rel_tol=1e-3, abs_tol=1e-4), (name, step, a, b)
    # the loss moved: the comparison is between two trainings, not two untouched models
    losses = [v for _, v in one["train_loss"]]
    assert losses[0] != losses[-1]
