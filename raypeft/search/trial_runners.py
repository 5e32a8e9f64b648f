"""How one trial runs: in the Tune function trainable (one worker), or as a Ray Train
``TorchTrainer`` (one or more DDP workers). Either way it runs :func:`raypeft.training.loop.train`,
continuing from the trial's latest checkpoint when Ray restarted it.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import ray
import torch
from ray import tune

from raypeft.config.schema import ExperimentConfig, trial_config
from raypeft.data import TokenizedTask
from raypeft.tracking.system_metrics import sampler_for
from raypeft.training.loop import train

# The Tune function that drives a Ray Train run needs no CPU of its own; Ray rejects an
# all-zero request, so it asks for a sliver of memory instead (works on any cluster).
DRIVER_RESOURCES = {"CPU": 0, "memory": 64 * 1024**2}


def worker_identity() -> dict[str, Any]:
    """Where the (rank-0) training process runs: tagged on the trial's MLflow run.

    Tune's own ``node_ip``/``pid`` keys name the trial's Tune actor, which for Ray Train
    trials is not the process that trains; on one machine several nodes share an IP.
    """
    return {
        "worker_node_id": ray.get_runtime_context().get_node_id(),
        "worker_node_ip": ray.util.get_node_ip_address(),
        "worker_pid": os.getpid(),
    }


def trial_in_process(config: dict, *, base: dict, data_ref: list, threads: int) -> None:
    """Tune function trainable: train the trial right here (single worker)."""
    torch.set_num_threads(threads)
    cfg = trial_config(ExperimentConfig.model_validate(base), config)
    task: TokenizedTask = ray.get(data_ref[0])
    sampled = sampler_for(cfg.tracking)  # MLflow system metrics, sampled here (issue 16)

    def report(metrics: dict, folder: Path | None) -> None:
        checkpoint = tune.Checkpoint.from_directory(folder) if folder else None
        tune.report({**metrics, **worker_identity(), **sampled()}, checkpoint=checkpoint)

    use_cuda = cfg.resources.use_gpu and torch.cuda.is_available()  # Tune set the visible GPU
    # a trial Tune restarts (its actor died, or `raypeft tune --resume`) continues from its
    # latest checkpoint, which holds the full training state
    with sampled, _checkpoint_folder(tune.get_checkpoint()) as resume_from:
        train(
            cfg,
            task,
            report,
            device=torch.device("cuda" if use_cuda else "cpu"),
            resume_from=resume_from,
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
    sampled = sampler_for(cfg.tracking)  # MLflow system metrics, sampled here (issue 16)

    def report(metrics: dict, folder: Path | None) -> None:
        checkpoint = ray.train.Checkpoint.from_directory(folder) if folder else None
        ray.train.report({**metrics, **worker_identity(), **sampled()}, checkpoint=checkpoint)

    with sampled, _checkpoint_folder(ray.train.get_checkpoint()) as resume_from:
        train(
            cfg,
            task,
            report,
            device=ray.train.torch.get_device(),
            wrap_model=ray.train.torch.prepare_model if world > 1 else None,
            rank=context.get_world_rank(),
            world_size=world,
            resume_from=resume_from,
        )


def use_ray_train(cfg: ExperimentConfig) -> bool:
    """``auto``: in-process for one worker (measured faster, see README), else Ray Train."""
    runner = cfg.resources.trial_runner
    if runner == "auto":
        return cfg.resources.workers_per_trial > 1 or cfg.resources.use_gpu
    return runner == "ray_train"


def storage_path(cfg: ExperimentConfig) -> str:
    """Where Ray keeps results: a URI (s3://...) as given, a local path made absolute."""
    path = cfg.run.storage_path or "~/ray_results"  # Ray's own default
    if "://" in path:
        return path
    return str(Path(path).expanduser().resolve())


# ----------------------------------------------------------------------------- search


def trainable_for(cfg: ExperimentConfig, data_ref: ray.ObjectRef):
    res = cfg.resources
    threads = cfg.train.num_threads or max(1, int(res.cpus_per_worker))
    with_ray_train = use_ray_train(cfg)
    fn = trial_with_ray_train if with_ray_train else trial_in_process
    wrapped = tune.with_parameters(
        fn, base=cfg.model_dump(mode="json"), data_ref=[data_ref], threads=threads
    )
    if with_ray_train:
        return tune.with_resources(wrapped, DRIVER_RESOURCES)
    return tune.with_resources(wrapped, {"CPU": res.cpus_per_worker, "GPU": int(res.use_gpu)})
