"""A pack trained outside Ray: the same step, evaluate, checkpoint and refill cycle a pack
server runs (raypeft.training.pack_host), for tests that compare packed members with trials
trained alone. The library serves packs through Ray only; this driver is the tests'."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import torch

from raypeft.data import TokenizedTask
from raypeft.training.loop import checkpoint_folder
from raypeft.training.pack import MemberSpec, Pack

# report(key, result, checkpoint folder): what a member reports, under its key; returning
# False makes the member leave the pack (a scheduler stopped its trial)
PackReporter = Callable[[str, dict, Path | None], bool | None]


def train_pack(
    task: TokenizedTask,
    members: Iterable[MemberSpec],
    report: PackReporter,
    *,
    capacity: int,
    device: torch.device | str | None = None,
    pack_id: str = "pack",
) -> dict[str, dict[str, float]]:
    """Train every configuration ``members`` yields, up to ``capacity`` at once on one backbone.

    Each member reports under its key what :func:`~raypeft.training.loop.train` would report
    for it alone (plus the pack's keys), with its checkpoint folder; ``report`` returning
    False makes it leave, as a scheduler stops a trial. A slot freed (a member finished,
    stopped or diverged) takes the next configuration. Returns each member's best validation
    metrics, by key.
    """
    pending = iter(members)
    pack = Pack(task, capacity=capacity, device=device, pack_id=pack_id)
    best: dict[str, dict[str, float]] = {}
    _fill(pack, pending, best)
    while pack.members:
        for key, failure in pack.step().items():
            report(key, failure, None)  # ends the member's trial, as train() ends it
            best[key] = pack.remove(key).loop.best
        for key, metrics in pack.evaluate(pack.due()).items():
            with checkpoint_folder() as folder:
                pack.write_checkpoint(key, folder)
                keep = report(key, metrics, folder)
            if keep is False or pack.member(key).finished:
                best[key] = pack.remove(key).loop.best
        _fill(pack, pending, best)
    return best


def _fill(pack: Pack, pending: Iterator[MemberSpec], best: dict) -> None:
    """Add configurations until the pack is full or none is left; a member that resumed at
    its last step has nothing left to do (alone, its trial returns at once)."""
    while pack.free:
        spec = next(pending, None)
        if spec is None:
            return
        member = pack.add(spec)
        if member.finished and not member.due:
            best[spec.key] = pack.remove(spec.key).loop.best
