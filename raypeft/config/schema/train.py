"""The ``train`` section: the training loop every method shares (DePT's Table 10 defaults)."""

from __future__ import annotations

import math
from typing import Any, Literal, get_args

from pydantic import Field, field_validator, model_validator

from raypeft.config.space import StrictModel

# what train.precision may say (raypeft.modeling.precision resolves it on a device)
PrecisionSetting = Literal["auto", "fp32", "bf16", "fp16"]
PRECISIONS: tuple[str, ...] = get_args(PrecisionSetting)


class TrainConfig(StrictModel):
    """The training loop shared by every method (defaults follow DePT's Table 10)."""

    max_steps: int = Field(1000, ge=1)
    batch_size: int = Field(16, ge=1, description="global batch size (split across workers)")
    eval_batch_size: int = Field(64, ge=1)
    eval_every: int = Field(100, ge=1, description="evaluate (and report to Tune) every k steps")
    head_lr: float = Field(1e-3, gt=0, description="learning rate of the task head")
    warmup_ratio: float = Field(
        0.06, ge=0, lt=1, description="linear schedule: warm-up share of max_steps"
    )
    schedule: Literal["linear", "constant"] = Field(
        "linear",
        description="learning-rate schedule: linear (warm-up over warmup_ratio, then linear "
        "decay to zero: DePT's) or constant (every step at the set rates, no warm-up, no "
        "decay: IDPG's Table 4; warmup_ratio is not used)",
    )
    weight_decay: float = Field(0.01, ge=0)
    adam_eps: float = Field(1e-6, gt=0)
    adam_betas: tuple[float, float] = (0.9, 0.98)
    max_grad_norm: float | None = Field(1.0, gt=0)
    seed: int = 42
    num_threads: int | None = Field(
        None, ge=1, description="torch threads per worker (default: its CPUs)"
    )
    precision: PrecisionSetting = Field(
        "auto",
        description="what the frozen backbone computes in; trainable tensors and optimizer "
        "state stay fp32. auto: bf16 where the hardware runs it fast (CUDA compute "
        "capability >= 8, a CPU with AVX512-BF16 or AMX), else fp32; fp16: CUDA only",
    )
    backbone_dropout: float | Literal["config"] = Field(
        "config",
        description="the frozen backbone's dropout while the method trains: config (its own "
        "rates, as the papers train: 0.1 for BERT, RoBERTa and T5), 0 (none: the backbone "
        "stays in eval mode) or a rate in (0, 1) for every dropout of the backbone and its "
        "head. Evaluation never drops out",
    )

    @field_validator("backbone_dropout", mode="before")
    @classmethod
    def _dropout_rate(cls, value: Any) -> Any:
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if number and not math.isfinite(value):
            raise ValueError(f"`backbone_dropout` must be a finite number, but got {value}")
        if value != "config" and not (number and 0 <= value < 1):
            why = " (YAML reads off/no/false as a boolean: write 0)" if value is False else ""
            raise ValueError(
                "`backbone_dropout` must be config or a rate with `0 <= rate < 1` (0: no "
                f"dropout), but got {value!r}{why}"
            )
        return value

    @model_validator(mode="after")
    def _eval_every_fits(self) -> TrainConfig:
        if self.eval_every > self.max_steps:
            raise ValueError(
                "`eval_every <= max_steps` must hold, but got "
                f"(eval_every={self.eval_every}, max_steps={self.max_steps})"
            )
        return self
