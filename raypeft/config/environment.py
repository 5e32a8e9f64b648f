"""Environment switches raypeft reads, with one meaning of "set"."""

from __future__ import annotations

import os

TRUE_WORDS = frozenset({"1", "ON", "YES", "TRUE"})


def env_flag(name: str) -> bool:
    """Whether environment variable ``name`` is switched on (``1``, ``on``, ``yes`` or
    ``true``, any case; what huggingface_hub and MLflow accept for their own switches)."""
    return os.environ.get(name, "").strip().upper() in TRUE_WORDS
