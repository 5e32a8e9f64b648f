"""Keys of the results trials report that are not metrics: shared by the training loop, the
searcher, the MLflow tracker and the progress printer (a module with no heavy imports)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# A trial's last result carries this key when training could not go on (the loss became NaN
# or infinite): the trial ends normally, so Ray does not retry it from its checkpoint (it
# would diverge the same way), and raypeft records it as failed with the message as reason.
FAILURE_KEY = "raypeft_failure"

# Reported after a restart from a checkpoint (worker killed, search resumed): the step the
# trial continued from.
RESUMED_KEY = "resumed_from_step"
# Reported instead after a restart whose checkpoint was incomplete or damaged
# (raypeft.training.digests): why the trial started over from step 0.
RESTARTED_KEY = "restarted_because"

# Where the (rank-0) training process runs (raypeft.search.trial_runners.worker_identity);
# with RESUMED_KEY and RESTARTED_KEY these are tagged raypeft.<key> on the trial's MLflow run.
WORKER_KEYS = ("worker_node_id", "worker_node_ip", "worker_pid")

# What the trial's frozen backbone computes in: ``train.precision`` resolved on the trial's
# device (auto -> bf16 or fp32); logged as the param PRECISION_PARAM of the trial's MLflow run.
PRECISION_KEY = "precision_resolved"
PRECISION_PARAM = "train.precision_resolved"

# A trial trained in a pack (raypeft.training.pack) reports, beside what it reports alone: the
# pack's id (not a metric), how many trials the pack held at that evaluation, and the share of
# the pack's prompt slots that were padding over its steps so far (members whose prompts
# differ in length are padded to the longest: raypeft.modeling.packed.PackShape).
PACK_ID_KEY = "pack_id"
PACK_SIZE_KEY = "pack_size"
PACK_PADDING_KEY = "pack_padding_waste"

# The trial's own length in steps, in every evaluation it reports, so that nothing downstream
# recomputes it from the experiment file (where train.max_steps may be searched).
TRIAL_STEPS_KEY = "trial_max_steps"

# Which evaluation of its trial a result is: 1, 2, ... counted from the trial's step 0. The
# schedulers' clock (their time_attr): Tune's own training_iteration counts the results the
# trial reported over all its processes, so a trial started over after its checkpoint was
# damaged would be judged at a rung it has not reached (its count goes on while its steps
# start again); a trial resumed from a checkpoint continues both alike.
EVALUATION_KEY = "evaluation"


def evaluation_number(step: int, eval_every: int) -> int:
    """Which evaluation of a trial the one at ``step`` is: a trial evaluates every
    ``eval_every`` steps and at its last step (which may fall between two)."""
    return -(-step // eval_every)  # ceil: the last step's evaluation is the next one


def ran_to_end(result: Mapping[str, Any]) -> bool:
    """Whether ``result`` (a trial's last) came from the trial's own last step; else the
    trial was stopped early. A result that does not carry the trial's length (a diverged
    trial's last) did not run to its end."""
    steps = result.get(TRIAL_STEPS_KEY)
    return isinstance(steps, (int, float)) and result.get("step", 0) >= steps


# Where a trial's seconds went (raypeft.training.phases): every result carries, under
# ``phase_s/<name>``, the seconds each phase of the trial's process took so far, cumulative
# from the entry into the trial's function (a result's own report is in the next one's).
PHASE_PREFIX = "phase_s/"
# When the trial's function was entered (time.time(), comparable with the driver's clock on
# one machine), and which trial this is in its process (1: the first; more: a reused actor).
ENTERED_KEY = "trial_entered_at"
TRIAL_IN_PROCESS_KEY = "trial_in_process"
