"""SHA-256 digests of a checkpoint folder's files, recorded when it is written and checked
when it is read.

The writer lists every file of the folder in ``digests.json``, written last and atomically
(a temporary file renamed over it): a folder without it was cut off while it was written
(a node lost, ``ray down`` mid-save), a file that differs from its digest was damaged after
(a truncated upload, a bad disk). Readers name the files they need; each must be listed and
match, else :class:`~raypeft.errors.DamagedArtefact`, one line naming the file and the fault.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from raypeft.errors import DamagedArtefact

DIGESTS_FILE = "digests.json"
ALGORITHM = "sha256"


def file_digest(path: Path) -> str:
    """``sha256:<hex>`` of a file's bytes."""
    digest = hashlib.new(ALGORITHM)
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return f"{ALGORITHM}:{digest.hexdigest()}"


def record_digests(folder: Path) -> dict[str, str]:
    """Digest every file under ``folder`` (paths relative to it, ``/``-separated) into its
    ``digests.json``; call it once the folder is complete. Returns what it recorded."""
    folder = Path(folder)
    digests = {
        path.relative_to(folder).as_posix(): file_digest(path)
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name != DIGESTS_FILE and not path.name.startswith(".")
    }
    write_digests(folder, digests)
    return digests


def write_digests(folder: Path, digests: Mapping[str, str]) -> None:
    """``folder/digests.json``, all or nothing even if the writer dies midway (a temporary
    file renamed over it)."""
    partial = Path(folder) / f".{DIGESTS_FILE}.partial"
    partial.write_text(json.dumps(dict(digests), indent=1, sort_keys=True))
    os.replace(partial, Path(folder) / DIGESTS_FILE)


def read_digests(folder: Path) -> dict[str, str]:
    """The digests a folder's writer recorded (DamagedArtefact when absent or unreadable)."""
    path = Path(folder) / DIGESTS_FILE
    if not path.is_file():
        raise DamagedArtefact(
            folder,
            DIGESTS_FILE,
            "missing (the checkpoint was cut off while it was written, or written by a "
            "raypeft that recorded no digests)",
        )
    try:
        digests = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DamagedArtefact(
            folder, DIGESTS_FILE, f"unreadable ({exc.__class__.__name__})"
        ) from None
    if not isinstance(digests, dict) or not all(isinstance(v, str) for v in digests.values()):
        raise DamagedArtefact(folder, DIGESTS_FILE, "not a mapping of file names to digests")
    return digests


def check_digests(
    folder: Path,
    names: Iterable[str],
    recorded: Mapping[str, str] | None = None,
    recorder: str | None = None,
) -> None:
    """Every file of ``names`` exists under ``folder`` and matches its digest: ``recorded``
    (e.g. the digests on the model's MLflow run) or else the folder's ``digests.json``.

    ``recorder`` names who recorded ``recorded`` (``run <id>``): a file that differs is then
    said to be another model's or damaged, since a folder swapped whole brings its own
    matching ``digests.json``."""
    folder = Path(folder)
    expected = dict(recorded) if recorded is not None else read_digests(folder)
    for name in names:
        path = folder / name
        if name not in expected:
            raise DamagedArtefact(folder, name, "no digest recorded for it")
        if not path.is_file():
            raise DamagedArtefact(folder, name, "missing (its digest was recorded when written)")
        if file_digest(path) != expected[name]:
            raise DamagedArtefact(folder, name, _differs(path, recorder))


def _differs(path: Path, recorder: str | None) -> str:
    """What is wrong with a file whose digest is not the recorded one."""
    size = f"{path.stat().st_size} bytes whose {ALGORITHM} differs from the digest"
    if recorder:  # the folder may be another model's, swapped in with its own digests.json
        return f"damaged or replaced ({size} {recorder} recorded when it trained)"
    return f"damaged ({size} recorded when it was written)"
