"""The one folder where raypeft keeps what it computes once and reuses across runs: IPT's
pretrained tables (``ipt/``), the GPU probe's results (``gpu_probe.json``).

``$RAYPEFT_CACHE_DIR`` when set, else ``$XDG_CACHE_HOME/raypeft``, else
``~/.cache/raypeft``. Every place that caches calls :func:`cache_root`; none reads the
variables itself, so one setting moves (or isolates, as the tests do) all of it.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

CACHE_VARIABLE = "RAYPEFT_CACHE_DIR"
# IPT's cache once had a variable of its own; still read where the new one is unset, so a
# setting (e.g. a test session's private folder) does not silently fall back to ~/.cache
DEPRECATED_VARIABLE = "RAYPEFT_CACHE"


def cache_root() -> Path:
    """The cache folder (not created here: the caller creates what it writes)."""
    folder = os.environ.get(CACHE_VARIABLE) or _deprecated_setting()
    if folder:
        return Path(folder).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    # the XDG spec: a relative XDG_CACHE_HOME is invalid and ignored
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "raypeft"


def _deprecated_setting() -> str | None:
    folder = os.environ.get(DEPRECATED_VARIABLE)
    if folder:
        warnings.warn(
            f"{DEPRECATED_VARIABLE} is deprecated: set {CACHE_VARIABLE} to the same folder "
            "(raypeft's one cache folder)",
            FutureWarning,
            stacklevel=3,
        )
    return folder
