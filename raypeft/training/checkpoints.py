"""What a trial's checkpoint folder holds, and how it is written and read back.

The folder every evaluation reports holds the best model so far (its trainable tensors as
safetensors, the resolved config as YAML, the task's labels as JSON: what serving loads),
``resume/``, where training stands now (:mod:`raypeft.training.resume`), and the digests of
all of them (:mod:`raypeft.training.digests`), checked before anything is read back. No
pickles.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import yaml
from safetensors.torch import load_file, save_file

from raypeft.config.redact import redact_config
from raypeft.config.schema import ExperimentConfig
from raypeft.data import TokenizedTask
from raypeft.errors import DamagedArtefact
from raypeft.modeling.build import build_model
from raypeft.modeling.precision import resolve_precision
from raypeft.modeling.prompted import TRAINABLE_FILE, PromptedModel
from raypeft.training.digests import check_digests, read_digests, record_digests
from raypeft.training.resume import (
    LoopState,
    has_resume_state,
    load_resume_state,
    save_resume_state,
)

CONFIG_FILE = "config.yaml"
TASK_FILE = "task.json"  # what inference needs of the task: label names, verbalizers, metrics
# what serving needs of a checkpoint (no resume state, no optimizer), with their digests
MODEL_FILES = (TRAINABLE_FILE, CONFIG_FILE, TASK_FILE)


def task_metadata(task: TokenizedTask) -> dict:
    """What inference needs to know of the task, without loading its data."""
    return {
        "name": task.spec.name,
        "problem": task.spec.problem,
        "num_labels": task.num_labels,
        "label_names": task.label_names,
        "verbalizers": task.verbalizers,
        "metrics": list(task.spec.metrics),
        "text_pair": task.spec.text_pair_column is not None,
    }


def _write_model_files(
    model: PromptedModel,
    cfg: ExperimentConfig,
    folder: Path,
    task: TokenizedTask | None,
    trainable: dict[str, torch.Tensor] | None,
) -> None:
    save_file(
        trainable if trainable is not None else model.trainable_state_dict(),
        str(Path(folder) / TRAINABLE_FILE),
    )
    # what it trained as: the method's derived sizes, and the precision `auto` resolved to on
    # its device (another machine, or this one another day, may resolve `auto` otherwise)
    trained_as = cfg.train.model_copy(update={"precision": model.precision})
    resolved = cfg.model_copy(
        update={"method": cfg.method.resolve(model.dims), "train": trained_as}
    )
    (folder / CONFIG_FILE).write_text(
        yaml.safe_dump(redact_config(resolved.model_dump(mode="json")), sort_keys=False)
    )
    if task is not None:
        (folder / TASK_FILE).write_text(json.dumps(task_metadata(task), indent=2))


def load_checkpoint(folder: Path, task: TokenizedTask) -> tuple[ExperimentConfig, PromptedModel]:
    """Rebuild a trained model from a checkpoint folder, on the CPU, in the precision it
    trained in (fp16 falls back to what ``auto`` picks on the CPU), in evaluation mode as
    ``from_pretrained`` returns models; its files checked against their digests first
    (DamagedArtefact, one line, when one is missing or damaged)."""
    check_digests(folder, (TRAINABLE_FILE, CONFIG_FILE))
    cfg = ExperimentConfig.model_validate(yaml.safe_load((Path(folder) / CONFIG_FILE).read_text()))
    # the precision it trained in, where this machine's CPU can run it (fp16 cannot)
    precision = resolve_precision(cfg.train.precision, "cpu", strict=False)
    model = build_model(cfg, task, precision=precision)
    model.load_trainable(folder)
    return cfg, model.eval()


def write_trial_checkpoint(
    folder: Path,
    model: PromptedModel,
    cfg: ExperimentConfig,
    task: TokenizedTask,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    loop: LoopState,
) -> None:
    """The folder an evaluation reports: the best model so far, ``resume/``, their digests."""
    _write_model_files(model, cfg, folder, task, loop.best_state)
    save_resume_state(folder, model.trainable_state_dict(), optimizer, scheduler, loop)
    record_digests(folder)


def restore_trial(
    folder: Path | None,
    model: PromptedModel,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> LoopState:
    """Where training starts: a fresh loop state, or, for a restarted trial (``folder``: the
    checkpoint Tune hands it), the state :func:`write_trial_checkpoint` saved, with model,
    optimizer, schedule and RNG put back as they were and the best model's tensors in
    ``best_state``.

    A checkpoint that is incomplete or damaged (:func:`check_digests`) cannot be trusted: the
    trial goes back to its newest intact checkpoint beside it (Tune keeps one; a node lost
    mid-deletion or mid-save can leave a stale one named and an intact one unnamed), or starts
    over; the loop state says why (``restarted_because``)."""
    if folder is None:
        return LoopState()
    usable, problem = intact_checkpoint(Path(folder))
    if usable is None:
        return LoopState(restarted_because=f"checkpoint unusable, started over: {problem}")
    current, loop = load_resume_state(usable, optimizer, scheduler)
    model.load_trainable_state_dict(current)
    loop.best_state = load_file(str(usable / TRAINABLE_FILE))
    loop.resumed_from = loop.step
    if usable != Path(folder):
        loop.restarted_because = f"checkpoint unusable, resumed from {usable.name}: {problem}"
    return loop


def intact_checkpoint(folder: Path) -> tuple[Path | None, str | None]:
    """``folder`` when it is a complete, undamaged trial checkpoint, else the newest such
    checkpoint beside it (``checkpoint_*``, the same trial's), else None; with what is wrong
    with ``folder`` (None when it is intact)."""
    problem = _fault(folder)
    if problem is None:
        return folder, None
    siblings = sorted(folder.parent.glob("checkpoint_*"), reverse=True)
    for other in siblings:
        if other != folder and other.is_dir() and _fault(other) is None:
            return other, problem
    return None, problem


def _fault(folder: Path) -> str | None:
    """What makes ``folder`` unusable to resume from (None: nothing)."""
    try:
        recorded = read_digests(folder)
        check_digests(folder, recorded, recorded)
    except DamagedArtefact as damaged:
        return str(damaged)
    if not has_resume_state(folder):
        return f"{folder}: holds no resume state"
    return None
