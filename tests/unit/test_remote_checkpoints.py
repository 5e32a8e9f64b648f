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

from raypeft.search.superseded import SupersededCheckpoints, delete_superseded
from raypeft.tracking.trial_checkpoints import checkpoint_dir, checkpoints_beside


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


class _Ended:
    """What SupersededCheckpoints reads of a finished Tune trial: its latest checkpoint."""

    def __init__(self, checkpoint: Checkpoint):
        self.checkpoint = checkpoint


def test_superseded_checkpoints_wait_for_two_snapshots_after_the_trials_end(tmp_path):
    """A snapshot Tune wrote while the trial ran names an older checkpoint, and Tune resumed
    from it restores the trial from that one: the older checkpoints go only once two more
    snapshots were written after the trial's end (Tune calls ``get_state`` for each)."""
    remote = trial_folder(tmp_path / "bucket", 1, 2, 3)
    kept = SupersededCheckpoints()
    kept.get_state()  # a snapshot while the trial runs: it names checkpoint_000002, say
    kept.on_trial_complete(0, [], _Ended(Checkpoint("trial/checkpoint_000003", filesystem=remote)))
    kept.get_state()  # the first snapshot that knows the trial ended (its upload under way)
    assert len(checkpoints_beside(remote, "trial/checkpoint_000003")) == 3
    kept.get_state()
    assert checkpoints_beside(remote, "trial/checkpoint_000003") == ["trial/checkpoint_000003"]
    assert kept.waiting == []


@pytest.mark.slow
def test_a_search_that_ends_deletes_what_waited(tmp_path, local_ray):
    """A real Tune run: Tune writes snapshots through the callback's ``get_state`` and ends
    the experiment; each trial keeps its latest checkpoint only."""
    import tempfile

    from ray import tune

    def trainable(config):
        for step in range(3):
            with tempfile.TemporaryDirectory() as folder:
                Path(folder, "step.txt").write_text(str(step))
                tune.report({"step": step}, checkpoint=Checkpoint.from_directory(folder))

    kept = SupersededCheckpoints()
    results = tmp_path / "results"
    tuner = tune.Tuner(
        trainable,
        param_space={"x": tune.grid_search([0, 1])},
        run_config=tune.RunConfig(
            name="kept", storage_path=str(results), callbacks=[kept], verbose=0
        ),
    )
    assert not tuner.fit().errors
    assert kept.snapshots >= 1 and kept.waiting == []
    trials = [p for p in (results / "kept").iterdir() if p.is_dir()]
    assert len(trials) == 2
    for trial in trials:
        assert sorted(p.name for p in trial.glob("checkpoint_*")) == ["checkpoint_000002"]
