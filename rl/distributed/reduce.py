"""Reductions across ranks: weighted sums, gradients, advantage stats, metrics.

All are collectives (every rank calls them in the same order) and no-ops on one process.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist


def is_distributed() -> bool:
    """True when a process group with more than one rank is initialised."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _reduce_device(device: torch.device | None) -> torch.device:
    """Where collective tensors must live: CUDA for nccl, CPU for gloo."""
    if device is not None and device.type == "cuda":
        return device
    if is_distributed() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_sum(values: Sequence[float], device: torch.device | None = None) -> list[float]:
    """Sum each of ``values`` over all ranks (float64)."""
    if not is_distributed():
        return [float(v) for v in values]
    t = torch.tensor(list(values), dtype=torch.float64, device=_reduce_device(device))
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return [float(v) for v in t.cpu()]


def distributed_weighted_sum(
    to_share: float | torch.Tensor, weight: float | torch.Tensor
) -> float:
    """AllenAct's ``distributed_weighted_sum``: ``sum_r weight_r * to_share_r`` over ranks."""
    return all_reduce_sum([float(to_share) * float(weight)])[0]


def weighted_mean(value: float, weight: float) -> float:
    """``sum_r weight_r * value_r / sum_r weight_r`` over ranks (one collective)."""
    total, weights = all_reduce_sum([float(value) * float(weight), float(weight)])
    return total / weights if weights > 0 else float("nan")


def average_gradients(params: Iterable[torch.nn.Parameter], batch_size: float) -> float:
    """Replace every gradient by the batch-size-weighted mean over ranks; return the total size.

    Each rank's loss is a mean over its own ``batch_size`` samples, so the weighted mean is the
    gradient of the mean over the concatenated batch (preempted ranks weigh less). Missing
    gradients count as zeros.
    """
    params = [p for p in params if p.requires_grad]
    if not is_distributed():
        return float(batch_size)
    if not params:
        return all_reduce_sum([batch_size])[0]
    device = params[0].device
    grads = [
        (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).to(torch.float32)
        for p in params
    ]
    flat = torch.cat([*grads, torch.ones(1, device=device)]) * float(batch_size)
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    total = flat[-1].item()
    flat = flat[:-1] / total
    offset = 0
    for p in params:
        n = p.numel()
        chunk = flat[offset : offset + n].view_as(p).to(p.dtype)
        if p.grad is None:
            p.grad = chunk.clone()
        else:
            p.grad.copy_(chunk)
        offset += n
    return float(total)


def weighted_moments(
    x: torch.Tensor, weights: torch.Tensor | None = None
) -> tuple[float, float, float]:
    """``(sum, sum of squares, count)`` of every rank's ``x`` together, in float64.

    ``weights`` (shaped like ``x``; None: all count) is 0 for steps that do not count (agents
    out of their episode), 1 for the others.
    """
    a = x.detach().to(torch.float64)
    if weights is None:
        count = torch.tensor(float(a.numel()), device=a.device, dtype=torch.float64)
    else:
        w = weights.detach().to(torch.float64)
        a, count = a * w, w.sum()
    values = torch.stack([a.sum(), (a * a).sum(), count])
    if is_distributed():
        values = values.to(_reduce_device(a.device))
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    total, total_sq, total_count = (float(v) for v in values.cpu())
    return total, total_sq, total_count


def advantage_stats(
    advantages: torch.Tensor, weights: torch.Tensor | None = None
) -> tuple[float, float, int]:
    """Mean, unbiased std and count of every rank's advantages (as :func:`weighted_moments`)."""
    total, total_sq, count = weighted_moments(advantages, weights)
    mean = total / count
    var = (total_sq - count * mean * mean) / max(count - 1.0, 1.0)
    return mean, max(var, 0.0) ** 0.5, int(count)


def reduce_tracker_states(
    states: Mapping[str, Mapping[str, float]],
) -> dict[str, dict[str, float]]:
    """Sum the sums and counts of ``ScalarMeanTracker.state_dict()`` over all ranks.

    They travel as objects: key sets may differ between ranks (no episode ended on one of them).
    """
    mine = {"sums": dict(states["sums"]), "counts": dict(states["counts"])}
    if not is_distributed():
        return mine
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for state in gather_lists([mine]):
        for k, v in state["sums"].items():
            sums[k] = sums.get(k, 0.0) + float(v)
        for k, v in state["counts"].items():
            counts[k] = counts.get(k, 0.0) + float(v)
    return {"sums": sums, "counts": counts}


def gather_lists(items: Sequence[Any]) -> list[Any]:
    """Every rank's ``items`` concatenated in rank order (``items`` without a process group)."""
    if not is_distributed():
        return list(items)
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, list(items))
    return [item for part in gathered for item in part]


def broadcast_object(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank (``obj`` itself without a process group)."""
    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_objects(obj: Any) -> list[Any] | None:
    """Every rank's ``obj`` in rank order on rank 0 (None elsewhere; ``[obj]`` alone)."""
    if not is_distributed():
        return [obj]
    out: list[Any] | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(obj, out, dst=0)
    return out
