"""Assemble and run one search: Ray Tune + Optuna + ASHA over trials that train with Ray.

Flow (see README): validate -> tokenise the task once on the driver -> put it in Ray's
object store -> Tuner with OptunaSearch (define-by-run space) and ASHA -> each trial trains
in-process (one worker) or in a Ray Train TorchTrainer (one or more workers) -> every trial
mirrored to a nested MLflow run -> the best configuration evaluated once on the test split.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch
from mlflow.tracking import MlflowClient
from ray import tune
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler
from ray.tune.search import ConcurrencyLimiter
from ray.tune.search.optuna import OptunaSearch

from raypeft.backbones import backbone_dims, load_config
from raypeft.config import ConfigError, ExperimentConfig
from raypeft.data import TokenizedTask, prepare_task
from raypeft.data.metrics import METRIC_MODE
from raypeft.space import DefineByRun, candidate_methods, trial_config
from raypeft.tracking import (
    DEFAULT_TRACKING_URI,
    MLflowTrialCallback,
    finish_parent_run,
    open_experiment,
    start_parent_run,
)
from raypeft.train import evaluate, load_checkpoint, split_dataset, train

# The Tune function that drives a Ray Train run needs no CPU of its own; Ray rejects an
# all-zero request, so it asks for a sliver of memory instead (works on any cluster).
_DRIVER_RESOURCES = {"CPU": 0, "memory": 64 * 1024**2}


@dataclass
class SearchSummary:
    """What a finished search found, and where its records are."""

    experiment: str
    tracking_uri: str
    experiment_id: str
    parent_run_id: str
    best_trial_id: str
    best_run_id: str | None
    best_params: dict[str, Any]
    metric: str
    best_validation: dict[str, float]
    test: dict[str, float]
    num_trials: int
    num_errors: int
    storage_path: str
    wall_s: float
    trial_run_ids: dict[str, str] = field(default_factory=dict)


# ----------------------------------------------------------------------------- trials


def trial_in_process(config: dict, *, base: dict, data_ref: list, threads: int) -> None:
    """Tune function trainable: train the trial right here (single worker)."""
    torch.set_num_threads(threads)
    cfg = trial_config(ExperimentConfig.model_validate(base), config)
    task: TokenizedTask = ray.get(data_ref[0])

    def report(metrics: dict, folder: Path | None) -> None:
        checkpoint = tune.Checkpoint.from_directory(folder) if folder else None
        tune.report(metrics, checkpoint=checkpoint)

    use_cuda = cfg.resources.use_gpu and torch.cuda.is_available()  # Tune set the visible GPU
    train(cfg, task, report, device=torch.device("cuda" if use_cuda else "cpu"))


def trial_with_ray_train(config: dict, *, base: dict, data_ref: list, threads: int) -> None:
    """Tune function trainable: run the trial as a Ray Train TorchTrainer (1+ workers)."""
    from ray.train import CheckpointConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    cfg = ExperimentConfig.model_validate(base)
    res = cfg.resources
    context = tune.get_context()
    trainer = TorchTrainer(
        _train_worker,
        train_loop_config={
            "base": base,
            "params": config,
            "data_ref": data_ref,
            "threads": threads,
        },
        scaling_config=ScalingConfig(
            num_workers=res.workers_per_trial,
            use_gpu=res.use_gpu,
            resources_per_worker={"CPU": res.cpus_per_worker},
        ),
        run_config=RunConfig(
            name=f"{context.get_experiment_name()}-{context.get_trial_id()}",
            storage_path=_storage_path(cfg),
            callbacks=[TuneReportCallback()],
            checkpoint_config=CheckpointConfig(num_to_keep=1),
        ),
    )
    trainer.fit()


def _train_worker(loop_config: dict) -> None:
    """One Ray Train worker: the same loop, with DDP when there are several workers."""
    import ray.train
    import ray.train.torch

    torch.set_num_threads(loop_config["threads"])
    cfg = trial_config(ExperimentConfig.model_validate(loop_config["base"]), loop_config["params"])
    task: TokenizedTask = ray.get(loop_config["data_ref"][0])
    context = ray.train.get_context()
    world = context.get_world_size()

    def report(metrics: dict, folder: Path | None) -> None:
        checkpoint = ray.train.Checkpoint.from_directory(folder) if folder else None
        ray.train.report(metrics, checkpoint=checkpoint)

    train(
        cfg,
        task,
        report,
        device=ray.train.torch.get_device(),
        wrap_model=ray.train.torch.prepare_model if world > 1 else None,
        rank=context.get_world_rank(),
        world_size=world,
    )


def use_ray_train(cfg: ExperimentConfig) -> bool:
    """``auto``: in-process for one worker (measured faster, see README), else Ray Train."""
    runner = cfg.resources.trial_runner
    if runner == "auto":
        return cfg.resources.workers_per_trial > 1 or cfg.resources.use_gpu
    return runner == "ray_train"


def _storage_path(cfg: ExperimentConfig) -> str:
    """Where Ray keeps results: a URI (s3://...) as given, a local path made absolute."""
    path = cfg.run.storage_path or "~/ray_results"  # Ray's own default
    if "://" in path:
        return path
    return str(Path(path).expanduser().resolve())


# ----------------------------------------------------------------------------- search


def _trainable(cfg: ExperimentConfig, data_ref: ray.ObjectRef):
    res = cfg.resources
    threads = cfg.train.num_threads or max(1, int(res.cpus_per_worker))
    with_ray_train = use_ray_train(cfg)
    fn = trial_with_ray_train if with_ray_train else trial_in_process
    wrapped = tune.with_parameters(
        fn, base=cfg.model_dump(mode="json"), data_ref=[data_ref], threads=threads
    )
    if with_ray_train:
        return tune.with_resources(wrapped, _DRIVER_RESOURCES)
    return tune.with_resources(wrapped, {"CPU": res.cpus_per_worker, "GPU": int(res.use_gpu)})


class TrialNamer:
    """Trial names like ``dept_3f2a1_00004`` in Tune's table and folders (picklable): the
    trial's own method, where the space chooses ``method.name``."""

    def __init__(self, method: str):
        self.method = method

    def __call__(self, trial) -> str:
        return f"{trial.config.get('method.name', self.method)}_{trial.trial_id}"


def _max_concurrent(cfg: ExperimentConfig) -> int:
    if cfg.search.max_concurrent:
        return cfg.search.max_concurrent
    res = cfg.resources
    cluster = ray.cluster_resources()
    fits = cluster.get("CPU", 1) // (res.workers_per_trial * res.cpus_per_worker)
    if res.use_gpu:
        fits = min(fits, cluster.get("GPU", 0) // res.workers_per_trial)
    return max(1, int(fits))


def _searcher(cfg: ExperimentConfig, dims, metric: str, mode: str):
    import optuna

    sampler = (
        optuna.samplers.TPESampler(seed=cfg.search.seed)
        if cfg.search.sampler == "tpe"
        else optuna.samplers.RandomSampler(seed=cfg.search.seed)
    )
    search = OptunaSearch(
        space=DefineByRun(cfg, dims),
        metric=metric,
        mode=mode,
        sampler=sampler,
        points_to_evaluate=cfg.grid_points() or None,
    )
    return ConcurrencyLimiter(search, max_concurrent=_max_concurrent(cfg))


def _scheduler(cfg: ExperimentConfig, metric: str, mode: str):
    sched = cfg.search.scheduler
    if sched.type == "none":
        return FIFOScheduler()
    # one Tune iteration = one evaluation (every train.eval_every steps)
    max_t = math.ceil(cfg.train.max_steps / cfg.train.eval_every)
    return ASHAScheduler(
        time_attr="training_iteration",
        metric=metric,
        mode=mode,
        max_t=max_t,
        grace_period=min(sched.grace_period, max_t),
        reduction_factor=sched.reduction_factor,
    )


def init_ray(address: str | None) -> None:
    """Connect to a cluster (``address``) or start a local Ray with this machine's CPUs."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Trials checkpoint only when their metric improves, and with num_to_keep set Tune then
    # snapshots the experiment each time: expected here, not worth a warning per trial.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    if ray.is_initialized():
        return
    if address:
        ray.init(address=address, log_to_driver=False)
    else:
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)


class SearchFailed(RuntimeError):
    """No trial produced a result (every trial failed); the message says where to look."""


def _build_tuner(cfg, data_ref, dims, tune_metric: str, mode: str, tracker, name: str, quiet: bool):
    return tune.Tuner(
        _trainable(cfg, data_ref),
        tune_config=tune.TuneConfig(
            search_alg=_searcher(cfg, dims, tune_metric, mode),
            scheduler=_scheduler(cfg, tune_metric, mode),
            num_samples=cfg.search.num_samples,
            reuse_actors=not use_ray_train(cfg),
            trial_name_creator=TrialNamer(cfg.method.name),
            trial_dirname_creator=TrialNamer(cfg.method.name),
        ),
        run_config=tune.RunConfig(
            name=name,
            storage_path=_storage_path(cfg),
            callbacks=[tracker],
            checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
            verbose=0 if quiet else 1,
        ),
    )


def precompute_features(cfg: ExperimentConfig, data: TokenizedTask, say=print) -> None:
    """Compute every per-example feature any trial can ask for, once, on the driver.

    IDPG's sentence encodings do not depend on trained parameters, so each distinct one is
    computed here for every split and shipped with the task to all trials; no trial runs
    the extra forward pass. Methods with shared artefacts (IPT's pretrained prompt table)
    build them here too, through ``MethodConfig.warm_up``, before any trial starts.
    """
    specs, warmed = {}, set()
    for method in candidate_methods(cfg):
        for spec in method.feature_specs().values():
            specs[spec.key] = spec
        key = method.model_dump_json()
        if key not in warmed:  # shared artefacts (IPT's pretrained table), built once
            warmed.add(key)
            method.warm_up(cfg.model)
    for key, spec in specs.items():
        if key in data.features:
            continue
        start = time.perf_counter()
        data.features[key] = {
            split: spec.compute(data.texts[split], arrays, cfg.model)
            for split, arrays in data.splits.items()
        }
        say(f"  computed {key} once for all trials ({time.perf_counter() - start:.1f} s)")


def score_on_test(cfg: ExperimentConfig, data: TokenizedTask, folder: Path) -> dict[str, float]:
    """Evaluate a checkpoint once on the test split (the chosen configuration only)."""
    torch.set_num_threads(os.cpu_count() or 1)
    trial_cfg, model = load_checkpoint(folder, data)
    scores = evaluate(
        model,
        split_dataset(data, trial_cfg, "test"),
        data.spec.metrics,
        cfg.train.eval_batch_size,
        torch.device("cpu"),
    )
    test = {f"test_{k}": v for k, v in scores.items()}
    if data.spec.problem == "classification":
        # what always answering the most frequent test label scores: the bar to beat
        counts = np.bincount(data.splits["test"]["labels"])
        test["test_majority_class_accuracy"] = float(counts.max() / counts.sum())
    return test


def _search_metric(cfg: ExperimentConfig, data: TokenizedTask) -> tuple[str, str]:
    metric = cfg.search.metric or data.spec.primary_metric
    if metric not in (*data.spec.metrics, "loss"):
        raise ConfigError(
            f"search.metric: {metric!r} is not reported for task {data.spec.name!r}; "
            f"choose one of {[*data.spec.metrics, 'loss']}"
        )
    return metric, cfg.search.mode or METRIC_MODE.get(metric, "max")


def run_experiment(
    cfg: ExperimentConfig,
    *,
    address: str | None = None,
    quiet: bool = False,
    source: str = "<memory>",
    printer=print,
) -> SearchSummary:
    """Run the whole search described by ``cfg`` and return its summary."""
    start = time.time()
    say = (lambda *_: None) if quiet else printer
    say(f"Preparing task {cfg.task.name!r} for {cfg.model.name} (s={cfg.model.max_length}) ...")
    data = prepare_task(cfg.task, cfg.model)
    metric, mode = _search_metric(cfg, data)
    tune_metric = f"best_val_{metric}"  # running best: what the kept checkpoint scored
    config = load_config(cfg.model, data.num_labels, data.spec.problem)
    dims = backbone_dims(config, cfg.model.max_length, cfg.model.name)
    sizes = "/".join(str(data.size(split)) for split in ("train", "validation", "test"))
    say(f"  train/validation/test: {sizes} examples, {data.num_labels} labels, {metric} ({mode})")
    precompute_features(cfg, data, say)

    uri = cfg.tracking.uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI
    client = MlflowClient(tracking_uri=uri)
    experiment_id = open_experiment(client, cfg.tracking.experiment or cfg.name)
    parent_run_id = start_parent_run(client, experiment_id, cfg, source)
    # what `raypeft report` and `predict` read back: the searched metric and its direction
    client.set_tag(parent_run_id, "raypeft.metric", metric)
    client.set_tag(parent_run_id, "raypeft.mode", mode)
    tracker = MLflowTrialCallback(client, experiment_id, parent_run_id, cfg, dims)
    name = f"{cfg.name}-{parent_run_id[:8]}"
    try:
        init_ray(address)
        data_ref = ray.put(data)  # tokenised once; every trial reads this one copy
        results = _build_tuner(cfg, data_ref, dims, tune_metric, mode, tracker, name, quiet).fit()
        errors = len(results.errors)
        best = results.get_best_result(metric=tune_metric, mode=mode, scope="all")
        if best is None or not best.metrics or tune_metric not in best.metrics:
            first = str(results.errors[0]).strip().splitlines()[-1] if errors else "no error"
            raise SearchFailed(
                f"no trial reported {tune_metric}: {errors} of {len(results)} trials failed "
                f"(first: {first[:300]}); see MLflow run {parent_run_id}"
            )
        best_trial_id = best.metrics["trial_id"]
        best_val = {
            k[len("best_") :]: v
            for k, v in best.metrics.items()
            if k.startswith("best_val_") and isinstance(v, (int, float))
        }
        folder = tracker.best_checkpoint_dir(best_trial_id, best.checkpoint)
        test = {}
        if folder is not None:
            say("Evaluating the best configuration on the test split ...")
            test = score_on_test(cfg, data, folder)
        summary = SearchSummary(
            experiment=cfg.tracking.experiment or cfg.name,
            tracking_uri=uri,
            experiment_id=experiment_id,
            parent_run_id=parent_run_id,
            best_trial_id=best_trial_id,
            best_run_id=tracker.run_ids.get(best_trial_id),
            best_params=dict(best.config),
            metric=metric,
            best_validation=best_val,
            test=test,
            num_trials=len(results),
            num_errors=errors,
            storage_path=str(Path(_storage_path(cfg)) / name),
            wall_s=time.time() - start,
            trial_run_ids=dict(tracker.run_ids),
        )
        finish_parent_run(
            client,
            parent_run_id,
            {
                "trial_id": best_trial_id,
                "run_id": summary.best_run_id,
                "config": summary.best_params,
                "metrics": {
                    **{f"best_{k}": v for k, v in best_val.items()},
                    **test,
                    "num_trials": summary.num_trials,
                    "num_failed_trials": errors,
                },
            },
            folder,
        )
        return summary
    except BaseException:
        if client.get_run(parent_run_id).info.status == "RUNNING":
            client.set_terminated(parent_run_id, "FAILED")
        raise
