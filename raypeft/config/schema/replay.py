"""The ``replay`` section: what replayed trials report instead of training."""

from __future__ import annotations

from pydantic import Field

from raypeft.config.space import StrictModel


class ReplayConfig(StrictModel):
    """``resources.trial_runner: replay``: trials report a recorded learning-curve table's
    values instead of training (``raypeft table`` writes such tables)."""

    table: str | None = Field(
        None,
        description="a learning-curve table (JSON, from `raypeft table`) holding a curve for "
        "every configuration the space can propose; required with trial_runner: replay",
    )
    time_scale: float = Field(
        0.01,
        ge=0,
        description="each evaluation is reported after its recorded seconds times this: 1 as "
        "recorded, 0.01 a 4-minute trial in 2.4 s, 0 at once",
    )
