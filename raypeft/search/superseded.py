"""A finished trial keeps its latest checkpoint only, deleted by raypeft, not by Tune.

With ``CheckpointConfig(num_to_keep=1)`` Tune deletes a trial's older checkpoint itself, and to
keep its experiment snapshot from naming a deleted one it then writes the snapshot at once,
every trial's state in it, at each trial checkpoint (``sync_every_n_trial_checkpoints``, Ray
issue 31613). A search's trials checkpoint at every improving evaluation, so the snapshots cost
grew with trials x checkpoints: quadratic in the number of trials (measured in issue 41: 13 of
104 s at 200 zero-time trials). raypeft asks Tune to keep every checkpoint (no forced
snapshots: Tune's own period, ~5% of the time) and deletes a trial's superseded checkpoints
when it has finished and its model is logged. A snapshot older than the deletion may still
name a deleted checkpoint; a trial restored from it goes on from the newest intact checkpoint
beside it (:func:`raypeft.training.checkpoints.intact_checkpoint`), its last one.
"""

from __future__ import annotations

import logging
import posixpath

from pyarrow import fs
from ray.tune import Callback
from ray.tune.experiment import Trial

from raypeft.tracking.callback import checkpoints_beside

log = logging.getLogger(__name__)


class SupersededCheckpoints(Callback):
    """Delete a finished trial's checkpoints but its latest (after the callbacks before it in
    Tune's list have read it: place it last)."""

    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial, **info):
        latest = trial.checkpoint  # None for Ray Train trials: Train keeps its own
        if latest is not None:
            delete_superseded(latest.filesystem, latest.path)


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
