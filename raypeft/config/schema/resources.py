"""The ``resources`` section: what one trial asks Ray for (workers, CPUs, GPUs or a share of
one, packs), each amount checked against Ray's rules."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from raypeft.config.space import StrictModel


class ResourcesConfig(StrictModel):
    """What one trial asks Ray for: ``workers_per_trial`` workers, each with
    ``cpus_per_worker`` CPUs and ``gpus_per_worker`` GPUs."""

    workers_per_trial: int = Field(1, ge=1, description="Ray Train workers per trial (DDP)")
    cpus_per_worker: float = Field(1, gt=0)
    gpus_per_worker: float = Field(
        0,
        ge=0,
        description="GPUs per worker: a fraction in (0, 1] shares one GPU between trials (0.25: "
        "four trials per GPU, Ray's fractional GPUs; memory is not partitioned), or a whole "
        "number. 0 (default): none, 1 with use_gpu: true, or chosen by use_gpu: auto",
    )
    use_gpu: bool | Literal["auto"] = Field(
        "auto",
        description="auto (default): trials go to a GPU when the Ray cluster has one, else the "
        "CPU; how many share a GPU (or train as a pack) is chosen at the start of the search "
        "from a short probe of step time and memory, cached per backbone, method and GPU "
        "(docs/performance.md). true: shorthand for gpus_per_worker: 1; beside a "
        "gpus_per_worker > 0 it is redundant (that amount is used), and `use_gpu: false` "
        "beside it is an error. false: the CPU",
    )
    trial_runner: Literal["auto", "in_process", "ray_train", "replay"] = Field(
        "auto",
        description="auto: single-worker trials train inside the Tune trainable (faster, see "
        "README), multi-worker trials in a Ray Train TorchTrainer, on CPU or GPU alike; "
        "replay: no training, each trial reports the curve replay.table recorded for its "
        "configuration (a demo of a whole search; the platform's own cost measured)",
    )
    trials_per_worker: int = Field(
        1,
        ge=1,
        le=64,
        description="K > 1: trials train in packs of up to K on one worker, sharing its frozen "
        "backbone (one fused forward and backward pass per step); each is still its own trial "
        "(Optuna trial, MLflow run, checkpoint, scheduler decision) and asks Ray for 1/K of a "
        "worker's CPUs and GPUs (docs/packing.md). Single-worker trials only",
    )

    compile_packs: bool = Field(
        False,
        description="packs whose members step fused (on an encoder; docs/packing.md): compile the "
        "pack's forward pass and losses with torch.compile, its shapes static while its "
        "membership holds (every slot a full batch, prompts padded to a multiple of 16). "
        "Exact as the eager pack; it pays a compilation per membership change and is off "
        "until measured to win (docs/packing.md)",
    )

    @field_validator("trials_per_worker")
    @classmethod
    def _packs_are_single_worker(cls, value: int, info: ValidationInfo) -> int:
        # a pack is one process on one device: DDP workers, Ray Train and several GPUs
        # per worker cannot hold one
        if value == 1:
            return value
        workers = info.data.get("workers_per_trial", 1)
        if workers > 1:
            raise ValueError(
                "a pack is one process on one device, so `trials_per_worker == 1` must hold "
                f"with workers_per_trial={workers} (DDP trials do not pack), but got {value}"
            )
        if info.data.get("trial_runner") == "ray_train":
            raise ValueError(
                "packed trials train in their worker's process, so `trials_per_worker == 1` "
                f"must hold with trial_runner: ray_train, but got {value}; use auto or in_process"
            )
        gpus = info.data.get("gpus_per_worker", 0)
        if gpus > 1:
            raise ValueError(
                "a pack trains on one device, so `gpus_per_worker <= 1` must hold with "
                f"trials_per_worker={value}, but got gpus_per_worker={gpus:g}"
            )
        cpus = info.data.get("cpus_per_worker", 1)
        if min(cpus / value, gpus / value if gpus else 1) < 1e-4:
            raise ValueError(
                "each trial of a pack asks Ray for 1/trials_per_worker of a worker's CPUs and "
                "GPUs, so that share must be >= 0.0001 (Ray's smallest amount), but got "
                f"cpus_per_worker={cpus:g}, gpus_per_worker={gpus:g}, trials_per_worker={value}"
            )
        return value

    @field_validator("gpus_per_worker")
    @classmethod
    def _ray_gpu_amount(cls, value: float, info: ValidationInfo) -> float:
        # Ray's rule for resource amounts: a fraction of one unit, or whole units; it counts
        # in steps of 0.0001, so a smaller fraction would be rounded to no GPU at all
        if value > 1 and not float(value).is_integer():
            raise ValueError(
                "`0 < gpus_per_worker <= 1` (trials share a GPU) or a whole number of GPUs "
                f"must hold, as Ray places GPUs, but got gpus_per_worker={value:g}"
            )
        if 0 < value < 1e-4:
            raise ValueError(
                "`gpus_per_worker >= 0.0001` must hold (Ray's smallest fraction), but got "
                f"{value:g}"
            )
        workers = info.data.get("workers_per_trial", 1)
        if workers > 1 and 0 < value < 1:
            # Ray packs fractions onto one GPU, and NCCL refuses two DDP ranks on one GPU
            raise ValueError(
                "a fraction of a GPU is for trials sharing one; DDP workers each need whole "
                f"GPUs, so `gpus_per_worker >= 1` must hold with workers_per_trial={workers}, "
                f"but got {value:g}"
            )
        return value

    @field_validator("use_gpu", mode="before")
    @classmethod
    def _true_false_or_auto(cls, value: Any) -> Any:
        # one message for the union of a bool and "auto" (pydantic would give one per member)
        if isinstance(value, str) and value.strip().lower() == "auto":
            return "auto"
        try:
            return TypeAdapter(bool).validate_python(value)
        except ValidationError:
            raise ValueError(f"must be true, false or auto (got {value!r})") from None

    @field_validator("use_gpu")
    @classmethod
    def _use_gpu_agrees(cls, value: bool | str, info: ValidationInfo) -> bool | str:
        # runs only when use_gpu is given; gpus_per_worker (declared before) is validated
        gpus = info.data.get("gpus_per_worker", 0)
        if value is False and gpus > 0:
            raise ValueError(
                f"`use_gpu: false` contradicts gpus_per_worker={gpus:g}: drop use_gpu "
                "(gpus_per_worker > 0 uses a GPU)"
            )
        return value

    @model_validator(mode="before")
    @classmethod
    def _gpus_imply_use_gpu(cls, data: Any) -> Any:
        # a dumped config then reads `use_gpu: true` beside its fraction, and validates again
        if isinstance(data, dict) and "use_gpu" not in data:
            gpus = data.get("gpus_per_worker")
            if isinstance(gpus, (int, float)) and gpus > 0:
                return {**data, "use_gpu": True}
        return data

    @property
    def gpus(self) -> float:
        """GPUs per worker: ``gpus_per_worker``, else 1 with ``use_gpu: true``, else 0. An
        unresolved ``use_gpu: auto`` counts as 0 (its fallback, the CPU) until the search
        resolves it on the cluster (:func:`raypeft.search.gpu_plan.plan_resources`)."""
        if self.use_gpu == "auto":
            return 0.0
        return float(self.gpus_per_worker or (1 if self.use_gpu else 0))

    @property
    def gpu_auto(self) -> bool:
        """``use_gpu: auto``: the search decides GPU or CPU, and the sharing, when it starts."""
        return self.use_gpu == "auto"
