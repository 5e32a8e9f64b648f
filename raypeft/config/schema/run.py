"""The ``run`` section: where Ray keeps results and checkpoints, how trials survive failures."""

from __future__ import annotations

from pydantic import Field

from raypeft.config.space import StrictModel


class RunConfig(StrictModel):
    """Where Ray keeps results and checkpoints, and how trials survive failures."""

    storage_path: str | None = Field(
        None,
        description="Ray results and checkpoints: a local folder or a URI shared by every "
        "node (s3://bucket/path) (default: $RAYPEFT_STORAGE_PATH, else ~/ray_results)",
    )
    max_failures: int = Field(
        2,
        ge=-1,
        description="restarts of a trial whose worker dies (process killed, node lost), each "
        "from its latest checkpoint; -1: no limit. A diverging loss is never retried",
    )
