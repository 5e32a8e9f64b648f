"""Where a trial's checkpoint is, for the tracker that logs its model: a Ray Train checkpoint
from the path Ray reports, the local folder of a trial's latest checkpoint (downloaded from
remote storage once), and the checkpoint folders beside one."""

from __future__ import annotations

import posixpath
from pathlib import Path

from pyarrow.fs import FileSelector, FileSystem, FileType, LocalFileSystem
from ray.train import Checkpoint


def train_checkpoint(path: str, storage: str | None) -> Checkpoint:
    """A Ray Train checkpoint from the path Ray reports for it (``checkpoint_path``): a path
    within the run's storage filesystem, which for remote storage carries no scheme
    (``bucket/ray_results/...`` on S3), so the filesystem comes from the search's
    ``storage`` URI."""
    if storage and "://" in storage and "://" not in path:
        filesystem, _ = FileSystem.from_uri(storage)
        return Checkpoint(path, filesystem=filesystem)
    return Checkpoint(path)


def checkpoint_dir(
    tune_checkpoint, train_checkpoint_path: str | None, storage: str | None = None
) -> Path | None:
    """Local folder of a trial's latest (= best) checkpoint, either runner.

    In-process trials report Tune checkpoints; Ray Train trials report their checkpoint's
    storage path as the ``checkpoint_path`` metric of the result that carried it (a path in
    ``storage``, the search's ``run.storage_path``).
    """
    checkpoint = tune_checkpoint
    if checkpoint is None and train_checkpoint_path:
        checkpoint = train_checkpoint(train_checkpoint_path, storage)
    if checkpoint is None:
        return None
    if isinstance(checkpoint.filesystem, LocalFileSystem):
        return Path(checkpoint.path)  # read in place: no copy
    try:
        return Path(checkpoint.to_directory())  # remote storage (e.g. S3): download once
    except FileNotFoundError:
        # a snapshot older than the trial's end names a checkpoint deleted since
        # (raypeft.search.superseded): the newest beside it is the trial's last, its best
        beside = checkpoints_beside(checkpoint.filesystem, checkpoint.path)
        if not beside:
            raise
        return Path(Checkpoint(beside[-1], filesystem=checkpoint.filesystem).to_directory())


CHECKPOINT_PREFIX = "checkpoint_"  # Tune's name for a trial's checkpoint folders


def checkpoints_beside(filesystem: FileSystem, path: str) -> list[str]:
    """The paths of the checkpoint folders in the folder that holds ``path`` (a trial's
    checkpoint on ``filesystem``, local or remote; it need not exist any more), oldest first
    (Tune's indices are zero-padded)."""
    parent = posixpath.dirname(path.rstrip("/"))
    found = filesystem.get_file_info(FileSelector(parent, allow_not_found=True))
    return sorted(
        info.path
        for info in found
        if info.type == FileType.Directory and info.base_name.startswith(CHECKPOINT_PREFIX)
    )
