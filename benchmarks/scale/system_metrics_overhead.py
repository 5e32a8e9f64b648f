"""What MLflow system metrics cost a search (``tracking.system_metrics``, on by default only
if it costs at most 1% of wall time).

What it measures
----------------
1. **Where the trial trains.** The default search's trial (``search_spaces/dept.yaml``:
   DePT on the pre-trained MiniLM, s=64, batch 16; ``--steps`` steps, an evaluation every
   ``--eval-every``) is trained by :func:`raypeft.training.loop.train` in this process, once
   with reports carrying nothing extra (``off``) and once with a
   :class:`~raypeft.tracking.system_metrics.SystemSampler` sampling in its thread every
   ``--interval`` seconds and each report draining it (``on``), as the trial runners do.
   The two are INTERLEAVED run by run (the order alternating every round), so a slow phase
   of a shared machine hits both alike; reported: the median of the per-round ratios
   ``on / off``, and the sampler's own cost per sample and per report.
2. **On the Tune driver.** One extra ``log_batch`` of the sampled metrics per report, to a
   sqlite MLflow store: its median time, times the reports of the default search (19: 12
   trials, most stopped early by ASHA), against the default search's wall time (528 s,
   README "Measured").

Usage::

    python -m benchmarks.scale.system_metrics_overhead               # ~5 minutes on 2 cores
    python -m benchmarks.scale.system_metrics_overhead --rounds 6 --interval 0.5   # a stress test
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from benchmarks.common.paths import SHIPPED_SEARCH

DEFAULT_SEARCH_S = 528.0  # README "Measured": the default search, 2 cores
DEFAULT_SEARCH_REPORTS = 19  # reports (evaluations) of that search's 12 trials


def trial_config(args):
    import yaml

    from raypeft.config.schema import ExperimentConfig

    raw = yaml.safe_load(SHIPPED_SEARCH.read_text())
    raw["train"].update(max_steps=args.steps, eval_every=args.eval_every)
    raw["task"].update(max_eval_examples=args.eval_examples)
    raw["space"] = {}
    return ExperimentConfig.model_validate(raw)


def run_once(cfg, task, sampled) -> float:
    from raypeft.training.loop import train

    reported = []

    def report(metrics, folder):
        reported.append({**metrics, **sampled()})  # what the trial runners send to Tune

    start = time.perf_counter()
    with sampled:
        train(cfg, task, report)
    return time.perf_counter() - start


def worker_side(args) -> None:
    import torch

    from raypeft.data import prepare_task
    from raypeft.tracking.system_metrics import NoSampler, SystemSampler

    torch.set_num_threads(args.threads)
    cfg = trial_config(args)
    task = prepare_task(cfg.task, cfg.model)
    run_once(cfg, task, NoSampler())  # warm-up: the backbone is cached per process
    ratios, times = [], {"off": [], "on": []}
    for i in range(args.rounds):
        order = ["off", "on"] if i % 2 == 0 else ["on", "off"]
        took = {}
        for arm in order:
            sampler = SystemSampler(args.interval) if arm == "on" else NoSampler()
            took[arm] = run_once(cfg, task, sampler)
            times[arm].append(took[arm])
        ratios.append(took["on"] / took["off"])
        print(f"round {i}: off {took['off']:.2f} s, on {took['on']:.2f} s, "
              f"ratio {ratios[-1]:.4f}", flush=True)  # fmt: skip
    print(
        f"trial ({args.steps} steps, interval {args.interval} s): median off "
        f"{statistics.median(times['off']):.2f} s, on {statistics.median(times['on']):.2f} s; "
        f"median ratio on/off {statistics.median(ratios):.4f} "
        f"(min {min(ratios):.4f}, max {max(ratios):.4f})"
    )
    with SystemSampler(3600) as sampler:
        start = time.perf_counter()
        for _ in range(500):
            sampler._sample()
        per_sample = (time.perf_counter() - start) / 500
        start = time.perf_counter()
        for _ in range(500):
            sampler()
        per_report = (time.perf_counter() - start) / 500
    print(f"sampler: {per_sample * 1e3:.3f} ms per sample, {per_report * 1e3:.3f} ms per report")


def driver_side(args) -> None:
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    from raypeft.tracking.system_metrics import SystemSampler

    with SystemSampler(3600) as sampler:
        values = sampler()
    with tempfile.TemporaryDirectory() as tmp:
        client = MlflowClient(tracking_uri=f"sqlite:///{tmp}/mlflow.db")
        run_id = client.create_run(client.create_experiment("bench")).info.run_id
        took = []
        for step in range(args.logs):
            metrics = [Metric(k, v, int(time.time() * 1000), step) for k, v in values.items()]
            start = time.perf_counter()
            client.log_batch(run_id, metrics=metrics)
            took.append(time.perf_counter() - start)
    per_report = statistics.median(took)
    total = per_report * DEFAULT_SEARCH_REPORTS
    print(
        f"driver: {len(values)} metrics per report, median log_batch {per_report * 1e3:.1f} ms; "
        f"x {DEFAULT_SEARCH_REPORTS} reports = {total:.2f} s = "
        f"{100 * total / DEFAULT_SEARCH_S:.3f}% of the default search's {DEFAULT_SEARCH_S:.0f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--eval-every", type=int, default=20)
    parser.add_argument("--eval-examples", type=int, default=100)
    parser.add_argument("--interval", type=float, default=10.0)
    parser.add_argument("--threads", type=int, default=1)  # cpus_per_worker: 1
    parser.add_argument("--logs", type=int, default=40)
    args = parser.parse_args()
    driver_side(args)
    worker_side(args)


if __name__ == "__main__":
    main()
