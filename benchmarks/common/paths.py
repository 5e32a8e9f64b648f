"""Where the benchmarks find the repository, its shipped search and their results."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"  # measured results: data, read by docs and tests
SHIPPED_SEARCH = REPO / "search_spaces" / "dept.yaml"  # the README's main command searches it


def digest(path: Path) -> str:
    """A short content hash of a file: results keyed by it are redone when the file changes."""
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
