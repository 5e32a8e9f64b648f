"""Resumable training state: what a restarted trial needs to continue where it stopped.

Every checkpoint a trial reports holds, next to its best model, a ``resume/`` folder with the
current trainable tensors, the optimizer's and LR schedule's state, the RNG state (the CPU's,
and the GPU's where training runs on one: the backbone's dropout draws from it) and the
loop's counters. A trial restarted by Ray (a worker killed, a node lost, the driver resumed
with ``raypeft tune --resume``) loads it and continues at the same step on the same batches,
so it ends exactly where an uninterrupted trial would.

No pickles: tensors go to safetensors, everything else to JSON.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

RESUME_DIR = "resume"
_TENSORS = "state.safetensors"
_STATE = "state.json"
# LoopState fields that state.json leaves out
_NOT_SAVED = ("best_state", "resumed_from", "restarted_because", "wall_before")


@dataclass
class LoopState:
    """The training loop's counters and its best evaluation so far."""

    step: int = 0
    seen: int = 0  # training examples over all workers
    train_time: float = 0.0  # seconds spent in training steps (throughput)
    # the trial's seconds at its last evaluation, over every process that ran it: a resumed
    # trial's clock goes on from its checkpoint's instead of starting again at 0
    wall_time: float = 0.0
    best: dict[str, float] = field(default_factory=dict)  # best validation metrics + step
    # trainable tensors at the best evaluation (not serialised with the loop state: they are
    # the checkpoint's top-level trainable.safetensors)
    best_state: dict[str, torch.Tensor] | None = field(default=None, repr=False)
    # the step this process continued from when it resumed a trial (not serialised either)
    resumed_from: int | None = field(default=None, repr=False)
    # why a restarted trial started over instead of resuming (its checkpoint was unusable)
    restarted_because: str | None = field(default=None, repr=False)
    # the seconds earlier processes spent on the trial, up to the checkpoint this one resumed
    # from (not serialised: it is the saved wall_time, read back)
    wall_before: float = field(default=0.0, repr=False)

    def count_step(self, examples: int, seconds: float) -> None:
        """One training step done, on ``examples`` (over all workers) in ``seconds``."""
        self.step += 1
        self.seen += examples
        self.train_time += seconds

    def keep_best(self, record: dict[str, float], trainable: dict[str, torch.Tensor]) -> None:
        """A new best evaluation: its metrics (``record``) and a copy of the tensors."""
        self.best = record
        self.best_state = {k: v.clone() for k, v in trainable.items()}


def save_resume_state(
    folder: Path,
    trainable: dict[str, torch.Tensor],
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    loop: LoopState,
) -> None:
    """Write ``folder/resume/``: current tensors, optimizer and schedule, RNG, counters."""
    out = Path(folder) / RESUME_DIR
    out.mkdir(parents=True, exist_ok=True)
    opt = optimizer.state_dict()
    tensors = {f"trainable.{k}": v for k, v in trainable.items()}
    scalars: dict[str, dict[str, float]] = {}
    for index, state in opt["state"].items():
        for name, value in state.items():
            if torch.is_tensor(value):
                tensors[f"optimizer.{index}.{name}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(index), {})[name] = value
    tensors["rng.torch"] = torch.get_rng_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        # dropout on a GPU draws from the current device's generator, not the CPU's
        tensors["rng.cuda"] = torch.cuda.get_rng_state()
    save_file(tensors, str(out / _TENSORS))
    loop_json = {k: v for k, v in asdict(loop).items() if k not in _NOT_SAVED}
    state = {
        "loop": loop_json,
        "optimizer_param_groups": opt["param_groups"],
        "optimizer_scalars": scalars,
        "scheduler": scheduler.state_dict(),
    }
    (out / _STATE).write_text(json.dumps(state, indent=1))


def has_resume_state(folder: Path | None) -> bool:
    return folder is not None and (Path(folder) / RESUME_DIR / _STATE).is_file()


def load_resume_state(
    folder: Path,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> tuple[dict[str, torch.Tensor], LoopState]:
    """Restore optimizer, schedule and RNG in place; return the current trainable tensors
    (to load into the model) and the loop state."""
    src = Path(folder) / RESUME_DIR
    tensors = load_file(str(src / _TENSORS))
    state = json.loads((src / _STATE).read_text())
    per_param: dict[int, dict] = {}
    for key, value in tensors.items():
        if key.startswith("optimizer."):
            _, index, name = key.split(".", 2)
            per_param.setdefault(int(index), {})[name] = value
    for index, values in state["optimizer_scalars"].items():
        per_param.setdefault(int(index), {}).update(values)
    groups = state["optimizer_param_groups"]
    for group in groups:  # JSON turned tuples into lists
        if "betas" in group:
            group["betas"] = tuple(group["betas"])
    optimizer.load_state_dict({"state": per_param, "param_groups": groups})
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(tensors["rng.torch"])
    if "rng.cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state(tensors["rng.cuda"])
    prefix = "trainable."
    trainable = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
    loop = LoopState(**state["loop"])
    loop.wall_before = loop.wall_time
    return trainable, loop
