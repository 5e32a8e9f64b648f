"""A finished trial keeps its latest checkpoint only, deleted by raypeft, not by Tune.

With ``CheckpointConfig(num_to_keep=1)`` Tune deletes a trial's older checkpoint itself, and to
keep its experiment snapshot from naming a deleted one it then writes the snapshot at once,
every trial's state in it, at each trial checkpoint (``sync_every_n_trial_checkpoints``, Ray
issue 31613). A search's trials checkpoint at every improving evaluation, so the snapshots cost
grew with trials x checkpoints: quadratic in the number of trials (measured in issue 41: 13 of
104 s at 200 zero-time trials). raypeft asks Tune to keep every checkpoint (no forced
snapshots: Tune's own period, ~5% of the time) and deletes a trial's superseded checkpoints
once it has finished, its model is logged, and Tune's experiment snapshot in storage knows it
ended: a snapshot written while it ran names one of its older checkpoints, and Tune, resumed
from that snapshot (a driver or head lost), restores the trial from that checkpoint and fails
it if it is gone (``Trainable.restore``: "Could not recover from checkpoint as it does not
exist on storage anymore", seen in the cluster test's new head). Tune calls a callback's
``get_state`` each time it writes its snapshot (trial states first, then callbacks; one
upload to storage at a time), so the deletion waits for :data:`SNAPSHOTS_BEFORE_DELETING`
snapshots after the trial's end.
"""

from __future__ import annotations

import logging
import posixpath

from pyarrow import fs
from ray.tune import Callback
from ray.tune.experiment import Trial

from raypeft.tracking.trial_checkpoints import checkpoints_beside

log = logging.getLogger(__name__)


# Snapshots written after a trial's end before its superseded checkpoints go: the first
# records the trial ended; its upload has ended by the time Tune writes the second (Tune's
# syncer runs one upload at a time, snapshots come at least seconds apart)
SNAPSHOTS_BEFORE_DELETING = 2


class SupersededCheckpoints(Callback):
    """Delete a finished trial's checkpoints but its latest once Tune's snapshots know it
    ended (after the callbacks before it in Tune's list have read it: place it last)."""

    def __init__(self) -> None:
        self.snapshots = 0  # experiment snapshots Tune has written so far
        self.waiting: list[tuple[int, fs.FileSystem, str]] = []  # (snapshots then, fs, latest)

    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial, **info):
        latest = trial.checkpoint  # None for Ray Train trials: Train keeps its own
        if latest is not None:
            self.waiting.append((self.snapshots, latest.filesystem, latest.path))

    def get_state(self) -> None:
        """Tune is writing its experiment snapshot: delete what waited long enough (no state
        of this callback's own is kept)."""
        self.snapshots += 1
        self._delete(lambda ended: self.snapshots - ended >= SNAPSHOTS_BEFORE_DELETING)
        return None

    def on_experiment_end(self, trials: list[Trial], **info):
        self._delete(lambda ended: True)  # every trial ended: no trial is restored again

    def _delete(self, due) -> None:
        keep = []
        for ended, filesystem, latest in self.waiting:
            if due(ended):
                delete_superseded(filesystem, latest)
            else:
                keep.append((ended, filesystem, latest))
        self.waiting = keep


def delete_superseded(filesystem: fs.FileSystem, latest: str) -> list[str]:
    """Delete the checkpoint folders beside ``latest`` (a path on ``filesystem``, local or
    remote) older than it; the paths deleted. A folder that cannot be deleted is left, with a
    warning: it costs disk, not correctness."""
    name = posixpath.basename(latest.rstrip("/"))
    older = [p for p in checkpoints_beside(filesystem, latest) if posixpath.basename(p) < name]
    deleted = []
    for path in older:
        try:
            filesystem.delete_dir(path)
            deleted.append(path)
        except OSError as exc:
            log.warning("could not delete superseded checkpoint %s: %s", path, exc)
    return deleted
