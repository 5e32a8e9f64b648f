"""What DDP workers agree on besides gradients (DDP averages those itself).

With one worker (``world_size == 1``) no process group exists and nothing is exchanged.
"""

from __future__ import annotations

import torch


def finite_everywhere(loss: torch.Tensor, world_size: int) -> bool:
    """Whether the loss is finite on every worker (all of them must stop together: a worker
    leaving alone would leave the others waiting in DDP's all-reduce)."""
    finite = bool(torch.isfinite(loss))
    if world_size == 1:
        return finite
    flag = torch.tensor([0.0 if finite else 1.0], device=loss.device)
    torch.distributed.all_reduce(flag)
    return flag.item() == 0


def mean_over_workers(value: float, world_size: int) -> float:
    """A worker's loss is over its share of the batch: the global batch's is their mean."""
    if world_size == 1:
        return value
    tensor = torch.tensor([value], dtype=torch.float64)
    torch.distributed.all_reduce(tensor)
    return tensor.item() / world_size
