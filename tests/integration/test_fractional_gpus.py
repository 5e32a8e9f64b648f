"""``resources.gpus_per_worker: 0.5``: two trials share one GPU, in a real local search (Ray's
fractional GPUs: 0.25 for four trials is the same request and the same placement, at twice
the trials; two keep the check and halve its training).

This machine has no GPU, so the search runs in a driver that starts Ray with one GPU declared
for scheduling only (``ray.init(num_gpus=1)``, as ``ray start --num-gpus=1`` would): Ray then
places trials exactly as on a one-GPU machine, assigns each the GPU id ``0``, and each trial
trains on the CPU because torch sees no CUDA (raypeft.search.trial_runners.assigned_device).

Concurrency is read from the trials' own records, not from timings: each trial's MLflow run
starts when Tune has placed it (its actor started with its resources) and ends when it
completes, so if the latest start comes before the earliest end, both held their half of the
GPU at the same time; with room for one, the second could start only after the first ended.
"""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from tests.helpers import children, results, run_driver, tiny_experiment

pytestmark = pytest.mark.integration

TRIALS = 2
# Trials long enough (~8 s here, each on a core of its own) to outlast the start of the other
# trial's actor (both start together: 0.03-0.4 s apart here; four on 2 cores were 10-15 s
# apart): Tune hands a pending trial the actor of a trial that just ended when its own is
# still starting, so 12-step trials (~1 s) ran one after another on one actor although Ray
# had placed them all.
MAX_STEPS, EVAL_EVERY = 1600, 800

DRIVER = """
import sys

import ray

from raypeft.config.loading import load_experiment
from raypeft.search.run import run_experiment

# one GPU declared to Ray for scheduling only: this machine has none
ray.init(address="local", num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False)
run_experiment(load_experiment(sys.argv[1]), source=sys.argv[1], progress_interval=3600)
"""


def test_two_trials_share_one_gpu_at_a_time(tmp_path):
    path = tiny_experiment(
        tmp_path,
        space={"method.lr_prompt": {"grid": [0.1, 0.3]}},
        train={"max_steps": MAX_STEPS, "eval_every": EVAL_EVERY},
        search={"num_samples": TRIALS, "scheduler": {"type": "none"}},
        resources={"gpus_per_worker": 0.5, "cpus_per_worker": 0.5},
    )
    proc = run_driver(DRIVER, path, tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    plan = "2 trials, 2 at a time (each 0.5 CPU and 0.5 GPU: 2 trials share a GPU)"
    assert plan in proc.stdout, proc.stdout

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("tiny-dept")
    (parent,) = client.search_runs([experiment.experiment_id], "tags.`raypeft.role` = 'experiment'")
    runs = children(client, experiment.experiment_id, parent.info.run_id)
    trials = [r for r in runs if r.data.tags.get("raypeft.role") != "repeat"]
    assert len(trials) == TRIALS and all(r.info.status == "FINISHED" for r in trials)
    latest_start = max(r.info.start_time for r in trials)
    earliest_end = min(r.info.end_time for r in trials)
    assert latest_start < earliest_end, [(r.info.start_time, r.info.end_time) for r in trials]

    # each trial was given GPU 0 by Ray and, torch having no CUDA here, trained on the CPU
    reports = [r for r in results(tmp_path / "ray_results") if "worker_gpu_ids" in r]
    assert len({r["trial_id"] for r in reports}) == TRIALS
    assert {(r["worker_gpu_ids"], r["worker_device"]) for r in reports} == {("0", "cpu")}
