"""How one trial runs: in the Tune function trainable (one worker), or as a Ray Train
``TorchTrainer`` (one or more DDP workers). Either way it runs :func:`raypeft.training.loop.train`,
continuing from the trial's latest checkpoint when Ray restarted it, on the GPU Ray assigned
to the process (``resources.gpus_per_worker``, a fraction where trials share one) or the CPU.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

import psutil
import ray
import torch
from ray import tune

from raypeft.config.schema import ExperimentConfig, trial_config
from raypeft.data import TokenizedTask
from raypeft.search.resources import ray_train_scaling, worker_request
from raypeft.tracking.system_metrics import sampler_for
from raypeft.training.loop import train
from raypeft.training.phases import PhaseTimer
from raypeft.training.result_keys import ENTERED_KEY, TRIAL_IN_PROCESS_KEY

# The Tune function that drives a Ray Train run needs no CPU of its own; Ray rejects an
# all-zero request, so it asks for a sliver of memory instead (works on any cluster).
DRIVER_RESOURCES = {"CPU": 0, "memory": 64 * 1024**2}


def worker_identity(device: torch.device) -> dict[str, Any]:
    """Where the (rank-0) training process runs: tagged on the trial's MLflow run; and the
    GPUs Ray assigned it (``"0"``; several trials may share one) and the device it trains on.

    Tune's own ``node_ip``/``pid`` keys name the trial's Tune actor, which for Ray Train
    trials is not the process that trains; on one machine several nodes share an IP.
    """
    return {
        "worker_node_id": ray.get_runtime_context().get_node_id(),
        "worker_node_ip": ray.util.get_node_ip_address(),
        "worker_pid": os.getpid(),
        "worker_gpu_ids": ",".join(str(i) for i in ray.get_gpu_ids()),
        "worker_device": str(device),
    }


def assigned_device() -> torch.device:
    """The (first) GPU Ray assigned to this process, else the CPU (:func:`gpu_device`)."""
    return gpu_device([str(i) for i in ray.get_gpu_ids()])


def gpu_device(gpus: list[str]) -> torch.device:
    """The CUDA device of Ray's GPU id ``gpus[0]``, the CPU without one.

    Ray sets ``CUDA_VISIBLE_DEVICES`` to a worker's assigned GPUs (a pack server, which asks
    for none, sees the node's list): the id's position there is its CUDA index; where Ray
    leaves it alone (``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES``) the id is the physical
    index. Where torch sees no CUDA although Ray assigned a GPU (GPUs declared to Ray for
    scheduling only, e.g. ``ray start --num-gpus=1`` on a CPU machine), the trial trains on
    the CPU: it still holds its share of the GPU, so Ray's placement is unchanged.
    """
    if not gpus or not torch.cuda.is_available():
        return torch.device("cpu")
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
    if gpus[0] in visible:
        return torch.device(f"cuda:{visible.index(gpus[0])}")
    return torch.device(f"cuda:{int(gpus[0])}" if gpus[0].isdigit() else "cuda")


# How many trials this process has entered: Tune reuses a trial's actor for the next one
# (reuse_actors), and only the first pays for the process's start and imports.
_trials_entered = 0


def trial_started() -> tuple[PhaseTimer, dict]:
    """A trial's phase timer, started on entry into its function, and what its results say of
    its start (:data:`ENTERED_KEY`, :data:`TRIAL_IN_PROCESS_KEY`). The process's first trial
    counts the process's life so far as ``process_start`` (Ray's worker start, its imports,
    the trainable's unpickling; a worker Ray started ahead also its wait)."""
    global _trials_entered
    _trials_entered += 1
    phases, entered = PhaseTimer(), time.time()
    if _trials_entered == 1:
        phases.add("process_start", max(0.0, entered - psutil.Process().create_time()))
    return phases, {ENTERED_KEY: entered, TRIAL_IN_PROCESS_KEY: _trials_entered}


def trial_in_process(config: dict, *, base: dict, data_ref: list, threads: int) -> None:
    """Tune function trainable: train the trial right here (single worker)."""
    entered = time.perf_counter()
    phases, start = trial_started()
    torch.set_num_threads(threads)
    cfg = trial_config(ExperimentConfig.model_validate(base), config)
    task: TokenizedTask = ray.get(data_ref[0])
    device = assigned_device()
    sampled = sampler_for(cfg.tracking)  # MLflow system metrics, sampled here

    def report(metrics: dict, folder: Path | None) -> None:
        checkpoint = tune.Checkpoint.from_directory(folder) if folder else None
        result = {**metrics, **worker_identity(device), **sampled(), **start}
        tune.report(result, checkpoint=checkpoint)

    # a trial Tune restarts (its actor died, or `raypeft tune --resume`) continues from its
    # latest checkpoint, which holds the full training state
    with sampled, _checkpoint_folder(tune.get_checkpoint()) as resume_from:
        phases.add("trial_setup", time.perf_counter() - entered)  # config, task, device
        train(
            cfg,
            task,
            report,
            device=device,
            resume_from=resume_from,
            phases=phases,
        )


@contextlib.contextmanager
def _checkpoint_folder(checkpoint):
    """A local folder with the checkpoint's files (downloaded from S3 if need be), or None."""
    if checkpoint is None:
        yield None
        return
    with checkpoint.as_directory() as folder:
        yield Path(folder)


def trial_with_ray_train(config: dict, *, base: dict, data_ref: list, threads: int) -> None:
    """Tune function trainable: run the trial as a Ray Train TorchTrainer (1+ workers)."""
    # why: Ray Train's torch integration loads only in trials that use it
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    cfg = ExperimentConfig.model_validate(base)
    context = tune.get_context()
    trainer = TorchTrainer(
        _train_worker,
        train_loop_config={
            "base": base,
            "params": config,
            "data_ref": data_ref,
            "threads": threads,
        },
        scaling_config=ScalingConfig(**ray_train_scaling(cfg)),
        run_config=RunConfig(
            name=f"{context.get_experiment_name()}-{context.get_trial_id()}",
            storage_path=storage_path(cfg),
            callbacks=[TuneReportCallback()],
            checkpoint_config=CheckpointConfig(num_to_keep=1),
            # a dead worker restarts the worker group from the latest checkpoint; a run
            # started again under the same name (Tune restarting this trial) resumes too
            failure_config=FailureConfig(max_failures=cfg.run.max_failures),
        ),
    )
    trainer.fit()


def _train_worker(loop_config: dict) -> None:
    """One Ray Train worker: the same loop, with DDP when there are several workers."""
    import ray.train  # why: Ray Train's torch integration loads only in its workers
    import ray.train.torch

    torch.set_num_threads(loop_config["threads"])
    cfg = trial_config(ExperimentConfig.model_validate(loop_config["base"]), loop_config["params"])
    task: TokenizedTask = ray.get(loop_config["data_ref"][0])
    context = ray.train.get_context()
    world = context.get_world_size()
    # Ray Train names cuda:N for an assigned GPU even where torch has no CUDA (GPUs declared
    # for scheduling only): train on the CPU there, as in-process trials do
    device = ray.train.torch.get_device() if torch.cuda.is_available() else torch.device("cpu")
    sampled = sampler_for(cfg.tracking)  # MLflow system metrics, sampled here

    def report(metrics: dict, folder: Path | None) -> None:
        checkpoint = ray.train.Checkpoint.from_directory(folder) if folder else None
        metrics = {**metrics, **worker_identity(device), **sampled()}
        ray.train.report(metrics, checkpoint=checkpoint)

    with sampled, _checkpoint_folder(ray.train.get_checkpoint()) as resume_from:
        train(
            cfg,
            task,
            report,
            device=device,
            wrap_model=ray.train.torch.prepare_model if world > 1 else None,
            rank=context.get_world_rank(),
            world_size=world,
            resume_from=resume_from,
        )


def use_ray_train(cfg: ExperimentConfig) -> bool:
    """``auto``: in-process for one worker (measured faster, see README), else Ray Train;
    a GPU does not change this (an in-process trial trains on the GPU Ray assigned it);
    replayed trials run in the Tune trial too."""
    runner = cfg.resources.trial_runner
    if runner == "auto":
        return cfg.resources.workers_per_trial > 1
    return runner == "ray_train"


# A cluster's shared storage, named once in every node's environment (cluster/node.sh sources
# ~/.raypeft/cluster.env): a search submitted as a Ray job checkpoints there without a flag.
STORAGE_PATH_ENV = "RAYPEFT_STORAGE_PATH"


def storage_path(cfg: ExperimentConfig) -> str:
    """Where Ray keeps results: ``run.storage_path``, else ``$RAYPEFT_STORAGE_PATH``, else
    Ray's own default ``~/ray_results``; a URI (s3://...) as given, a local path made
    absolute."""
    path = cfg.run.storage_path or os.environ.get(STORAGE_PATH_ENV) or "~/ray_results"
    if "://" in path:
        return path
    return str(Path(path).expanduser().resolve())


# ----------------------------------------------------------------------------- search


def trainable_for(cfg: ExperimentConfig, data_ref: ray.ObjectRef):
    """The Tune trainable of one trial, with what it asks Ray for: a single worker's CPUs and
    (fractional) GPUs in process, or a driver's sliver beside its Ray Train workers."""
    res = cfg.resources
    threads = cfg.train.num_threads or max(1, int(res.cpus_per_worker))
    if res.trial_runner == "replay":  # no training: the recorded curves
        # why: replay_trials reads tables through search.simulate, whose package imports the
        # tuner, which imports this module
        from raypeft.search.replay_trials import load_replay_table, trial_replayed

        replayed = tune.with_parameters(
            trial_replayed,
            base=cfg.model_dump(mode="json"),
            data_ref=[data_ref],
            table=load_replay_table(cfg),
            time_scale=cfg.replay.time_scale,
        )
        return tune.with_resources(replayed, worker_request(cfg))
    with_ray_train = use_ray_train(cfg)
    fn = trial_with_ray_train if with_ray_train else trial_in_process
    wrapped = tune.with_parameters(
        fn, base=cfg.model_dump(mode="json"), data_ref=[data_ref], threads=threads
    )
    if with_ray_train:
        return tune.with_resources(wrapped, DRIVER_RESOURCES)
    return tune.with_resources(wrapped, worker_request(cfg))
