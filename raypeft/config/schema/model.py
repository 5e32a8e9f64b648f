"""The ``model`` section: the frozen backbone."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from raypeft.config.space import StrictModel


class ModelConfig(StrictModel):
    """The frozen backbone."""

    name: str = Field(
        "minilm",
        description="Hugging Face id or local path; aliases: minilm (packaged all-MiniLM-L6-v2), "
        "tiny-bert (randomly initialised, for tests)",
    )
    max_length: int = Field(128, ge=8, le=4096, description="s: inputs are padded/truncated to s")
    revision: str | None = Field(None, description="Hub revision (branch, tag or commit)")
    head_pooling: Literal["auto", "first", "mean"] = Field(
        "auto",
        description="what an encoder's task head reads: first (the first position, as "
        "transformers' head and peft: a prompt slot once a prompt is prepended), mean (the "
        "mean of the input's own token states) or auto (mean for sentence encoders whose "
        "sentence-transformers config mean-pools, such as minilm; else first)",
    )
