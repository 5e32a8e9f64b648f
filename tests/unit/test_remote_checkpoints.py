"""A trial's checkpoint on remote storage (S3 on a cluster) read back after a resumed search:
the folder Tune's snapshot names may have been deleted since (a finished trial keeps only its
last checkpoint, raypeft.search.superseded), and the newest beside it is then the one read.

The remote filesystem is pyarrow's SubTreeFileSystem over a temp folder: not a
LocalFileSystem, so the checkpoint is downloaded as from S3 (Ray's Checkpoint.to_directory)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyarrow.fs import LocalFileSystem, SubTreeFileSystem
from ray.train import Checkpoint

from raypeft.search.superseded import delete_superseded
from raypeft.tracking.callback import checkpoint_dir, checkpoints_beside


def trial_folder(root: Path, *indices: int) -> SubTreeFileSystem:
    for index in indices:
        folder = root / "trial" / f"checkpoint_{index:06d}"
        folder.mkdir(parents=True)
        (folder / "step.txt").write_text(str(index))
    return SubTreeFileSystem(str(root), LocalFileSystem())


def test_a_deleted_checkpoint_is_read_from_the_newest_beside_it(tmp_path):
    remote = trial_folder(tmp_path / "bucket", 3, 8)
    named = Checkpoint("trial/checkpoint_000005", filesystem=remote)  # deleted since
    folder = checkpoint_dir(named, None, None)
    assert (folder / "step.txt").read_text() == "8"
    assert not folder.is_relative_to(tmp_path / "bucket")  # downloaded, not read in place


def test_a_checkpoint_that_is_there_is_read_as_named(tmp_path):
    remote = trial_folder(tmp_path / "bucket", 3, 8)
    folder = checkpoint_dir(Checkpoint("trial/checkpoint_000003", filesystem=remote), None, None)
    assert (folder / "step.txt").read_text() == "3"


def test_no_checkpoint_left_is_the_storage_error(tmp_path):
    remote = trial_folder(tmp_path / "bucket")
    (tmp_path / "bucket" / "trial").mkdir(parents=True)
    with pytest.raises(FileNotFoundError):
        checkpoint_dir(Checkpoint("trial/checkpoint_000005", filesystem=remote), None, None)


def test_superseded_checkpoints_are_the_older_ones_beside(tmp_path):
    remote = trial_folder(tmp_path / "bucket", 1, 2, 10)
    assert checkpoints_beside(remote, "trial/checkpoint_000002") == [
        "trial/checkpoint_000001",
        "trial/checkpoint_000002",
        "trial/checkpoint_000010",
    ]
    assert delete_superseded(remote, "trial/checkpoint_000002") == ["trial/checkpoint_000001"]
    assert checkpoints_beside(remote, "trial/x") == [
        "trial/checkpoint_000002",
        "trial/checkpoint_000010",
    ]
